"""One quantized op run in sporenet and by the integer reference of onnxruntime's QLinear
form, for the tests comparing the two (the default "tflite" rounding and the bit-exact
"onnx" mode).

The reference is exact integer arithmetic (int64 accumulators) followed by the float
requantization onnxruntime documents and runs: multiplier (s_x * s_w) / s_y in float32,
float32(acc + bias) * multiplier, rounded half to even, plus the zero point, saturated.
It does not depend on the CPU, where onnxruntime's u8s8 kernels do (tests/references.py);
`test_quantized_onnx_rounding` checks it equals onnxruntime where those are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.lite.ops import OpCode
from tests.unit.lite.quantized_reference import RANGES, quant, random_q, run_one_op


def requantize_onnx(acc: np.ndarray, multiplier: np.ndarray, zero_point: Any) -> np.ndarray:
    """onnxruntime's output stage: saturate(rint(float32(acc) * multiplier) + zero_point)."""
    dtype = np.asarray(zero_point).dtype
    lo, hi = RANGES[dtype]
    scaled = np.rint(acc.astype(np.float32) * multiplier.astype(np.float32))
    return np.clip(scaled.astype(np.int64) + int(zero_point), lo, hi).astype(dtype)


def multipliers(s_in: Any, s_w: Any, s_out: Any) -> np.ndarray:
    """(s_in * s_w) / s_out, each step in float32, as onnxruntime computes its scales."""
    return (np.float32(s_in) * np.asarray(s_w, np.float32)) / np.float32(s_out)


def qlinear_matmul_reference(
    a: np.ndarray, sa: Any, za: Any, b: np.ndarray, sb: Any, zb: Any, so: Any, zo: Any
) -> np.ndarray:
    """QLinearMatMul with per-tensor parameters, exactly."""
    acc = (a.astype(np.int64) - int(za)) @ (b.astype(np.int64) - int(zb))
    return requantize_onnx(acc, multipliers(sa, sb, so), zo)


def qlinear_conv_reference(
    x: np.ndarray,
    sx: Any,
    zx: Any,
    w: np.ndarray,
    sw: np.ndarray,
    so: Any,
    zo: Any,
    bias: np.ndarray,
    attrs: dict[str, Any],
) -> np.ndarray:
    """QLinearConv (NCHW, weights of zero point 0 and per-channel scales `sw`, `pads`,
    `strides` and `group` from `attrs`), exactly."""
    top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
    sh, sw_ = attrs.get("strides", [1, 1])
    group = attrs.get("group", 1)
    xs = np.pad(
        x.astype(np.int64) - int(zx), ((0, 0), (0, 0), (top, bottom), (left, right))
    )  # the padding is real zero: the zero point in the quantized domain
    o, cg, kh, kw = w.shape
    windows = np.lib.stride_tricks.sliding_window_view(xs, (kh, kw), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw_]  # (n, c, oh, ow, kh, kw)
    n, _, oh, ow = windows.shape[:4]
    per_group = o // group
    acc = np.empty((n, o, oh, ow), np.int64)
    for g in range(group):
        patch = windows[:, g * cg : (g + 1) * cg]
        weights = w[g * per_group : (g + 1) * per_group].astype(np.int64)
        acc[:, g * per_group : (g + 1) * per_group] = np.einsum("nchwij,ocij->nohw", patch, weights)
    acc += bias.astype(np.int64).reshape(1, o, 1, 1)
    scale = np.broadcast_to(multipliers(sx, sw, so), (o,)).reshape(1, o, 1, 1)
    return requantize_onnx(acc, scale, zo)


def qlinear_matmul(
    dtype: Any, seed: int, so: float, **options: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(sporenet, reference) results of a (3, 4, 40) x (40, 6) quantized MatMul with
    per-tensor parameters and output scale `so`; `options` go to the interpreter."""
    rng = np.random.default_rng(seed)
    a, b = random_q(rng, (3, 4, 40), dtype), random_q(rng, (40, 6), dtype)
    za, zb, zo = (
        (dtype(7), dtype(100), dtype(50))
        if dtype == np.uint8
        else (dtype(-7), dtype(10), dtype(-2))
    )
    sa, sb, so = np.float32(0.03), np.float32(0.02), np.float32(so)
    want = qlinear_matmul_reference(a, sa, za, b, sb, zb, so, zo)
    got = run_one_op(
        OpCode.MATMUL,
        [(a, quant(sa, int(za)), False), (b, quant(sb, int(zb)), False)],
        quant(so, int(zo)),
        dtype,
        **options,
    )
    return got, want


def qlinear_conv(
    x: np.ndarray,
    sx: np.float32,
    zx: Any,
    w: np.ndarray,
    sw: np.ndarray,
    so: np.float32,
    zo: Any,
    bias: np.ndarray,
    attrs: dict[str, Any],
    **options: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """(sporenet, reference) results of a 3x3 quantized Conv with int8 weights of
    per-channel scales `sw` (zero point 0); `options` go to the interpreter."""
    want = qlinear_conv_reference(x, sx, zx, w, sw, so, zo, bias, attrs)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(sx, int(zx)), False), (w, quant(sw), True), (bias, None, True)],
        quant(so, int(zo)),
        x.dtype.type,
        **attrs,
        **options,
    )
    return got, want
