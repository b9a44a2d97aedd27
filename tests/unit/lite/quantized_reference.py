"""Plain int64 NumPy references of TFLite's integer arithmetic, written out the way the
TFLite reference kernels state it (no shared code with sporenet's kernels), and helpers
that build one-op int8 models with lite's builder and read them back from bytes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import parse, serialize
from sporenet.lite.graph import Quantization
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.ops import OpCode

RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def quantize_multiplier(real: float) -> tuple[int, int]:
    if real == 0:
        return 0, 0
    mantissa, exponent = math.frexp(real)
    q = math.floor(mantissa * 2**31 + 0.5)  # TfLiteRound: ties away from zero (q > 0)
    if q == 2**31:
        q, exponent = q // 2, exponent + 1
    if exponent < -31:
        return 0, 0
    return q, exponent


def srdhm(a: np.ndarray, b: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int64 holding int32 values."""
    ab = a.astype(np.int64) * int(b)  # |a|, |b| < 2^31: fits int64
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    total = ab + nudge
    return np.sign(total) * (np.abs(total) // (1 << 31))  # C division truncates toward zero


def rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def mbqm(x: np.ndarray, real: float) -> np.ndarray:
    """MultiplyByQuantizedMultiplier(x, QuantizeMultiplier(real))."""
    m, shift = quantize_multiplier(real)
    left, right = max(shift, 0), max(-shift, 0)
    return rounding_divide_by_pot(srdhm(np.asarray(x, np.int64) * (1 << left), m), right)


def requantize(
    acc: np.ndarray, reals: Any, zo: int, lo: int, hi: int, channel_axis: int | None = None
) -> np.ndarray:
    """clamp(zo + MBQM(acc, real)), one real per index of `channel_axis` when given."""
    acc = np.asarray(acc, np.int64)
    if channel_axis is None:
        out = mbqm(acc, float(reals))
    else:
        out = np.empty_like(acc)
        for c, real in enumerate(np.ravel(reals)):
            idx = [slice(None)] * acc.ndim
            idx[channel_axis] = c
            out[tuple(idx)] = mbqm(acc[tuple(idx)], float(real))
    return np.clip(out + zo, lo, hi)


def round_away(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def quant(scale: Any, zero_point: Any = 0, axis: int = 0) -> Quantization:
    scale = np.atleast_1d(np.asarray(scale, np.float32))
    return Quantization(
        scale=scale,
        zero_point=np.broadcast_to(np.asarray(zero_point, np.int64), scale.shape).copy(),
        axis=axis,
    )


def random_q(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    lo, hi = RANGES[np.dtype(dtype)]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def run_one_op(
    op: OpCode,
    inputs: list[tuple[np.ndarray, Quantization | None, bool]],
    out_quant: Quantization | None,
    out_dtype: Any = None,
    **attrs: Any,
) -> np.ndarray:
    """Build a one-op model (inputs: (value, quantization, is_constant)), write it to bytes,
    read it back and run it; returns the op's output."""
    b = ModelBuilder()
    indices, feeds = [], {}
    for k, (value, q, const) in enumerate(inputs):
        if const:
            indices.append(b.constant(f"c{k}", value, quantization=q))
        else:
            i = b.input(f"x{k}", value.shape, value.dtype)
            if q is not None:
                b.quantize(i, q.scale, q.zero_point, q.axis)
            indices.append(i)
            feeds[f"x{k}"] = value
    y = b.op(op, indices, **attrs)
    if out_quant is not None:
        b.quantize(y, out_quant.scale, out_quant.zero_point, out_quant.axis, dtype=out_dtype)
    b.output(y, "y")
    model = parse(serialize(b.build()))
    return Interpreter(model=model).run(feeds)["y"]
