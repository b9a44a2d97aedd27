"""Binary elementwise kernels with NumPy broadcasting: Add, Sub, Mul, Div, Maximum, Minimum, ..."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.activation import fused_activation, then_activation
from sporenet.lite.kernels.base import (
    Attrs,
    ChannelsLast,
    Compute,
    Kernel,
    TensorSpec,
    required,
)
from sporenet.lite.kernels.workspace import temporary_like
from sporenet.lite.ops import OpCode


class BinaryKernel(Kernel):
    """out = ufunc(a, b) with broadcasting; both inputs share one dtype."""

    ufunc: ClassVar[np.ufunc]
    num_inputs = (2, 2)
    result_dtype: ClassVar[np.dtype | None] = None  # comparisons produce bool

    mixed_dtypes: ClassVar[bool] = False  # Pow's exponent may have its own dtype
    elementwise = True

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.input(0), self.input(1)
        if a.dtype != b.dtype and not self.mixed_dtypes:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        shape = self.broadcast_shape(a, b)
        self.output_specs = [TensorSpec(tuple(shape), self.result_dtype or a.dtype)]
        self.activation = fused_activation(self.op.name, attrs.values)
        if self.activation is not None and self.output_specs[0].dtype.kind != "f":
            raise self.fail(
                f"a fused activation needs a float output, got {self.output_specs[0].dtype}"
            )

    # Layout: the ufunc reads and writes NCHW views of either storage, broadcasting on the
    # logical shape (a per-channel [N, C, 1, 1] operand is the same either way), so a 4-D
    # output may be stored channels-last; it follows the input of its own shape.
    def channels_last_input(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED if self.input(index).rank == 4 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        four = len(self.output_specs[0].shape) == 4
        return ChannelsLast.ACCEPTED if four else ChannelsLast.REFUSED

    def channels_last_follows(self, index: int) -> int | None:
        shape = self.output_specs[0].shape
        return next((k for k in (0, 1) if self.input(k).shape == shape), None)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        f, act = self.ufunc, self.activation
        a, b, out = _storage_order(required(inputs, 0), required(inputs, 1), outputs[0])
        constant = [spec is not None and spec.value is not None for spec in self.inputs]
        main = (
            _channel_rows(f, a, b, out, constant)
            or _in_input_layout(f, a, b, out)
            or _plain(f, a, b, out)
        )
        return then_activation(main, out, act)


def _plain(f: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Compute:
    """out = f(a, b); a one-element operand broadcast against the other's shape is passed
    as a 0-d view of itself (the same live value), which takes NumPy's scalar loop
    without broadcasting's per-call setup: about half the call on a layer norm's row.
    An operand of the output's size that broadcasts only over ones (a bias (C,) added
    to a (1, C) row) is passed as a view of the output's shape, for the same reason."""
    if b.size == 1 and a.shape == out.shape:
        b = b.reshape(())
    elif a.size == 1 and b.shape == out.shape:
        a = a.reshape(())
    else:
        a, b = same_shape(a, out), same_shape(b, out)
    return lambda: f(a, b, out=out)


def same_shape(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`x` viewed with `out`'s shape when the two differ only by axes of length one (the
    same elements in the same order, as when x broadcasts to out at its size) and the
    reshape is a view (the operand's live value); else `x` itself."""
    if x.shape == out.shape or not x.flags.c_contiguous:
        return x
    if [d for d in x.shape if d != 1] != [d for d in out.shape if d != 1]:
        return x
    return x.reshape(out.shape)


def _in_input_layout(f: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Compute | None:
    """f into a temporary laid out as both operands are, then one copy into `out`, when
    the two share a layout `out` does not have (an NCHW output of channels-last operands,
    or the reverse): a ufunc whose every operand walks across layouts runs several times
    slower than the same ufunc in one layout plus a transposing copy. None otherwise."""
    if a.shape != out.shape or b.shape != out.shape or a.strides != b.strides:
        return None
    if a.strides == out.strides or out.ndim < 2 or out.dtype != a.dtype:
        return None
    if not _dense(a):
        return None
    tmp = temporary_like(a)
    copyto = np.copyto

    def compute() -> None:
        f(a, b, out=tmp)
        copyto(out, tmp)

    return compute


def _dense(a: np.ndarray) -> bool:
    """Whether `a` is a permutation of a C-contiguous array (channels-last storage)."""
    order = sorted(range(a.ndim), key=lambda axis: -abs(a.strides[axis]))
    return a.transpose(order).flags.c_contiguous


_ROW_ELEMENTS = 1024
"""The longest row a per-channel operand is tiled to (see _channel_rows)."""


def _channel_rows(
    f: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray, constant: list[bool]
) -> Compute | None:
    """f over rows of k pixels when `out` is (N, H, W, C) in storage order with C short,
    one operand of out's shape and contiguous, and the other per channel ((N or 1, 1, 1,
    C), a bias or a squeeze-excite gate): NumPy would loop over rows of C elements, and
    runs a third as fast on 16-24 channels as on the NCHW layout. The per-channel operand
    is tiled k times (once at bind when constant, else by one small copy per call) and
    both tensors are seen as (N, H*W/k, k*C) rows. None when this does not apply."""
    if out.ndim != 4 or not out.flags.c_contiguous or out.dtype == np.bool_:
        return None
    n, h, w, c = out.shape
    operands = [x.reshape((1,) * (4 - x.ndim) + x.shape) for x in (a, b)]
    full = [x.shape == out.shape and x.flags.c_contiguous for x in operands]
    per_channel = [
        x.shape[1:3] == (1, 1) and x.shape[3] == c and x.shape[0] in (1, n) for x in operands
    ]
    if full == [True, False] and per_channel[1]:
        k_full, k_chan = 0, 1
    elif full == [False, True] and per_channel[0]:
        k_full, k_chan = 1, 0
    else:
        return None
    hw = h * w
    k = (
        max(d for d in range(1, _ROW_ELEMENTS // c + 1) if hw % d == 0)
        if c < _ROW_ELEMENTS // 2
        else 1
    )
    if k == 1:
        return None
    chan = operands[k_chan]
    rows = np.empty((chan.shape[0], 1, k * c), out.dtype)
    tiles, source = rows.reshape(chan.shape[0], k, c), chan.reshape(chan.shape[0], 1, c)
    shape = (n, hw // k, k * c)
    pair = [operands[k_full].reshape(shape), rows]
    if k_full == 1:
        pair.reverse()
    x, y, target = pair[0], pair[1], out.reshape(shape)
    copyto = np.copyto
    if constant[k_chan]:
        copyto(tiles, source)
        return lambda: f(x, y, out=target)

    def compute() -> None:
        copyto(tiles, source)
        f(x, y, out=target)

    return compute


def _storage_order(
    a: np.ndarray, b: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operands with their axes in storage order (N, H, W, C) when `out` is stored
    channels-last: the ufunc then loops over contiguous memory without reordering axes
    on every call. Broadcasting is unchanged (operands of lower rank are padded to 4-D
    first)."""
    if out.ndim != 4 or out.flags.c_contiguous or not out.transpose(0, 2, 3, 1).flags.c_contiguous:
        return a, b, out
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    return a4.transpose(0, 2, 3, 1), b4.transpose(0, 2, 3, 1), out.transpose(0, 2, 3, 1)


class Add(BinaryKernel):
    op = OpCode.ADD
    ufunc = np.add


class Sub(BinaryKernel):
    op = OpCode.SUB
    ufunc = np.subtract


class Mul(BinaryKernel):
    op = OpCode.MUL
    ufunc = np.multiply


class Div(BinaryKernel):
    """Float division; integer division truncates toward zero (C and ONNX semantics)."""

    op = OpCode.DIV
    ufunc = np.divide

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        if self.output_specs[0].dtype.kind == "f":
            return super().bind(inputs, outputs)
        a, b, out = inputs[0], inputs[1], outputs[0]
        rem = np.empty_like(out)

        def compute() -> None:
            # a - fmod(a, b) is an exact multiple of b, so floor division of it truncates
            # exactly, without a detour through float64 (which loses int64 precision).
            with np.errstate(divide="ignore", invalid="ignore"):  # x / 0 gives 0, no warning
                np.fmod(a, b, out=rem)
                np.subtract(a, rem, out=rem)
                np.floor_divide(rem, b, out=out)

        return then_activation(compute, out, self.activation)


class Maximum(BinaryKernel):
    op = OpCode.MAXIMUM
    ufunc = np.maximum


class Minimum(BinaryKernel):
    op = OpCode.MINIMUM
    ufunc = np.minimum


class Pow(BinaryKernel):
    """base ** exponent; the exponent may have another dtype (ONNX Pow's T1), the output
    keeps the base's dtype."""

    op = OpCode.POW
    ufunc = np.power
    mixed_dtypes = True

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.input(0), self.input(1)
        for spec, name in ((a, "base"), (b, "exponent")):
            if spec.dtype.kind not in "iuf":
                raise self.fail(f"{name} must be a number tensor, got {spec.dtype}")

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out, act = inputs[0], inputs[1], outputs[0], self.activation
        power = self._small_power(a, out)
        if power is not None:
            return then_activation(self._bind_power(required(inputs, 0), power, out), out, act)

        def compute() -> None:
            # Mixed dtypes compute in the common type, then cast to the base's dtype.
            np.power(a, b, out=out, casting="unsafe")

        return then_activation(compute, out, act)

    @staticmethod
    def _bind_power(a: np.ndarray, power: int, out: np.ndarray) -> Compute:
        """out = a ** power for power 2 or 3, as onnxruntime computes it: x * x (rounded
        once, as powf) and x * x * x (two roundings, not powf's one), at a tenth to a
        fiftieth of powf's cost (GELU's tanh form cubes every activation)."""
        multiply = np.multiply

        def square() -> None:
            multiply(a, a, out=out)

        def cube() -> None:
            multiply(a, a, out=out)
            multiply(out, a, out=out)

        def cube_in_place() -> None:  # out is a: the square must not overwrite it
            multiply(multiply(a, a), a, out=out)

        if power == 2:
            return square
        return cube_in_place if np.may_share_memory(a, out) else cube

    def _small_power(self, a: np.ndarray | None, out: np.ndarray) -> int | None:
        """2 or 3 for a float base raised to that constant single exponent, else None."""
        exponent = self.input(1).value
        if a is None or exponent is None or exponent.size != 1 or a.dtype.kind != "f":
            return None
        if a.dtype != out.dtype or a.shape != out.shape:
            return None
        value = float(exponent.reshape(-1)[0])
        return int(value) if value in (2.0, 3.0) else None


class Equal(BinaryKernel):
    op = OpCode.EQUAL
    ufunc = np.equal
    result_dtype = np.dtype(np.bool_)


class Greater(BinaryKernel):
    op = OpCode.GREATER
    ufunc = np.greater
    result_dtype = np.dtype(np.bool_)


class Less(BinaryKernel):
    op = OpCode.LESS
    ufunc = np.less
    result_dtype = np.dtype(np.bool_)


# ---- TFLite's floor division and modulo


class FloorDiv(BinaryKernel):
    """floor(a / b); integers exactly (x // 0 gives 0), floats as floor of the quotient."""

    op = OpCode.FLOOR_DIV
    ufunc = np.floor_divide

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a = required(inputs, 0)
        b = required(inputs, 1)
        out = outputs[0]
        if out.dtype.kind == "f":

            def compute() -> None:
                # TFLite divides, then floors (numpy's floor_divide may differ by one ulp
                # of the quotient where a / b rounds up to an integer).
                with np.errstate(divide="ignore", invalid="ignore"):
                    np.divide(a, b, out=out)
                np.floor(out, out=out)

            return compute

        def integer() -> None:
            with np.errstate(divide="ignore", invalid="ignore"):
                np.floor_divide(a, b, out=out)

        return integer


class FloorMod(BinaryKernel):
    """a - floor(a / b) * b: the remainder takes the divisor's sign (x % 0 gives 0 for
    integers)."""

    op = OpCode.FLOOR_MOD
    ufunc = np.mod

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a = required(inputs, 0)
        b = required(inputs, 1)
        out = outputs[0]

        def compute() -> None:
            with np.errstate(divide="ignore", invalid="ignore"):
                np.mod(a, b, out=out)

        return compute


class Atan2(BinaryKernel):
    """atan2(y, x) for inputs (y, x), as TFLite's ATAN2."""

    op = OpCode.ATAN2
    ufunc = np.arctan2


class SquaredDifference(BinaryKernel):
    """(a - b)^2, as TFLite's SQUARED_DIFFERENCE."""

    op = OpCode.SQUARED_DIFFERENCE
    ufunc = np.subtract

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a = required(inputs, 0)
        b = required(inputs, 1)
        out = outputs[0]

        def compute() -> None:
            np.subtract(a, b, out=out)
            np.multiply(out, out, out=out)

        return compute
