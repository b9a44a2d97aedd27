"""The end of every accumulating kernel: bias, requantization, activation clamp, narrowing.

Given integer accumulators (held exactly in float32 or float64 arrays by the GEMM) it
computes clamp(z_out + MultiplyByQuantizedMultiplier(acc + bias, M, shift), lo, hi), the
same result as `Requantizer`, with TFLite's two roundings folded into one floor. With
M' = M 2^left, e the right shift and h = 2^(e-1) (0 when e = 0):

    q = floor(((acc + bias) M' + 2^30 + h 2^31 - [z < 0] 2^31) / 2^(31+e)) + z_out

since floor(floor(a / 2^31) + c) / 2^e) = floor((a + c 2^31) / 2^(31+e)) for integer c;
the high-mul's result z is negative exactly when acc + bias < 0 (M' > 2^30) or < -1
(M' = 2^30). The negative correction only moves results that are <= z_out, so it is
skipped when the clamp's lower bound is >= z_out (relu, relu6). Two exact routes:

- float64, when the numerator stays below 2^53 (known from the accumulators' bound):
  every term is a multiple of 2^-(31+e), so (acc + bias) c + offset is exact;
- int64 otherwise: the same numerator, then one arithmetic shift.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from sporenet.lite.errors import LiteError
from sporenet.lite.kernels import raw
from sporenet.lite.kernels.activation import scalar
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.quantized.fixed_point import quantize_multipliers
from sporenet.lite.kernels.quantized.rounding import OnnxOutputStage, onnx_multipliers
from sporenet.lite.kernels.workspace import temporary

_FLOAT_EXACT = 1 << 53
# The clip ufunc itself (as lite/kernels/activation.py takes it): one call where np.clip's
# Python wrapper, or maximum then minimum, cost more on a small layer's output.
_clip: Any = getattr(getattr(getattr(np, "_core", None), "umath", None), "clip", None)
if not isinstance(_clip, np.ufunc):
    _clip = np.clip
_INT64_SAFE = 1 << 62
F64, U8 = np.dtype(np.float64), np.dtype(np.uint8)


class _Route(NamedTuple):
    """OutputStage's per-channel operands (channel-shaped): the numerator's coefficient
    and offset, the negative-tie step and threshold, the int64 route's shifts."""

    coef: np.ndarray
    offset: np.ndarray
    step: np.ndarray
    threshold: np.ndarray
    units: np.ndarray


def _float_steps(units: np.ndarray) -> np.ndarray:
    """The float route's negative-tie step per channel: 2^-e for a right shift e =
    units - 31 > 0, else 0."""
    right = units - 31
    return np.where(right > 0, np.ldexp(1.0, -right), 0.0)


def lowering(v: np.ndarray, step: np.ndarray, mask: np.ndarray) -> Compute:
    """The step subtracting `step` from `v` where `mask` holds: the difference into a
    temporary, put back by np.putmask, which NumPy runs several times faster than a
    subtraction with `where=` (a masked ufunc loop)."""
    lowered = temporary(v.shape, v.dtype)
    subtract, putmask = np.subtract, raw.putmask

    def lower() -> None:
        subtract(v, step, lowered)
        putmask(v, mask, lowered)

    return lower


class OutputStage:
    """Requantization of accumulators whose channel axis broadcasts as `channel_shape`."""

    def __init__(
        self,
        reals: np.ndarray,
        bias: np.ndarray | None,
        zero_point: int,
        lo: int,
        hi: int,
        acc_bound: int,
        channel_shape: tuple[int, ...],
    ) -> None:
        reals = np.broadcast_to(np.asarray(reals, np.float64), (int(np.prod(channel_shape)),))
        m, shift = quantize_multipliers(reals)
        # Python ints throughout: no silent overflow, and no integer array loops (code
        # of its own a small model's load would fault in for a few dozen channels).
        shifts = shift.tolist()
        right = [max(-s, 0) for s in shifts]
        mult = [mu << max(s, 0) for mu, s in zip(m.tolist(), shifts, strict=True)]
        biases = [0] * len(mult) if bias is None else [int(b) for b in bias.tolist()]
        bound = int(acc_bound) + max((abs(b) for b in biases), default=0)
        self.lo, self.hi, self.zo = int(lo), int(hi), int(zero_point)
        big = bound * max(mult, default=0)
        if big >= _INT64_SAFE:
            raise OverflowError(f"accumulators up to {bound} overflow the requantization")
        # Numerator pieces in units of 2^-(31+e): rounding offset, bias, and the zero point
        # when it fits (else it is added after rounding).
        unit_ints = [31 + r for r in right]
        base = [
            (1 << 30) + ((1 << (r - 1)) << 31 if r > 0 else 0) + b * mu
            for r, b, mu in zip(right, biases, mult, strict=True)
        ]
        with_zo = [b + (self.zo << u) for b, u in zip(base, unit_ints, strict=True)]
        self.fold_zo = big + max(abs(v) for v in with_zo) < _INT64_SAFE
        offset_ints = with_zo if self.fold_zo else base
        if big + max(abs(v) for v in offset_ints) >= _INT64_SAFE:
            raise OverflowError(f"bias up to {bound} overflows the requantization")
        self.float_path = self.fold_zo and big + max(abs(v) for v in offset_ints) < _FLOAT_EXACT
        # acc < threshold: z < 0
        thresholds = [(0 if mu > (1 << 30) else -1) - b for mu, b in zip(mult, biases, strict=True)]
        # What `folded` and `_route` need (units of 2^-(31+e) per channel), the rows of one
        # int64 array: each is below 2^62, and `folded` computes with them as Python ints.
        self._ints = np.array([mult, unit_ints, offset_ints, thresholds], np.int64)
        self._big = big
        self._shape = channel_shape
        self.correct = any(r > 0 for r in right) and self.lo < self.zo

    @functools.cached_property
    def _route(self) -> _Route:
        """The per-channel operands `bind` runs with, built when first bound: a stage
        folded into its GEMM (`folded`) never needs them."""
        mult, units, offset, threshold = self._ints
        shape = self._shape
        if self.float_path:
            unit = np.ldexp(1.0, -units)
            coef = (mult.astype(np.float64) * unit).reshape(shape)
            offsets = (offset.astype(np.float64) * unit).reshape(shape)
            step = _float_steps(units).reshape(shape)
        else:
            coef, offsets = mult.reshape(shape), offset.reshape(shape)
            step = np.where(units > 31, np.int64(1) << 31, 0).reshape(shape)
        wide = threshold.astype(np.float64).reshape(shape)
        return _Route(coef, offsets, step, wide, units.reshape(shape))

    def bind(self, acc: np.ndarray, out: np.ndarray, wide: np.ndarray) -> Compute:
        """The step writing `out` from `acc` (float32 or float64 integers, same shape);
        `wide` is a float64 (float path) or int64 scratch array of that shape."""
        if self.float_path:
            return self._bind_float(acc, out, wide)
        route = self._route
        lo, hi, coef, offset, shift = self.lo, self.hi, route.coef, route.offset, route.units
        i64 = np.dtype(np.int64)
        zo = scalar(i64, 0 if self.fold_zo else self.zo)  # added after rounding when not folded
        multiply, add, copyto, right_shift = np.multiply, np.add, raw.copyto, np.right_shift
        clip, bounds = _clip, (scalar(i64, lo), scalar(i64, hi))
        correct = self._correction(acc, wide)

        def compute() -> None:
            copyto(wide, acc, casting="unsafe")
            multiply(wide, coef, out=wide)
            add(wide, offset, out=wide)
            if correct is not None:
                correct()
            right_shift(wide, shift, out=wide)
            if zo:
                add(wide, zo, out=wide)
            clip(wide, *bounds, out=wide)  # the ufunc, in place, then a narrowing copy
            copyto(out, wide, casting="unsafe")

        return compute

    def _bind_float(self, acc: np.ndarray, out: np.ndarray, wide: np.ndarray) -> Compute:
        """Float route. The values are shifted by -lo so the clamped range is [0, hi - lo]
        where a cast truncating to uint8 is the floor; adding lo back is a wrapping uint8
        add on the output's bytes (two's complement for int8)."""
        coef, offset = self._route.coef, self._route.offset - self.lo
        if (coef == coef.flat[0]).all() and (offset == offset.flat[0]).all():
            # One multiplier (per-tensor weights): 0-d operands run NumPy's fast loops.
            coef, offset = scalar(F64, float(coef.flat[0])), scalar(F64, float(offset.flat[0]))
        zero, top = scalar(F64, 0.0), scalar(F64, np.nextafter(float(self.hi - self.lo + 1), 0.0))
        narrow = out.view(np.uint8)
        back = scalar(U8, self.lo % 256)
        multiply, add, clip, copyto = np.multiply, np.add, _clip, raw.copyto
        correct = self._correction(acc, wide)

        def compute() -> None:  # outputs by position, as in Folded.bind
            multiply(acc, coef, wide)
            add(wide, offset, wide)
            if correct is not None:
                correct()
            clip(wide, zero, top, wide)
            copyto(narrow, wide, casting="unsafe")
            if back:
                add(narrow, back, narrow)

        return compute

    def _correction(self, acc: np.ndarray, wide: np.ndarray) -> Compute | None:
        """The step lowering negative ties in `wide` (None when the clamp makes it moot)."""
        if not self.correct:
            return None
        mask = np.empty(acc.shape, bool)
        step = np.broadcast_to(self._route.step, acc.shape)
        threshold, less = self._route.threshold, np.less
        lower = lowering(wide, step, mask)

        def correct() -> None:
            less(acc, threshold, mask)
            lower()

        return correct

    @property
    def wide_dtype(self) -> np.dtype:
        return np.dtype(np.float64 if self.float_path else np.int64)

    def folded(self, w2: np.ndarray, zero_point: int = 0, raw_max: int = 0) -> Folded | None:
        """The float route folded into a float64 GEMM with integer weights `w2` (O, K),
        or None when that is not exact (see Folded).

        With the input's `zero_point` and `raw_max` (the largest |q| of its dtype) the
        zero point joins the offset column too, when that stays exact: the GEMM then
        reads the raw input, whose conversion is a plain copy (Folded.zero_point is what
        the caller still subtracts: 0 or the zero point)."""
        if not self.float_path:
            return None
        mult, units, offsets, thresholds = (a.tolist() for a in self._ints)
        big = self._big
        if min(mult) <= 0:
            return None  # v would not grow with acc: the correction needs acc itself
        # The clamp's shift by -lo (as in _bind_float) joins the offset.
        shifted = [o - (self.lo << u) for o, u in zip(offsets, units, strict=True)]
        marks = [t * m + o for t, m, o in zip(thresholds, mult, shifted, strict=True)]
        if big + max(abs(v) for v in shifted + marks) >= _FLOAT_EXACT:
            return None
        if zero_point:
            # sum w (x - z) = sum w x - z sum w: every partial sum of the raw products
            # stays below raw_max * sum |w| of one output's weights, in units.
            # Float64 sums of 8-bit integers are exact, and float64 loops are code the
            # steps run anyway (integer reductions are not).
            rows = w2.astype(np.float64)
            sums = [int(v) for v in rows.sum(axis=1).tolist()]
            sums_abs = [int(v) for v in np.abs(rows).sum(axis=1).tolist()]
            raw = [o - zero_point * s * m for o, s, m in zip(shifted, sums, mult, strict=True)]
            raw_big = max((raw_max * a * m for a, m in zip(sums_abs, mult, strict=True)), default=0)
            if raw_big + max(abs(v) for v in raw) < _FLOAT_EXACT:
                shifted, zero_point = raw, 0
        # Without the shift by -lo (Folded.bind's byte outputs), offsets and marks grow
        # by lo in units: exact when still below 2^53 of them.
        back = [v + (self.lo << u) for v, u in zip(shifted + marks, units + units, strict=True)]
        unshifts = big + max(abs(v) for v in back) < _FLOAT_EXACT
        unit = np.ldexp(1.0, -np.array(units, np.int64))
        coef = np.array(mult, np.float64) * unit  # exact: 31-bit multipliers
        offset = np.array(shifted, np.float64) * unit
        mark = np.array(marks, np.float64) * unit
        step = _float_steps(self._ints[1]) if self.correct else None
        top = np.nextafter(float(self.hi - self.lo + 1), 0.0)
        return Folded((w2, coef, offset), mark, step, top, self.lo, zero_point, unshifts)


class Folded:
    """OutputStage's float route folded into the GEMM, for small layers where each NumPy
    call costs more than its arithmetic.

    The weights are premultiplied by the channel's coefficient M' 2^-(31+e) (exact: 8-bit
    weights times 31-bit multipliers) and the offset is one more weight column, against a
    row of ones in the GEMM's other operand; so one float64 GEMM yields the float route's
    v = acc * coef + offset. Every product and partial sum is a multiple of 2^-(31+e)
    below 2^53 of those units (checked), hence exact in any summation order. The
    negative-tie correction compares v with the threshold mapped the same way (v grows
    with acc), so acc itself is never formed.

    The float64 weights are built when first read (a layer that reads its input as
    float64 is folded again for that input, and its first fold's weights are never
    read), from `parts`: the integer weights (O, K), the coefficients (O,) and the
    offset column (O,).
    """

    def __init__(
        self,
        parts: tuple[np.ndarray, np.ndarray, np.ndarray],
        mark: np.ndarray,
        step: np.ndarray | None,
        top: float,
        lo: int,
        zero_point: int = 0,
        unshifts: bool = False,
    ) -> None:
        self._parts: tuple[np.ndarray, np.ndarray, np.ndarray] = parts
        self.mark, self.step, self.top = mark, step, top
        self.lo, self.back = lo, np.uint8(lo % 256)  # the clamp's low end; as a byte
        self.zero_point = zero_point
        # Whether v may be taken without the shift by -lo (exact, see OutputStage.folded),
        # and whether it is (done once, by `bind` for byte outputs).
        self.unshifts, self._unshifted = unshifts, False

    @functools.cached_property
    def weights(self) -> np.ndarray:
        """The folded weights (O, K + 1), float64: w * coef, then the offset column. A
        kernel that keeps them in another layout may assign that (a view) instead."""
        w2, coef, offset = self._parts
        del self._parts  # the integer weights are not needed again
        weights = np.empty((w2.shape[0], w2.shape[1] + 1), np.float64)
        np.multiply(w2, coef[:, None], out=weights[:, :-1])  # 8 x 31 bits: exact
        weights[:, -1] = offset
        return weights

    def mask_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The bool scratch `bind` needs for accumulators of `shape` (empty when no
        negative tie can reach the output)."""
        return shape if self.step is not None else (0,)

    def bind(
        self, v: np.ndarray, out: np.ndarray, mask: np.ndarray, floats: np.ndarray | None = None
    ) -> Compute:
        """The step writing `out` (N, O, P) from the GEMM's result v (N, O, P), in place;
        `mask` is a bool scratch array of `mask_shape(v.shape)`. With `floats` (float64,
        v's shape) it writes there instead the outputs minus `lo`, as exact integers in
        float64 (for a folded layer that reads them: QConv2D.float_input). Binding may
        move the weights' offset column (in place): the GEMM reads them as they are after."""
        if floats is not None:
            if self._unshifted:  # its offset column already holds +lo for the bytes
                raise LiteError("a folded int8 layer's outputs go to bytes or to floats, not both")
            return self._bind_floats(v, floats, mask)
        if v.size == 1:
            return self._bind_one(v, out)
        if self.back and self.unshifts:
            return self._bind_unshifted(v, out, mask)
        narrow = out.view(np.uint8)
        # 0-d operands: a Python or NumPy scalar costs a conversion on every call.
        zero, top, back = scalar(F64, 0.0), scalar(F64, self.top), scalar(U8, int(self.back))
        clip, copyto, add = _clip, raw.copyto, np.add
        correct = self._lowering(v, mask)

        # Outputs passed by position: NumPy parses an `out=` keyword on every call.
        def compute() -> None:
            if correct is not None:
                correct()
            clip(v, zero, top, v)
            copyto(narrow, v, casting="unsafe")
            if back:
                add(narrow, back, narrow)

        return compute

    def _bind_unshifted(self, v: np.ndarray, out: np.ndarray, mask: np.ndarray) -> Compute:
        """`bind` into bytes with the offset column and the marks moved back by lo, so v
        is the output itself before the floor: the clamp to [lo, hi + 1), the floor and
        the narrowing cast. The same calls as the shifted route's clamp, cast and byte
        add, but all float64 loops: a byte add's loop is code no other step runs."""
        if not self._unshifted:
            self._unshifted = True
            self.weights[:, -1] += self.lo  # exact (OutputStage.folded): lo is an integer
            self.mark = self.mark + self.lo
        end = float(self.lo + math.ceil(self.top))  # hi + 1
        low, top = scalar(F64, float(self.lo)), scalar(F64, np.nextafter(end, -math.inf))
        clip, floor, copyto = _clip, np.floor, raw.copyto
        correct = self._lowering(v, mask)

        def compute() -> None:
            if correct is not None:
                correct()
            clip(v, low, top, v)
            floor(v, v)
            copyto(out, v, casting="unsafe")

        return compute

    def _bind_floats(self, v: np.ndarray, floats: np.ndarray, mask: np.ndarray) -> Compute:
        """`bind` into float64 outputs minus `lo`: the clamp to [0, top], then the floor
        (what the truncating cast to bytes computes, without the byte offset)."""
        zero, top = scalar(F64, 0.0), scalar(F64, self.top)
        clip, floor = _clip, np.floor
        correct = self._lowering(v, mask)

        def compute() -> None:
            if correct is not None:
                correct()
            clip(v, zero, top, v)
            floor(v, floats)

        return compute

    def _lowering(self, v: np.ndarray, mask: np.ndarray) -> Compute | None:
        """The step lowering v's negative ties (v < mark: v - step) in place; None when
        no negative tie can reach the output."""
        if self.step is None:
            return None
        shape = (1, -1, 1)
        mark, mask = self.mark.reshape(shape), mask.reshape(v.shape)
        lower, less = lowering(v, np.broadcast_to(self.step.reshape(shape), v.shape), mask), np.less

        def correct() -> None:
            less(v, mark, mask)
            lower()

        return correct

    def _bind_one(self, v: np.ndarray, out: np.ndarray) -> Compute:
        """`bind` for one output (a classifier's single score) in Python floats: the
        float64 arithmetic of the array steps (the tie's lowering, the clamp, the floor)
        on one number, where each of those steps as a NumPy call costs several times
        its work. The byte written is the array route's: floor + lo."""
        read, store = v.reshape(-1).item, out.reshape(-1).__setitem__
        top, lo, floor = float(self.top), int(self.lo), math.floor
        correct = self.step is not None
        mark = float(self.mark.flat[0])
        step = float(self.step.flat[0]) if self.step is not None else 0.0

        def compute() -> None:
            value = read(0)
            if correct and value < mark:
                value -= step
            store(0, floor(min(max(value, 0.0), top)) + lo)

        return compute


def make_stage(
    rounding: str,
    s_in: float,
    s_w: np.ndarray,
    s_out: float,
    bias: np.ndarray | None,
    zero_point: int,
    lo: int,
    hi: int,
    acc_bound: int,
    channel_shape: tuple[int, ...],
) -> OutputStage | OnnxOutputStage:
    """The output stage of `rounding` mode ("tflite" or "onnx", see quantized/rounding.py)
    for input scale `s_in`, weight scales `s_w` and output scale `s_out`."""
    if rounding == "onnx":
        m = onnx_multipliers(s_in, s_w, s_out)
        return OnnxOutputStage(m, bias, zero_point, lo, hi, channel_shape)
    reals = s_in * np.asarray(s_w, np.float64) / s_out
    return OutputStage(reals, bias, zero_point, lo, hi, acc_bound, channel_shape)
