"""Pad fusion: a zero PAD over the height and width of a float NCHW tensor that only
convolutions read becomes their own padding.

Keras writes a strided "same" convolution as ZeroPadding2D + a "valid" convolution
(MobileNet-style backbones, TFLite files from them): a separate PAD step copies the whole
tensor once more, and its output, made by a kernel that only writes NCHW, keeps the
convolution from reading a channels-last input. Folded into the convolution's pads, the
zeros come from the convolution's own padded buffer (written once per call, or never).
"""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import consumers
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode


def fuse_pads(model: Model) -> int:
    """Fold every zero constant PAD of H and W (4-D float, not a graph output) whose
    readers are all CONV2D nodes reading it as their data input into their pads; returns
    the count of PAD nodes removed."""
    return sum(_fuse_graph(model, graph) for graph in model.graphs)


def _spatial_pads(model: Model, pad: Node) -> list[int] | None:
    """(top, left, bottom, right) of a PAD that adds zeros to H and W only, else None."""
    if pad.attrs.get("mode", "constant") != "constant" or any(i != -1 for i in pad.inputs[1:]):
        return None
    pads, value, axes = pad.attrs.get("pads"), pad.attrs.get("value", 0.0), pad.attrs.get("axes")
    x = model.tensors[pad.inputs[0]]
    if axes is not None or value != 0 or not isinstance(pads, list) or len(pads) != 8:
        return None
    if x.dtype.kind != "f" or x.quantization is not None or len(x.shape) != 4:
        return None
    ints = [int(p) for p in pads]
    begin, end = ints[:4], ints[4:]
    if begin[:2] != [0, 0] or end[:2] != [0, 0] or min(ints) < 0:
        return None
    return [begin[2], begin[3], end[2], end[3]]


def _fuse_graph(model: Model, graph: Graph) -> int:
    uses = consumers(graph)
    outputs = set(graph.outputs)
    fused = 0
    for pad in [n for n in graph.nodes if n.op == OpCode.PAD]:
        extra = _spatial_pads(model, pad)
        y = pad.outputs[0]
        readers = uses.get(y, [])
        if extra is None or y in outputs or not readers:
            continue
        if any(
            r.op != OpCode.CONV2D
            or r.attrs.get("auto_pad", "NOTSET") != "NOTSET"
            or y in r.inputs[1:]
            for r in readers
        ):
            continue
        for conv in {id(r): r for r in readers}.values():
            stored = conv.attrs.get("pads")
            own = [int(v) for v in stored] if isinstance(stored, list) and stored else [0, 0, 0, 0]
            conv.attrs["pads"] = [a + b for a, b in zip(own, extra, strict=True)]
            conv.inputs = [pad.inputs[0], *conv.inputs[1:]]
        graph.nodes.remove(pad)
        fused += 1
    return fused
