"""Dead-tap pruning: kernel taps of a convolution that only ever read its zero padding are
cut from the weights, with the padding shrunk to match.

Dilated convolutions over short inputs (temporal convolution networks with dilations
1, 2, 4, ... 64 over 25 steps) read, at their outer taps, positions that lie in the
padding for every output: those taps add exact zeros, yet the convolution pays for them
(a five-tap layer dilated beyond its input's length is a 1x1 convolution in disguise).
Cutting leading and trailing dead taps along each spatial axis keeps every output the
same: the live taps meet the same inputs at the same outputs. It needs the input's
spatial size, so it applies only where that size is static, and never to trainable
weights (another input size would read the taps cut).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, consumers, static_shape
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode


def prune_dead_taps(model: Model) -> int:
    """Cut the dead leading and trailing taps of every float CONV2D with constant weights
    and a static input size; returns the count of convolutions rewritten."""
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


def live_taps(size: int, taps: int, stride: int, dilation: int, begin: int, end: int) -> range:
    """The taps of one spatial axis that read at least one input position (not padding),
    from the first live tap to the last; empty when none does."""
    outputs = (size + begin + end - dilation * (taps - 1) - 1) // stride + 1
    if outputs < 1:
        return range(0)
    first_position = np.arange(outputs) * stride - begin  # tap 0's position per output
    live = []
    for k in range(taps):
        position = first_position + k * dilation
        if ((position >= 0) & (position < size)).any():
            live.append(k)
    return range(live[0], live[-1] + 1) if live else range(0)


def _prune(model: Model, conv: Node, readers: dict[int, int]) -> bool:
    """Rewrite one convolution when it has dead taps; whether it did."""
    x_shape = static_shape(model, conv.inputs[0])
    w_index = conv.inputs[1]
    w = model.tensors[w_index]
    if x_shape is None or len(x_shape) != 4 or w.data is None or w.trainable:
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
    kept: list[range] = []
    for axis in range(2):
        taps = int(w.data.shape[2 + axis])
        keep = live_taps(
            x_shape[2 + axis], taps, strides[axis], dilations[axis], pads[axis], pads[axis + 2]
        )
        begin = pads[axis] - keep.start * dilations[axis] if keep else -1
        end = pads[axis + 2] - (taps - keep.stop) * dilations[axis] if keep else -1
        if not keep or begin < 0 or end < 0:
            keep = range(taps)  # all dead (the output is the bias) or a crop: left alone
        else:
            pads[axis], pads[axis + 2] = begin, end
        kept.append(keep)
    if all(len(k) == w.data.shape[2 + a] for a, k in enumerate(kept)):
        return False
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
