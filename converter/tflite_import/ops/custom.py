"""Custom operators published models use: MediaPipe's Convolution2DTransposeBias,
MaxPoolingWithArgmax2D and MaxUnpooling2D (float32, NHWC in the file).

Their custom options are the C structs MediaPipe's kernels read as they are (little-endian
int32 fields, in this order):

- Convolution2DTransposeBias: TfLiteTransposeConvParams (padding, stride_width,
  stride_height), at least 12 bytes;
- MaxPoolingWithArgmax2D, MaxUnpooling2D: TfLitePoolParams (padding, stride_width,
  stride_height, filter_width, filter_height, activation), at least 24 bytes.

`padding` is TfLitePadding (1 SAME, 2 VALID; not the schema's Padding enum) and
`activation` TfLiteFusedActivation (0 none, 1 RELU, 2 RELU_N1_TO_1, 3 RELU6, 4 TANH).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode

SAME, VALID = 1, 2  # TfLitePadding
_ACTIVATIONS: dict[int, tuple[OpCode, dict[str, Any]]] = {
    1: (OpCode.RELU, {}),
    2: (OpCode.CLIP, {"min": -1.0, "max": 1.0}),
    3: (OpCode.RELU6, {}),
    4: (OpCode.TANH, {}),
}


def _fields(lc: LayoutContext, op: TfliteOperator, count: int, what: str) -> list[int]:
    data = op.custom_options or b""
    if len(data) < 4 * count:
        raise lc.fail(
            f"custom options hold {len(data)} bytes; {what} needs {4 * count} "
            f"({count} little-endian int32 fields)"
        )
    values = list(struct.unpack_from(f"<{count}i", data))
    if values[0] not in (SAME, VALID):
        raise lc.fail(f"padding {values[0]} is neither SAME (1) nor VALID (2)")
    if min(values[1:5] if count >= 5 else values[1:]) < 1:
        raise lc.fail(f"strides and filter sizes {values[1:5]} must be positive")
    return values


def _check_shape(lc: LayoutContext, out: int, shape: list[int]) -> None:
    declared = list(lc.tensor(out).shape)
    if declared != shape:
        raise lc.fail(
            f"output {lc.tensor(out).name!r} is declared {declared}, the op gives {shape}"
        )


def _padding(stride: int, in_size: int, filter_size: int, out_size: int) -> int:
    """TFLite's ComputePadding (dilation 1): the window's start before the input."""
    return max(int(((out_size - 1) * stride + filter_size - in_size) / 2), 0)


def transpose_conv_bias(lc: LayoutContext, op: TfliteOperator) -> None:
    padding, sw, sh = _fields(lc, op, 3, "TfLiteTransposeConvParams")
    x, w, bias = op.inputs[:3]
    out = op.outputs[0]
    n, ih, iw, _ = lc.tensor(x).shape
    oc, kh, kw, _ = lc.tensor(w).shape
    pads = []
    for k, size, s in ((kh, ih, sh), (kw, iw, sw)):
        total = max(0, k - (size - 1) % s - 1) if padding == SAME else 0
        pads.append((total // 2, total - total // 2))
    oh = sh * (ih - 1) + kh - sum(pads[0])
    ow = sw * (iw - 1) + kw - sum(pads[1])
    _check_shape(lc, out, [n, oh, ow, oc])
    batch = -1 if lc.shape(out)[0] == -1 else n
    y = lc.emit(
        OpCode.CONV2D_BACKPROP_INPUT,
        [lc.get(x, NCHW), lc.get(w, (3, 0, 1, 2))],  # (O, kh, kw, I) -> (I, O, kh, kw)
        strides=[sh, sw],
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
        input_shape=[batch, oc, oh, ow],
    )
    b = lc.constant_value(bias, "bias").astype(np.float32).reshape(-1, 1, 1)  # float16 too
    y = lc.emit(OpCode.ADD, [y, lc.ctx.constant(f"{lc.tensor(out).name}/bias", b)])
    lc.set(out, y, NCHW)


def max_pool_with_argmax(lc: LayoutContext, op: TfliteOperator) -> None:
    padding, sw, sh, kw, kh, activation = _fields(lc, op, 6, "TfLitePoolParams")
    x = op.inputs[0]
    n, h, w, c = lc.tensor(x).shape
    if padding == SAME:
        oh, ow = (h + sh - 1) // sh, (w + sw - 1) // sw
    else:
        oh, ow = (h - kh + sh) // sh, (w - kw + sw) // sw
    for out in op.outputs[:2]:
        _check_shape(lc, out, [n, oh, ow, c])
    best, where = lc.ctx.emit(
        OpCode.MAX_POOL_WITH_ARGMAX,
        [lc.get(x, NCHW)],
        num_outputs=2,
        kernel_shape=[kh, kw],
        strides=[sh, sw],
        pads=[_padding(sh, h, kh, oh), _padding(sw, w, kw, ow)],
        output_size=[oh, ow],
    )
    if activation in _ACTIVATIONS:
        kind, attrs = _ACTIVATIONS[activation]
        best = lc.emit(kind, [best], **attrs)
    elif activation != 0:
        raise lc.fail(f"fused activation {activation} is not supported")
    lc.set(op.outputs[0], best, NCHW)
    lc.set(op.outputs[1], where, NCHW)


def max_unpooling(lc: LayoutContext, op: TfliteOperator) -> None:
    _, sw, sh, kw, kh, _ = _fields(lc, op, 6, "TfLitePoolParams")
    x, index = op.inputs[:2]
    out = op.outputs[0]
    n, h, w, c = lc.tensor(x).shape
    oh, ow = h * kh, w * kw
    _check_shape(lc, out, [n, oh, ow, c])
    y = lc.emit(
        OpCode.MAX_UNPOOL,
        [lc.get(x, NCHW), lc.get(index, NCHW)],
        kernel_shape=[kh, kw],
        strides=[sh, sw],
        pads=[_padding(sh, oh, kh, h), _padding(sw, ow, kw, w)],
        output_size=[oh, ow],
    )
    lc.set(out, y, NCHW)
