"""Dead-tap pruning: kernel taps of a convolution that only ever read its zero padding are
cut from the weights, with the padding shrunk to match (lite/kernels/dead_taps.py says
why every output stays). It needs the input's spatial size, so it applies only where
that size is static, and never to trainable weights (another input size would read the
taps cut).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, consumers
from sporenet.lite.graph import DYNAMIC, Model, Node
from sporenet.lite.kernels.dead_taps import trim_window
from sporenet.lite.ops import OpCode


def prune_dead_taps(model: Model) -> int:
    """Cut the dead leading and trailing taps of every float CONV2D with constant weights
    and a static input height and width; returns the count of convolutions rewritten."""
    readers: dict[int, int] = {}
    for graph in model.graphs:
        for index, nodes in consumers(graph).items():
            readers[index] = readers.get(index, 0) + len(nodes)
    pruned = 0
    for graph in model.graphs:
        for node in graph.nodes:
            if node.op == OpCode.CONV2D and _prune(model, node, readers):
                pruned += 1
    return pruned


def _prune(model: Model, conv: Node, readers: dict[int, int]) -> bool:
    """Rewrite one convolution when it has dead taps; whether it did."""
    x_shape = model.tensors[conv.inputs[0]].shape  # the batch may be dynamic, not H and W
    w_index = conv.inputs[1]
    w = model.tensors[w_index]
    if len(x_shape) != 4 or DYNAMIC in x_shape[2:] or w.data is None or w.trainable:
        return False
    if w.dtype.kind != "f" or w.quantization is not None or w.data.ndim != 4:
        return False
    if conv.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    if not np.isfinite(w.data).all():  # a cut tap's 0 * inf would have been NaN
        return False
    pads = _ints(conv.attrs.get("pads"), [0, 0, 0, 0])
    strides = _ints(conv.attrs.get("strides"), [1, 1])
    dilations = _ints(conv.attrs.get("dilations"), [1, 1])
    if len(pads) != 4 or len(strides) != 2 or len(dilations) != 2:
        return False
    trimmed = trim_window(x_shape[2:], w.data.shape[2:], strides, dilations, pads)
    if trimmed is None:
        return False
    kept, pads = trimmed
    weights = np.ascontiguousarray(
        w.data[:, :, kept[0].start : kept[0].stop, kept[1].start : kept[1].stop]
    )
    if readers.get(w_index, 0) == 1:
        weights.flags.writeable = False
        w.data, w.shape = weights, weights.shape
    else:
        conv.inputs = [
            conv.inputs[0],
            add_constant(model, f"{w.name}/live_taps", weights),
            *conv.inputs[2:],
        ]
    conv.attrs["pads"] = pads
    if "kernel_shape" in conv.attrs:
        conv.attrs["kernel_shape"] = [len(kept[0]), len(kept[1])]
    return True


def _ints(value: object, default: list[int]) -> list[int]:
    """An int-list attribute (the default when absent or empty)."""
    if isinstance(value, list | tuple) and value:
        return [int(v) for v in value]
    return list(default)
