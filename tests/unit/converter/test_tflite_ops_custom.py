"""MediaPipe's custom ops (Convolution2DTransposeBias, MaxPoolingWithArgmax2D,
MaxUnpooling2D) against float64 loops written from MediaPipe's kernels' semantics (LiteRT
does not register them), and unknown custom ops named in the error."""

from __future__ import annotations

import importlib.util
import struct

import numpy as np
import pytest

from sporenet.converter import ConversionError, UnsupportedTfliteOpError, convert_tflite
from sporenet.lite import Interpreter
from tests.unit.converter.tflite_builder import TfliteBuilder, conv, rand
from tests.unit.converter.tflite_ops_check import check_emits

SAME, VALID = 1, 2  # TfLitePadding


def _pool_options(padding: int, stride: int, size: int, activation: int = 0) -> bytes:
    # TfLitePoolParams: padding, stride_w, stride_h, filter_w, filter_h, activation, and
    # the computed padding MediaPipe ignores.
    return struct.pack("<10i", padding, stride, stride, size, size, activation, 0, 0, 0, 0)


def _run(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    check_emits(data)
    return Interpreter(model_content=convert_tflite(data)).run(feeds)


def reference_transpose_conv_bias(x, w, bias, stride, padding):
    n, ih, iw, _ = x.shape
    oc, kh, kw, _ = w.shape
    totals = [
        max(0, k - (size - 1) % stride - 1) if padding == SAME else 0
        for k, size in ((kh, ih), (kw, iw))
    ]
    oh, ow = stride * (ih - 1) + kh - totals[0], stride * (iw - 1) + kw - totals[1]
    out = np.broadcast_to(bias.astype(np.float64), (n, oh, ow, oc)).copy()
    for b in range(n):
        for y in range(ih):
            for xx in range(iw):
                for fy in range(kh):
                    for fx in range(kw):
                        oy = y * stride - totals[0] // 2 + fy
                        ox = xx * stride - totals[1] // 2 + fx
                        if 0 <= oy < oh and 0 <= ox < ow:
                            out[b, oy, ox] += w[:, fy, fx, :] @ x[b, y, xx].astype(np.float64)
    return out


@pytest.mark.parametrize(("stride", "padding", "k"), [(2, SAME, 4), (2, VALID, 3), (1, SAME, 3)])
def test_convolution_2d_transpose_bias(stride, padding, k):
    x = rand(1, 4, 5, 3, seed=1)
    w, bias = rand(2, k, k, 3, seed=2), rand(2, seed=3)
    want = reference_transpose_conv_bias(x, w, bias, stride, padding)
    b = TfliteBuilder()
    xi = b.input("x", x.shape)
    y = b.output(b.tensor("y", want.shape))
    b.op(
        "CUSTOM:Convolution2DTransposeBias",
        [xi, b.const("w", w), b.const("bias", bias)],
        [y],
        custom_options=struct.pack("<3i", padding, stride, stride),
    )
    got = _run(b.build(), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def reference_argmax_pool(x, stride, size, padding):
    n, h, w, c = x.shape
    if padding == SAME:
        oh, ow = -(-h // stride), -(-w // stride)
    else:
        oh, ow = (h - size + stride) // stride, (w - size + stride) // stride
    ph = max(((oh - 1) * stride + size - h) // 2, 0)
    pw = max(((ow - 1) * stride + size - w) // 2, 0)
    best = np.full((n, oh, ow, c), np.finfo(np.float32).min, np.float32)
    index = np.zeros((n, oh, ow, c), np.float32)
    for b, oy, ox, ch in np.ndindex(n, oh, ow, c):
        for fy in range(size):
            for fx in range(size):
                y, xx = oy * stride - ph + fy, ox * stride - pw + fx
                if 0 <= y < h and 0 <= xx < w and x[b, y, xx, ch] > best[b, oy, ox, ch]:
                    best[b, oy, ox, ch] = x[b, y, xx, ch]
                    index[b, oy, ox, ch] = fy * size + fx + np.float32(0.1)
    return best, index, (ph, pw)


def reference_unpool(values, index, stride, size):
    n, h, w, c = values.shape
    oh, ow = h * size, w * size
    ph = max(((h - 1) * stride + size - oh) // 2, 0)
    pw = max(((w - 1) * stride + size - ow) // 2, 0)
    out = np.zeros((n, oh, ow, c), np.float32)
    for b, y, xx, ch in np.ndindex(n, h, w, c):
        k = int(index[b, y, xx, ch])
        oy, ox = y * stride - ph + k // size, xx * stride - pw + k % size
        if 0 <= oy < oh and 0 <= ox < ow:
            out[b, oy, ox, ch] = values[b, y, xx, ch]
    return out


@pytest.mark.parametrize(("padding", "shape"), [(SAME, (1, 6, 7, 3)), (VALID, (1, 7, 6, 2))])
def test_max_pooling_with_argmax_then_unpooling(padding, shape):
    x = rand(*shape, seed=4)
    best, index, _ = reference_argmax_pool(x, 2, 2, padding)
    back = reference_unpool(best, index, 2, 2)
    b = TfliteBuilder()
    xi = b.input("x", x.shape)
    features = conv(b, xi, shape[3], 4, shape[1:3], k=1)  # held NCHW by the import
    pooled_shape = (shape[0], *best.shape[1:3], 4)
    p, i = b.output(b.tensor("pooled", pooled_shape)), b.output(b.tensor("index", pooled_shape))
    b.op(
        "CUSTOM:MaxPoolingWithArgmax2D",
        [features],
        [p, i],
        custom_options=_pool_options(padding, 2, 2),
    )
    u = b.output(b.tensor("unpooled", (shape[0], *back.shape[1:3], 4)))
    b.op("CUSTOM:MaxUnpooling2D", [p, i], [u], custom_options=_pool_options(padding, 2, 2))
    b.output(features)
    got = _run(b.build(), {"x": x})
    f = got["conv1"]
    best, index, _ = reference_argmax_pool(f, 2, 2, padding)
    np.testing.assert_array_equal(got["pooled"], best)
    np.testing.assert_array_equal(got["index"], index)
    np.testing.assert_array_equal(got["unpooled"], reference_unpool(best, index, 2, 2))


def test_short_custom_options_and_unknown_custom_ops_are_named():
    b = TfliteBuilder()
    x = b.input("x", [1, 4, 4, 1])
    p, i = b.output(b.tensor("p", [1, 2, 2, 1])), b.output(b.tensor("i", [1, 2, 2, 1]))
    b.op("CUSTOM:MaxPoolingWithArgmax2D", [x], [p, i], custom_options=b"\x01\x00")
    with pytest.raises(ConversionError, match="custom options hold 2 bytes"):
        convert_tflite(b.build())
    b = TfliteBuilder()
    x = b.input("x", [2])
    y = b.output(b.tensor("y", [2]))
    b.op("CUSTOM:TFLite_Detection_PostProcess_v9", [x], [y])
    with pytest.raises(
        UnsupportedTfliteOpError, match=r"CUSTOM:TFLite_Detection_PostProcess_v9 \(x1\)"
    ):
        convert_tflite(b.build())


# LiteRT runs these three ops only through its XNNPACK delegate. Its transposed
# convolution and its pooled and unpooled values agree with MediaPipe's kernels; its
# argmax tensor holds the window index as integer bits, column-major, where MediaPipe's
# kernel writes fy * kw + fx + 0.1 as a float (what this converter follows), so only the
# pair pool -> unpool is compared.
needs_litert = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None,
    reason="LiteRT (ai-edge-litert, test extra) is the reference",
)


@needs_litert
def test_convolution_2d_transpose_bias_matches_litert():
    from tests.unit.converter.tflite_builder import run_litert

    b = TfliteBuilder()
    x = b.input("x", [1, 4, 6, 3])
    y = b.output(b.tensor("y", [1, 8, 12, 2]))
    weights = [b.const("w", rand(2, 4, 4, 3, seed=2)), b.const("bias", rand(2, seed=3))]
    b.op(
        "CUSTOM:Convolution2DTransposeBias",
        [x, *weights],
        [y],
        custom_options=struct.pack("<3i", SAME, 2, 2),
    )
    feeds = {"x": rand(1, 4, 6, 3, seed=1)}
    want = run_litert(b.build(), feeds)["y"]
    np.testing.assert_allclose(_run(b.build(), feeds)["y"], want, rtol=1e-4, atol=1e-5)


@needs_litert
def test_max_pool_with_argmax_then_unpool_matches_litert():
    from tests.unit.converter.tflite_builder import run_litert

    b = TfliteBuilder()
    x = b.input("x", [1, 6, 8, 3])
    p, i = b.tensor("pooled", [1, 3, 4, 3]), b.tensor("index", [1, 3, 4, 3])
    b.op("CUSTOM:MaxPoolingWithArgmax2D", [x], [p, i], custom_options=_pool_options(VALID, 2, 2))
    b.output(p)
    u = b.output(b.tensor("unpooled", [1, 6, 8, 3]))
    b.op("CUSTOM:MaxUnpooling2D", [p, i], [u], custom_options=_pool_options(VALID, 2, 2))
    feeds = {"x": rand(1, 6, 8, 3, seed=5)}
    want = run_litert(b.build(), feeds)
    got = _run(b.build(), feeds)
    for name in ("pooled", "unpooled"):
        np.testing.assert_array_equal(got[name], want[name])
