"""TFLite builtin operators onto IR nodes, one handler per op, in an explicit table.

A handler reads its TFLite operator (inputs, outputs, decoded builtin options), emits IR
nodes through the LayoutContext and records the IR tensor (and its axis order) of every
output. Convolutions and pools run in NCHW; other ops keep their inputs' axis order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext, Perm, identity
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode
from sporenet.proto import tflite_schema_generated as tfl

Handler = Callable[[LayoutContext, TfliteOperator], None]

# TFLite ActivationFunctionType -> the IR's fused `activation` attributes.
_FUSED: dict[int, dict[str, Any]] = {
    tfl.ActivationFunctionType.NONE: {},
    tfl.ActivationFunctionType.RELU: {"activation": "relu"},
    tfl.ActivationFunctionType.RELU6: {"activation": "relu6"},
    tfl.ActivationFunctionType.TANH: {"activation": "tanh"},
    tfl.ActivationFunctionType.RELU_N1_TO_1: {
        "activation": "clip",
        "clip_min": -1.0,
        "clip_max": 1.0,
    },
}


def _fused(lc: LayoutContext, options: Any) -> dict[str, Any]:
    code = options.FusedActivationFunction() if options is not None else 0
    if code not in _FUSED:
        raise lc.fail(f"fused activation {code} (SIGN_BIT) is not supported")
    return _FUSED[code]


def _apply_fused(lc: LayoutContext, ir: int, options: Any) -> int:
    """A separate activation node for float ops whose kernels take no fused activation
    (int8 kernels clamp their output instead: see _fused_attrs)."""
    if lc.quantized_ir(ir):
        return ir
    attrs = _fused(lc, options)
    name = attrs.get("activation")
    if name is None:
        return ir
    if name == "clip":
        return lc.emit(OpCode.CLIP, [ir], min=-1.0, max=1.0)
    return lc.emit({"relu": OpCode.RELU, "relu6": OpCode.RELU6, "tanh": OpCode.TANH}[name], [ir])


def _fused_attrs(lc: LayoutContext, out: int, options: Any) -> dict[str, Any]:
    """The fused activation as an attribute, for int8 nodes (a clamp of their output)."""
    return _fused(lc, options) if lc.quantized(out) else {}


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's SAME padding along one axis: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _pads(
    lc: LayoutContext,
    x: int,
    padding: int,
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int] = (1, 1),
) -> list[int]:
    """ONNX-style [top, left, bottom, right] for an NHWC input."""
    if padding == tfl.Padding.VALID:
        return [0, 0, 0, 0]
    _, h, w, _ = lc.tensor(x).shape
    top, bottom = _same_pads(h, kernel[0], strides[0], dilations[0])
    left, right = _same_pads(w, kernel[1], strides[1], dilations[1])
    return [top, left, bottom, right]


def _bias(lc: LayoutContext, op: TfliteOperator) -> list[int]:
    return [lc.get(op.inputs[2])] if len(op.inputs) > 2 and op.inputs[2] != -1 else []


# --------------------------------------------------------------------------- convolution


def conv_2d(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, w = op.inputs[:2]
    _, kh, kw, _ = lc.tensor(w).shape
    strides = (o.StrideH(), o.StrideW())
    dilations = (o.DilationHFactor(), o.DilationWFactor())
    pads = _pads(lc, x, o.Padding(), (kh, kw), strides, dilations)
    weights = lc.get(w, NCHW)  # OHWI -> OIHW
    y = lc.emit(
        OpCode.CONV2D,
        [lc.get(x, NCHW), weights, *_bias(lc, op)],
        out=op.outputs[0],
        order=NCHW,
        strides=list(strides),
        dilations=list(dilations),
        pads=pads,
        **_fused(lc, o),
    )
    lc.set(op.outputs[0], y, NCHW)


def depthwise_conv_2d(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, w = op.inputs[:2]
    channels = lc.tensor(x).shape[3]
    _, kh, kw, out_channels = lc.tensor(w).shape
    if out_channels % max(channels, 1):
        raise lc.fail(
            f"{out_channels} output channels are not a multiple of the input's {channels}"
        )
    strides = (o.StrideH(), o.StrideW())
    dilations = (o.DilationHFactor(), o.DilationWFactor())
    pads = _pads(lc, x, o.Padding(), (kh, kw), strides, dilations)
    weights = lc.get(w, (3, 0, 1, 2))  # (1, kh, kw, C*M) -> (C*M, 1, kh, kw)
    y = lc.emit(
        OpCode.CONV2D,
        [lc.get(x, NCHW), weights, *_bias(lc, op)],
        out=op.outputs[0],
        order=NCHW,
        strides=list(strides),
        dilations=list(dilations),
        pads=pads,
        group=channels,
        **_fused(lc, o),
    )
    lc.set(op.outputs[0], y, NCHW)


def fully_connected(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    if o is not None and o.WeightsFormat() != tfl.FullyConnectedOptionsWeightsFormat.DEFAULT:
        raise lc.fail("shuffled weight formats are not supported")
    x, w = op.inputs[:2]
    depth = lc.tensor(w).shape[1]
    xi = lc.get(x)
    keep = o is not None and o.KeepNumDims()
    if not keep and lc.rank(x) != 2 and lc.quantized(x):
        t = lc.ctx.tensors[xi]
        rows = lc.shape(op.outputs[0])[0]
        xi = lc.raw(
            OpCode.RESHAPE, [xi], (rows, depth), t.dtype, t.quantization, {"shape": [-1, depth]}
        )
    elif not keep and lc.rank(x) != 2:
        xi = lc.emit(OpCode.RESHAPE, [xi], shape=[-1, depth])
    y = lc.emit(
        OpCode.FULLY_CONNECTED, [xi, lc.get(w), *_bias(lc, op)], out=op.outputs[0], **_fused(lc, o)
    )
    lc.set(op.outputs[0], y)


def _pool(kind: OpCode) -> Handler:
    def pool(lc: LayoutContext, op: TfliteOperator) -> None:
        o = op.options
        x = op.inputs[0]
        kernel = (o.FilterHeight(), o.FilterWidth())
        strides = (o.StrideH(), o.StrideW())
        attrs: dict[str, Any] = {
            "kernel_shape": list(kernel),
            "strides": list(strides),
            "pads": _pads(lc, x, o.Padding(), kernel, strides),
        }
        if kind == OpCode.AVG_POOL2D:
            attrs["count_include_pad"] = 0  # TFLite averages the valid entries only
        y = lc.emit(
            kind,
            [lc.get(x, NCHW)],
            out=op.outputs[0],
            order=NCHW,
            **attrs,
            **_fused_attrs(lc, op.outputs[0], o),
        )
        lc.set(op.outputs[0], _apply_fused(lc, y, o), NCHW)

    return pool


# --------------------------------------------------------------------------- elementwise


def _order_of(lc: LayoutContext, inputs: list[int], rank: int) -> Perm:
    """The axis order a broadcasting op runs in: that of its first full-rank non-constant
    input (so no transpose is needed for it), else TFLite's."""
    for i in inputs:
        if i != -1 and i in lc.held and lc.rank(i) == rank and lc.tensor(i).data is None:
            return lc.perm(i)
    return identity(rank)


def _binary(kind: OpCode) -> Handler:
    def binary(lc: LayoutContext, op: TfliteOperator) -> None:
        out = op.outputs[0]
        order = _order_of(lc, op.inputs[:2], lc.rank(out))
        a, b = (lc.get_broadcast(i, order) for i in op.inputs[:2])
        y = lc.emit(kind, [a, b], out=out, order=order, **_fused_attrs(lc, out, op.options))
        lc.set(out, _apply_fused(lc, y, op.options), order)

    return binary


def _unary(kind: OpCode, **attrs: object) -> Handler:
    def unary(lc: LayoutContext, op: TfliteOperator) -> None:
        x = op.inputs[0]
        order = lc.perm(x)
        y = lc.emit(kind, [lc.get(x, order)], out=op.outputs[0], order=order, **attrs)
        lc.set(op.outputs[0], y, order)

    return unary


def leaky_relu(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    y = lc.emit(OpCode.LEAKY_RELU, [lc.get(x, lc.perm(x))], alpha=float(op.options.Alpha()))
    lc.set(op.outputs[0], y, lc.perm(x))


def relu_n1_to_1(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    lc.set(
        op.outputs[0], lc.emit(OpCode.CLIP, [lc.get(x, lc.perm(x))], min=-1.0, max=1.0), lc.perm(x)
    )


def gelu(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    approximate = op.options is not None and op.options.Approximate()
    y = lc.emit(OpCode.GELU, [lc.get(x, lc.perm(x))], approximate="tanh" if approximate else "none")
    lc.set(op.outputs[0], y, lc.perm(x))


def prelu(lc: LayoutContext, op: TfliteOperator) -> None:
    x, alpha = op.inputs[:2]
    order = lc.perm(x)
    y = lc.emit(OpCode.PRELU, [lc.get(x, order), lc.get_broadcast(alpha, order)])
    lc.set(op.outputs[0], y, order)


def softmax(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    order = lc.perm(x)
    xi = lc.get(x, order)
    beta = float(op.options.Beta()) if op.options is not None else 1.0
    if beta != 1.0:
        xi = lc.emit(OpCode.MUL, [xi, lc.ctx.constant("beta", np.array(beta, np.float32))])
    if beta != 1.0 and lc.quantized(x):
        raise lc.fail(f"an int8 softmax with beta {beta} is not supported (only 1)")
    y = lc.emit(
        OpCode.SOFTMAX, [xi], out=op.outputs[0], order=order, axis=order.index(len(order) - 1)
    )
    lc.set(op.outputs[0], y, order)


# --------------------------------------------------------------------------- data movement


def reshape(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    target = list(lc.shape(out))
    if target.count(-1) > 1:
        raise lc.fail(f"output shape {target} has more than one open dimension")
    lc.set(out, lc.emit(OpCode.RESHAPE, [lc.get(op.inputs[0])], out=out, shape=target))


def squeeze(lc: LayoutContext, op: TfliteOperator) -> None:
    reshape(lc, op)  # the output's shape says which axes go


def transpose(lc: LayoutContext, op: TfliteOperator) -> None:
    # out = transpose(x, q): no node, only the recorded order changes.
    x = op.inputs[0]
    q = [int(v) % lc.rank(x) for v in lc.constant_value(op.inputs[1], "perm").reshape(-1)]
    inverse = np.argsort(q)
    current = lc.perm(x)
    ir = lc.held[x][0]
    lc.set(op.outputs[0], ir, tuple(int(inverse[a]) for a in current))


def concatenation(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    rank = lc.rank(out)
    order = _order_of(lc, op.inputs, rank)
    axis = op.options.Axis() % rank
    y = lc.emit(
        OpCode.CONCAT,
        [lc.get(i, order) for i in op.inputs],
        out=out,
        order=order,
        axis=order.index(axis),
        **_fused_attrs(lc, out, op.options),
    )
    lc.set(out, _apply_fused(lc, y, op.options), order)


def _reduce(kind: OpCode) -> Handler:
    def reduce(lc: LayoutContext, op: TfliteOperator) -> None:
        x = op.inputs[0]
        rank = lc.rank(x)
        axes = sorted({int(a) % rank for a in lc.constant_value(op.inputs[1], "axes").reshape(-1)})
        keep = bool(op.options.KeepDims()) if op.options is not None else False
        order = lc.perm(x)
        kept = [a for a in order if a not in axes]  # TFLite axes, in the IR's order
        ranks = {a: k for k, a in enumerate(sorted(kept))}
        out_order = order if keep else tuple(ranks[a] for a in kept)
        y = lc.emit(
            kind,
            [lc.get(x, order)],
            out=op.outputs[0],
            order=out_order,
            axes=[order.index(a) for a in axes],
            keepdims=int(keep),
        )
        lc.set(op.outputs[0], y, out_order)

    return reduce


def pad(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    paddings = lc.constant_value(op.inputs[1], "paddings").astype(np.int64)
    order = lc.perm(x)
    attrs: dict[str, Any] = {
        "pads": [int(paddings[a, 0]) for a in order] + [int(paddings[a, 1]) for a in order],
        "mode": "constant",
    }
    if len(op.inputs) > 2 and op.inputs[2] != -1:  # PADV2's constant value
        attrs["value"] = float(lc.constant_value(op.inputs[2], "constant_values").reshape(-1)[0])
    y = lc.emit(OpCode.PAD, [lc.get(x, order)], out=op.outputs[0], order=order, **attrs)
    lc.set(op.outputs[0], y, order)


def _space(kind: OpCode) -> Handler:
    def space(lc: LayoutContext, op: TfliteOperator) -> None:
        attrs: dict[str, Any] = {"blocksize": int(op.options.BlockSize())}
        if kind == OpCode.DEPTH_TO_SPACE:
            attrs["mode"] = "DCR"  # TensorFlow's channel order
        y = lc.emit(kind, [lc.get(op.inputs[0], NCHW)], out=op.outputs[0], order=NCHW, **attrs)
        lc.set(op.outputs[0], y, NCHW)

    return space


def _resize(mode: str) -> Handler:
    def resize(lc: LayoutContext, op: TfliteOperator) -> None:
        x, out = op.inputs[0], op.outputs[0]
        o = op.options
        align = bool(o.AlignCorners()) if o is not None else False
        half = bool(o.HalfPixelCenters()) if o is not None else False
        attrs: dict[str, Any] = {"mode": mode}
        if align:
            attrs["coordinate_transformation_mode"] = "align_corners"
        elif half and mode == "linear":
            attrs["coordinate_transformation_mode"] = "half_pixel"
        elif half:
            raise lc.fail("nearest-neighbour resizing with half_pixel_centers is not supported")
        else:
            attrs["coordinate_transformation_mode"] = "asymmetric"
        if mode == "nearest":
            attrs["nearest_mode"] = "round_prefer_ceil" if align else "floor"
        n, h, w, c = lc.tensor(out).shape
        y = lc.emit(
            OpCode.RESIZE, [lc.get(x, NCHW)], out=out, order=NCHW, sizes=[n, c, h, w], **attrs
        )
        lc.set(out, y, NCHW)

    return resize


def dequantize(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    tensor = lc.tensor(x)
    if tensor.dtype == np.float16 and tensor.data is not None:
        # float16 weights: stored as they are, widened when the model loads.
        lc.set(op.outputs[0], lc.held[x][0], lc.perm(x))
        lc.widened.add(op.outputs[0])
        return
    order = lc.perm(x)
    if tensor.dtype == np.float16:
        lc.set(op.outputs[0], lc.emit(OpCode.CAST, [lc.get(x, order)], to="float32"), order)
        return
    if not lc.quantized(x):
        raise lc.fail(f"input {tensor.name!r} ({tensor.type_name}) has no quantization")
    y = lc.emit(OpCode.DEQUANTIZE, [lc.get(x, order)], out=op.outputs[0], order=order)
    lc.set(op.outputs[0], y, order)


def quantize(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    if not lc.quantized(out):
        raise lc.fail(f"output {lc.tensor(out).name!r} must be int8 or uint8 with quantization")
    order = lc.perm(x)
    kind = OpCode.REQUANTIZE if lc.quantized(x) else OpCode.QUANTIZE
    y = lc.emit(
        kind, [lc.get(x, order)], out=out, order=order, dtype=lc.tensor(out).type_name.lower()
    )
    lc.set(out, y, order)


# --------------------------------------------------------------------------- slicing


_WIDE = 2**31 - 1  # an end past any axis (ONNX clamps it)


def strided_slice(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, out = op.inputs[0], op.outputs[0]
    if o is not None and (o.EllipsisMask() or o.NewAxisMask() or o.Offset()):
        raise lc.fail("ellipsis_mask, new_axis_mask and offset are not supported")
    begin_mask, end_mask = (o.BeginMask(), o.EndMask()) if o is not None else (0, 0)
    shrink = o.ShrinkAxisMask() if o is not None else 0
    begins = [int(v) for v in lc.constant_value(op.inputs[1], "begin").reshape(-1)]
    ends = [int(v) for v in lc.constant_value(op.inputs[2], "end").reshape(-1)]
    steps = (
        [int(v) for v in lc.constant_value(op.inputs[3], "strides").reshape(-1)]
        if len(op.inputs) > 3 and op.inputs[3] != -1
        else [1] * len(begins)
    )
    shape = lc.tensor(x).shape
    starts, stops, sliced = [], [], []
    for a, (b, e, step) in enumerate(zip(begins, ends, steps, strict=True)):
        if begin_mask >> a & 1:
            b = 0 if step > 0 else _WIDE
        if shrink >> a & 1:
            b = b + shape[a] if b < 0 else b
            e, step = b + 1, 1
        elif end_mask >> a & 1:
            e = _WIDE if step > 0 else -_WIDE
        starts.append(b)
        stops.append(e)
        sliced.append(len(range(*slice(b, min(e, _WIDE), step).indices(shape[a]))))
    sliced += shape[len(begins) :]
    attrs: dict[str, Any] = {
        "starts": starts,
        "ends": stops,
        "axes": list(range(len(begins))),
        "steps": steps,
    }
    xi = lc.get(x)
    if not shrink:
        lc.set(out, lc.emit(OpCode.SLICE, [xi], out=out, **attrs))
        return
    if lc.quantized(x):
        t = lc.ctx.tensors[xi]
        y = lc.raw(OpCode.SLICE, [xi], sliced, t.dtype, t.quantization, attrs)
    else:
        y = lc.emit(OpCode.SLICE, [xi], **attrs)
    lc.set(out, lc.emit(OpCode.RESHAPE, [y], out=out, shape=list(lc.shape(out))))


def _split(lc: LayoutContext, op: TfliteOperator, x: int, axis: int, sizes: list[int]) -> None:
    order = lc.perm(x)
    axis %= lc.rank(x)
    outs = lc.ctx.emit(
        OpCode.SPLIT,
        [lc.get(x, order)],
        num_outputs=len(op.outputs),
        axis=order.index(axis),
        split=sizes,
    )
    for tfl_out, ir in zip(op.outputs, outs, strict=True):
        lc.set(tfl_out, ir, order)


def split(lc: LayoutContext, op: TfliteOperator) -> None:
    axis = int(lc.constant_value(op.inputs[0], "axis").reshape(-1)[0])
    x = op.inputs[1]
    sizes = [lc.tensor(o).shape[axis % lc.rank(x)] for o in op.outputs]
    _split(lc, op, x, axis, sizes)


def split_v(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    axis = int(lc.constant_value(op.inputs[2], "axis").reshape(-1)[0])
    sizes = [lc.tensor(o).shape[axis % lc.rank(x)] for o in op.outputs]
    _split(lc, op, x, axis, sizes)


def expand_dims(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    lc.set(out, lc.emit(OpCode.RESHAPE, [lc.get(op.inputs[0])], out=out, shape=list(lc.shape(out))))


def pack(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    axis = op.options.Axis() % lc.rank(out)
    parts = [lc.emit(OpCode.UNSQUEEZE, [lc.get(i)], axes=[axis]) for i in op.inputs]
    lc.set(out, parts[0] if len(parts) == 1 else lc.emit(OpCode.CONCAT, parts, axis=axis))


def unpack(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    axis = op.options.Axis() % lc.rank(x)
    pieces = lc.ctx.emit(OpCode.SPLIT, [lc.get(x)], num_outputs=len(op.outputs), axis=axis)
    for out, piece in zip(op.outputs, pieces, strict=True):
        lc.set(out, lc.emit(OpCode.SQUEEZE, [piece], axes=[axis]))


def batch_matmul(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    a, b = lc.get(op.inputs[0]), lc.get(op.inputs[1])
    for flag, k in ((o is not None and o.AdjX(), 0), (o is not None and o.AdjY(), 1)):
        if flag:
            rank = lc.rank(op.inputs[k])
            perm = [*range(rank - 2), rank - 1, rank - 2]
            if k == 0:
                a = lc.emit(OpCode.TRANSPOSE, [a], perm=perm)
            else:
                b = lc.emit(OpCode.TRANSPOSE, [b], perm=perm)
    lc.set(op.outputs[0], lc.emit(OpCode.MATMUL, [a, b]))


def gather(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    if o is not None and o.BatchDims():
        raise lc.fail("batch_dims is not supported")
    x = op.inputs[0]
    axis = (o.Axis() if o is not None else 0) % lc.rank(x)
    y = lc.emit(OpCode.GATHER, [lc.get(x), lc.get(op.inputs[1])], axis=axis)
    lc.set(op.outputs[0], y)


def cast(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    dtype = lc.tensor(out).dtype
    y = lc.emit(OpCode.CAST, [lc.get(x, lc.perm(x))], to=np.dtype(dtype).name)
    lc.set(out, y, lc.perm(x))


HANDLERS: dict[str, Handler] = {
    # convolution, linear, pooling
    "CONV_2D": conv_2d,
    "DEPTHWISE_CONV_2D": depthwise_conv_2d,
    "FULLY_CONNECTED": fully_connected,
    "AVERAGE_POOL_2D": _pool(OpCode.AVG_POOL2D),
    "MAX_POOL_2D": _pool(OpCode.MAX_POOL2D),
    # binary elementwise (NumPy broadcasting)
    "ADD": _binary(OpCode.ADD),
    "SUB": _binary(OpCode.SUB),
    "MUL": _binary(OpCode.MUL),
    "DIV": _binary(OpCode.DIV),
    "MAXIMUM": _binary(OpCode.MAXIMUM),
    "MINIMUM": _binary(OpCode.MINIMUM),
    # activations and unary
    "RELU": _unary(OpCode.RELU),
    "RELU6": _unary(OpCode.RELU6),
    "RELU_N1_TO_1": relu_n1_to_1,
    "LOGISTIC": _unary(OpCode.SIGMOID),
    "TANH": _unary(OpCode.TANH),
    "HARD_SWISH": _unary(OpCode.HARD_SWISH),
    "LEAKY_RELU": leaky_relu,
    "PRELU": prelu,
    "ELU": _unary(OpCode.ELU),
    "GELU": gelu,
    "EXP": _unary(OpCode.EXP),
    "LOG": _unary(OpCode.LOG),
    "SQRT": _unary(OpCode.SQRT),
    "RSQRT": _unary(OpCode.RSQRT),
    "NEG": _unary(OpCode.NEG),
    "ABS": _unary(OpCode.ABS),
    "SQUARE": _unary(OpCode.SQUARE),
    "FLOOR": _unary(OpCode.FLOOR),
    "CEIL": _unary(OpCode.CEIL),
    "SOFTMAX": softmax,
    # shapes and data movement
    "RESHAPE": reshape,
    "SQUEEZE": squeeze,
    "TRANSPOSE": transpose,
    "CONCATENATION": concatenation,
    "PAD": pad,
    "PADV2": pad,
    "STRIDED_SLICE": strided_slice,
    "SPLIT": split,
    "SPLIT_V": split_v,
    "EXPAND_DIMS": expand_dims,
    "PACK": pack,
    "UNPACK": unpack,
    "GATHER": gather,
    "CAST": cast,
    "BATCH_MATMUL": batch_matmul,
    "DEPTH_TO_SPACE": _space(OpCode.DEPTH_TO_SPACE),
    "SPACE_TO_DEPTH": _space(OpCode.SPACE_TO_DEPTH),
    "RESIZE_BILINEAR": _resize("linear"),
    "RESIZE_NEAREST_NEIGHBOR": _resize("nearest"),
    # reductions
    "MEAN": _reduce(OpCode.REDUCE_MEAN),
    "SUM": _reduce(OpCode.REDUCE_SUM),
    "REDUCE_MAX": _reduce(OpCode.REDUCE_MAX),
    "REDUCE_MIN": _reduce(OpCode.REDUCE_MIN),
    "REDUCE_PROD": _reduce(OpCode.REDUCE_PROD),
    # quantization
    "DEQUANTIZE": dequantize,
    "QUANTIZE": quantize,
}
