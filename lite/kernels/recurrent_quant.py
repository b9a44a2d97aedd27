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

import array
from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Compute

_LEVELS = 255.0


def fake_quantize(a: np.ndarray, groups: int = 1) -> np.ndarray:
    """A new array: `a` rounded to its uint8 grid, each of its `groups` leading slices
    with its own parameters (see the module docstring)."""
    out = np.empty_like(a)
    bind_fake_quantize(a, out, groups)()
    return out


def bind_fake_quantize(src: np.ndarray, out: np.ndarray, groups: int = 1) -> Compute:
    """The step writing `src` rounded to its uint8 grid into `out` (same shape, float32;
    `out` may be `src`), the parameters taken over each of `groups` equal leading slices."""
    return bind_fake_quantize_each([src], out, groups)[0]


def bind_fake_quantize_each(
    srcs: Sequence[np.ndarray], out: np.ndarray, groups: int = 1
) -> list[Compute]:
    """bind_fake_quantize for each of `srcs` (all of `out`'s shape) into the same `out`:
    a recurrent loop's state at each time step, with one set of scratch arrays."""
    if groups == 1:
        return [_bind_whole(src, out) for src in srcs]
    return _bind_groups(srcs, out, groups)


def _float32_rounding() -> Callable[[float], float]:
    """x rounded to the nearest float32, as a Python float. One float64 operation on
    float32 values rounded so is the float32 operation's result (53 >= 2 * 24 + 2 bits: no
    double-rounding error), so the scalar parameters cost Python arithmetic only."""
    cell = array.array("f", [0.0])

    def r32(x: float) -> float:
        cell[0] = x
        return cell[0]

    return r32


def _bind_whole(src: np.ndarray, out: np.ndarray) -> Compute:
    r32 = _float32_rounding()
    lowest, highest = np.minimum.reduce, np.maximum.reduce
    divide, rint, clip, multiply = np.divide, np.rint, np.clip, np.multiply
    flat = src.reshape(-1) if src.flags.c_contiguous else src

    def compute() -> None:
        a_lo, a_hi = float(lowest(flat, axis=None)), float(highest(flat, axis=None))
        lo, hi = min(a_lo, 0.0), max(a_hi, 0.0)
        scale = r32(r32(hi - lo) / _LEVELS) or 1.0
        zp = float(round(min(max(-r32(lo / scale), 0.0), _LEVELS)))  # ties to even
        divide(src, scale, out=out)
        rint(out, out=out)
        low, high = -zp, _LEVELS - zp
        # Division by a positive scale and rounding are monotonic: the clamp only acts
        # when the extremes fall outside [low, high] (a rounded zero point; NaN).
        if not (round(r32(a_lo / scale)) >= low and round(r32(a_hi / scale)) <= high):
            clip(out, low, high, out=out)
        multiply(out, scale, out=out)

    return compute


def _bind_groups(srcs: Sequence[np.ndarray], out: np.ndarray, groups: int) -> list[Compute]:
    """`_bind_whole` for each leading slice of each of `srcs`, in one set of array calls:
    the extremes of every group in one reduction each, the parameters in Python floats,
    then one divide, rounding and multiply by the scales filled out to the operand's
    shape (on such small arrays a ufunc of equal shapes runs about twice as fast as one
    broadcasting a column). The steps share their scratch arrays."""
    extremes = np.empty((2, groups), np.float32)
    scales = np.empty(out.shape, np.float32)
    bounds = np.empty((2, *out.shape), np.float32)
    fills = [(scales[g].fill, bounds[0, g].fill, bounds[1, g].fill) for g in range(groups)]
    return [_group_step(src, out, extremes, scales, bounds, fills) for src in srcs]


def _group_step(
    src: np.ndarray,
    out: np.ndarray,
    extremes: np.ndarray,
    scales: np.ndarray,
    bounds: np.ndarray,
    fills: Sequence[
        tuple[Callable[[float], None], Callable[[float], None], Callable[[float], None]]
    ],
) -> Compute:
    r32 = _float32_rounding()
    rows, axis = _rows(src, len(fills))
    lowest, highest = np.minimum.reduce, np.maximum.reduce
    divide, rint, clip, multiply = np.divide, np.rint, np.clip, np.multiply
    low_out, high_out = extremes

    def compute() -> None:
        lowest(rows, axis=axis, out=low_out)
        highest(rows, axis=axis, out=high_out)
        a_lows, a_highs = extremes.tolist()
        inside, params = True, []
        for (fill, _, _), a_lo, a_hi in zip(fills, a_lows, a_highs, strict=True):
            lo, hi = min(a_lo, 0.0), max(a_hi, 0.0)
            scale = r32(r32(hi - lo) / _LEVELS) or 1.0
            zp = float(round(min(max(-r32(lo / scale), 0.0), _LEVELS)))
            fill(scale)
            params.append(zp)
            lo_q, hi_q = round(r32(a_lo / scale)), round(r32(a_hi / scale))
            inside = inside and lo_q >= -zp and hi_q <= _LEVELS - zp
        divide(src, scales, out=out)
        rint(out, out=out)
        if not inside:  # see _bind_whole
            for (_, low, high), zp in zip(fills, params, strict=True):
                low(-zp)
                high(_LEVELS - zp)
            clip(out, bounds[0], bounds[1], out=out)
        multiply(out, scales, out=out)

    return compute


def _rows(src: np.ndarray, groups: int) -> tuple[np.ndarray, int | tuple[int, ...]]:
    """`src` as a (groups, rest) view to reduce along axis 1, or, where its groups'
    values are no single strided run, `src` itself with the axes to reduce."""
    rows = src.view()
    try:
        rows.shape = (groups, -1)
    except AttributeError:
        return src, tuple(range(1, src.ndim))
    return rows, 1
