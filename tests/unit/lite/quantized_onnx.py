"""One quantized op run both in sporenet and in onnxruntime's QLinear form, for the tests
comparing the two (the default "tflite" rounding and the bit-exact "onnx" mode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.lite.ops import OpCode
from tests.unit.lite.onnx_reference import run_onnx_op
from tests.unit.lite.quantized_reference import quant, random_q, run_one_op


def qlinear_matmul(
    dtype: Any, seed: int, so: float, **options: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(sporenet, onnxruntime) results of a (3, 4, 40) x (40, 6) quantized MatMul with
    per-tensor parameters and output scale `so`; `options` go to the interpreter."""
    rng = np.random.default_rng(seed)
    a, b = random_q(rng, (3, 4, 40), dtype), random_q(rng, (40, 6), dtype)
    za, zb, zo = (
        (dtype(7), dtype(100), dtype(50))
        if dtype == np.uint8
        else (dtype(-7), dtype(10), dtype(-2))
    )
    sa, sb, so = np.float32(0.03), np.float32(0.02), np.float32(so)
    (want,) = run_onnx_op(
        "QLinearMatMul", [a, sa, za, b, sb, zb, so, zo], initializers=[1, 2, 4, 5, 6, 7]
    )
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
    """(sporenet, onnxruntime) results of a 3x3 quantized Conv with int8 weights of
    per-channel scales `sw` (zero point 0); `options` go to the interpreter."""
    (want,) = run_onnx_op(
        "QLinearConv",
        [x, sx, zx, w, sw, np.zeros(sw.size, np.int8), so, zo, bias],
        initializers=range(1, 9),
        kernel_shape=[3, 3],
        **attrs,
    )
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(sx, int(zx)), False), (w, quant(sw), True), (bias, None, True)],
        quant(so, int(zo)),
        x.dtype.type,
        **attrs,
        **options,
    )
    return got, want
