"""The activation rounding of onnxruntime's DynamicQuantizeLSTM, for LSTM kernels.

A dynamically quantized LSTM (com.microsoft DynamicQuantizeLSTM) multiplies its int8
weights with activations quantized to uint8 at run time: every product quantizes its
left operand afresh with DynamicQuantizeLinear's parameters over the whole operand,

    lo, hi = min(min(a), 0), max(max(a), 0)
    scale = (hi - lo) / 255                 (1 when a is all zeros)
    zero_point = clamp(round(-lo / scale), 0, 255)

in float32 with ties to even, and scales the integer sum by scale * weight scale. The
input projection quantizes X once for all its rows (every direction sees the same X);
each step quantizes the previous hidden state of one direction (all its batch rows).
With the weights dequantized, the same products are those of the dequantized
activations, clamp(round(a / scale), -zero_point, 255 - zero_point) * scale, up to float
rounding: that is what these steps write, so the LSTM kernels compute with the integers
of both operands exactly as onnxruntime's semantics say (an LSTM node carries
`quantize_activations = 1` for this).
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.kernels.base import Compute

_LEVELS = 255


def fake_quantize(a: np.ndarray, groups: int = 1) -> np.ndarray:
    """A new array: `a` rounded to its uint8 grid, each of its `groups` leading slices
    with its own parameters (see the module docstring)."""
    out = np.empty_like(a)
    bind_fake_quantize(a, out, groups)()
    return out


def bind_fake_quantize(src: np.ndarray, out: np.ndarray, groups: int = 1) -> Compute:
    """The step writing `src` rounded to its uint8 grid into `out` (same shape, float32;
    `out` may be `src`), the parameters taken over each of `groups` equal leading slices."""
    if groups == 1:
        return _bind_whole(src, out)
    return _bind_groups(src, out, groups)


def _bind_whole(src: np.ndarray, out: np.ndarray) -> Compute:
    f32 = np.float32
    zero, one, levels = f32(0), f32(1), f32(_LEVELS)
    lowest, highest = np.minimum.reduce, np.maximum.reduce
    divide, rint, clip, multiply = np.divide, np.rint, np.clip, np.multiply
    flat = src.reshape(-1) if src.flags.c_contiguous else src

    def compute() -> None:
        a_lo, a_hi = f32(lowest(flat, axis=None)), f32(highest(flat, axis=None))
        lo, hi = min(a_lo, zero), max(a_hi, zero)
        scale = f32(f32(hi - lo) / levels)
        if scale == zero:
            scale = one
        zp = min(max(f32(np.rint(f32(-f32(lo / scale)))), zero), levels)
        divide(src, scale, out=out)
        rint(out, out=out)
        low, high = -zp, f32(levels - zp)
        # Division by a positive scale and rounding are monotonic: the clamp only acts
        # when the extremes fall outside [low, high] (a rounded zero point; NaN).
        if not (rint(f32(a_lo / scale)) >= low and rint(f32(a_hi / scale)) <= high):
            clip(out, low, high, out=out)
        multiply(out, scale, out=out)

    return compute


def _bind_groups(src: np.ndarray, out: np.ndarray, groups: int) -> Compute:
    f32 = np.float32
    lead = (groups,) + (1,) * (src.ndim - 1)
    axes = tuple(range(1, src.ndim))
    levels = f32(_LEVELS)
    # Per-group parameters, as (groups, 1, ...) arrays that broadcast over each slice.
    lo, hi, scale, zp, low, high = (np.empty(lead, np.float32) for _ in range(6))
    minimum, maximum, divide, rint = np.minimum, np.maximum, np.divide, np.rint
    subtract, multiply, clip = np.subtract, np.multiply, np.clip

    def compute() -> None:
        np.minimum.reduce(src, axis=axes, keepdims=True, out=lo)
        np.maximum.reduce(src, axis=axes, keepdims=True, out=hi)
        minimum(lo, 0, out=lo)
        maximum(hi, 0, out=hi)
        subtract(hi, lo, out=scale)
        divide(scale, levels, out=scale)
        scale[scale == 0] = 1
        divide(lo, scale, out=zp)
        np.negative(zp, out=zp)
        rint(zp, out=zp)
        clip(zp, 0, levels, out=zp)
        np.negative(zp, out=low)
        subtract(levels, zp, out=high)
        divide(src, scale, out=out)
        rint(out, out=out)
        clip(out, low, high, out=out)
        multiply(out, scale, out=out)

    return compute
