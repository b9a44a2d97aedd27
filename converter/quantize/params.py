"""Quantization parameters: affine activations, symmetric weights, int32 biases.

real = scale * (q - zero_point). Activations are asymmetric over a range that always
contains 0 (so zero padding and ReLU's zero are exact); weights are symmetric int8 in
[-127, 127], per output channel or per tensor; biases are int32 with scale
input_scale * weight_scale[c] and zero point 0 (TFLite's convention).
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.graph import Quantization

INT_RANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
}
WEIGHT_LIMIT = 127
NO_ZERO_POINTS = np.zeros(0, np.int64)
"""Symmetric weights and int32 biases store no zero points (an empty list means all zero
in the IR), which saves 16 bytes per output channel in the file."""
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def per_tensor(scale: float, zero_point: int) -> Quantization:
    return Quantization(
        scale=np.array([scale], np.float32), zero_point=np.array([zero_point], np.int64), axis=0
    )


def activation_params(lo: float, hi: float, dtype: np.dtype) -> Quantization:
    """Asymmetric parameters covering [lo, hi] (extended to contain 0) in `dtype`."""
    qmin, qmax = INT_RANGES[np.dtype(dtype)]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not np.isfinite(lo) or not np.isfinite(hi):
        raise ValueError(f"range [{lo}, {hi}] is not finite")
    scale = np.float32((hi - lo) / (qmax - qmin))
    if scale == 0 or not np.isfinite(scale):
        return per_tensor(1.0, qmin if lo == 0 else qmax)
    zero_point = int(np.clip(np.rint(qmin - lo / float(scale)), qmin, qmax))
    return per_tensor(float(scale), zero_point)


def fixed_params(scale: float, zero_point_int8: int, dtype: np.dtype) -> Quantization:
    """Fixed output parameters (softmax, logistic, tanh) given for int8; uint8 shifts the
    zero point by 128 as TFLite does."""
    shift = 128 if np.dtype(dtype) == np.uint8 else 0
    return per_tensor(scale, zero_point_int8 + shift)


def quantize(x: np.ndarray, q: Quantization, dtype: np.dtype) -> np.ndarray:
    """Round-to-nearest-even and saturate `x` into `dtype` with parameters `q`."""
    qmin, qmax = INT_RANGES[np.dtype(dtype)]
    scale, zp = _broadcast(q, x.ndim)
    values = np.rint(x.astype(np.float64) / scale) + zp
    return np.asarray(np.clip(values, qmin, qmax), dtype)


def dequantize(q_values: np.ndarray, q: Quantization) -> np.ndarray:
    """scale * (q - zero_point) as float32 (per tensor or along q.axis)."""
    scale, zp = _broadcast(q, q_values.ndim)
    scale32 = np.asarray(scale, np.float32)
    if q_values.dtype.itemsize <= 2 and q_values.ndim and np.array_equal(scale32, scale):
        # In float32, without float64 temporaries of the weights' size: q - zp is a small
        # integer (exact), and with a float32 scale the float32 product rounds as the
        # float64 one rounded to float32 does.
        out = q_values.astype(np.float32)
        np.subtract(out, np.asarray(zp, np.float32), out=out)
        np.multiply(out, scale32, out=out)
        return out
    return np.asarray(scale * (q_values.astype(np.float64) - zp), np.float32)


def _broadcast(q: Quantization, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    scale = q.scale.astype(np.float64)
    zp = q.zero_point.astype(np.float64) if q.zero_point.size else np.zeros_like(scale)
    if scale.size == 1:
        return scale.reshape(()), zp.reshape(())
    shape = [1] * ndim
    shape[q.axis] = -1
    return scale.reshape(shape), zp.reshape(shape)


def weight_params(w: np.ndarray, axis: int | None) -> Quantization:
    """Symmetric int8 scales: max |w| / 127 per slice along `axis`, or per tensor (None).
    An all-zero slice gets scale 1 (its values quantize to 0 either way)."""
    a = np.abs(w.astype(np.float64))
    if axis is None:
        absmax = np.array([a.max() if a.size else 0.0])
        axis = 0
    else:
        axis = axis % w.ndim
        absmax = (
            a.max(axis=tuple(d for d in range(w.ndim) if d != axis))
            if a.size
            else (np.zeros(w.shape[axis]))
        )
    scale = (absmax / WEIGHT_LIMIT).astype(np.float32)
    scale[scale == 0] = 1.0
    return Quantization(scale=scale, zero_point=NO_ZERO_POINTS, axis=axis)


def quantize_weights(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, Quantization]:
    """(int8 values in [-127, 127], their parameters)."""
    q = weight_params(w, axis)
    values = quantize(w, q, np.dtype(np.int8))
    return np.clip(values, -WEIGHT_LIMIT, WEIGHT_LIMIT).astype(np.int8), q


def quantize_bias(
    b: np.ndarray, input_scale: float, weights: Quantization
) -> tuple[np.ndarray, Quantization]:
    """int32 bias with scale input_scale * weight_scale[c] (one per output channel)."""
    scale = (np.float64(input_scale) * weights.scale.astype(np.float64)).astype(np.float32)
    values = np.rint(b.astype(np.float64).reshape(-1) / scale.astype(np.float64))
    values = values.reshape(b.shape)
    values = np.clip(values, INT32_MIN, INT32_MAX).astype(np.int32)
    q = Quantization(scale=scale.reshape(-1), zero_point=NO_ZERO_POINTS, axis=0)
    return values, q


def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when equal)."""
    ref = reference.astype(np.float64)
    noise = float(np.sum((ref - approx.astype(np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * np.log10(signal / noise)
