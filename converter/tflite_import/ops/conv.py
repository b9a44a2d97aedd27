"""TFLite convolutions, FULLY_CONNECTED and pools (NCHW in the IR)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext
from sporenet.converter.tflite_import.ops.common import Handler, apply_fused, fused, fused_attrs
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode
from sporenet.proto import tflite_schema_generated as tfl


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
        **fused(lc, o),
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
        **fused(lc, o),
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
        OpCode.FULLY_CONNECTED, [xi, lc.get(w), *_bias(lc, op)], out=op.outputs[0], **fused(lc, o)
    )
    lc.set(op.outputs[0], y)


def pool(kind: OpCode) -> Handler:
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
            **fused_attrs(lc, op.outputs[0], o),
        )
        lc.set(op.outputs[0], apply_fused(lc, y, o), NCHW)

    return pool


def transpose_conv(lc: LayoutContext, op: TfliteOperator) -> None:
    """TRANSPOSE_CONV(output_shape, weights, input[, bias]) is the input gradient of the
    convolution with the same weights: CONV2D_BACKPROP_INPUT, its output size given."""
    o = op.options
    w, x = op.inputs[1], op.inputs[2]
    out = op.outputs[0]
    n, oh, ow, oc = lc.tensor(out).shape
    _, kh, kw, _ = lc.tensor(w).shape
    _, ih, iw, _ = lc.tensor(x).shape
    strides = (o.StrideH(), o.StrideW())
    if o.Padding() == tfl.Padding.SAME:
        # The forward convolution maps the output (oh, ow) back onto the input (ih, iw).
        top, bottom = _same_pads(oh, kh, strides[0], 1)
        left, right = _same_pads(ow, kw, strides[1], 1)
        pads = [top, left, bottom, right]
    else:
        pads = [0, 0, 0, 0]
    if (ih - 1) * strides[0] + kh - pads[0] - pads[2] > oh or (
        (iw - 1) * strides[1] + kw - pads[1] - pads[3] > ow
    ):
        raise lc.fail(f"output shape {[n, oh, ow, oc]} is smaller than the input allows")
    batch = -1 if lc.shape(out)[0] == -1 else n
    has_bias = len(op.inputs) > 3 and op.inputs[3] != -1
    inputs = [lc.get(x, NCHW), lc.get(w, (3, 0, 1, 2))]  # (O, kh, kw, I) -> (I, O, kh, kw)
    if lc.quantized(x):  # the int8 kernel adds the int32 bias (input 3) itself
        inputs += [-1, lc.get(op.inputs[3])] if has_bias else []
    y = lc.emit(
        OpCode.CONV2D_BACKPROP_INPUT,
        inputs,
        out=out,
        order=NCHW,
        strides=list(strides),
        pads=pads,
        input_shape=[batch, oc, oh, ow],
        **fused_attrs(lc, out, o),
    )
    if has_bias and not lc.quantized(x):
        bias = lc.constant_value(op.inputs[3], "bias").astype(np.float32).reshape(-1, 1, 1)
        y = lc.emit(OpCode.ADD, [y, lc.ctx.constant(f"{lc.tensor(out).name}/bias", bias)])
    lc.set(out, apply_fused(lc, y, o), NCHW)
