"""More int8/uint8 elementwise ops with TFLite's integer semantics (tfliteops):

- EQUAL, GREATER, LESS: TFLite's ComparisonWithScaling (see _QCompare);
- SQUARED_DIFFERENCE: TFLite's EvalQuantizedSquaredDifference (see QSquaredDifference);
- MAXIMUM, MINIMUM: the integers compared as stored, whatever the operands' and the
  output's parameters (TFLite's kernel does not rescale; its converter gives them one
  set of parameters);
- LEAKY_RELU: TFLite's QuantizeLeakyRelu, q - z_in requantized by s_in / s_out when it is
  not negative and by alpha * s_in / s_out otherwise (MultiplyByQuantizedMultiplier),
  plus z_out, clamped; evaluated once for every possible input into a lookup table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels import elementwise
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.ops import OpCode


class QStored(QuantizedKernel):
    """A binary op whose quantized form is the dtype-generic kernel (`base`) run on the
    stored integers, as LiteRT runs it (no rescaling)."""

    base: ClassVar[type[elementwise.BinaryKernel]]
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, _ = self.quantized_pair()
        self.inner = self.base(Attrs(attrs.op, {}), inputs)
        self.output_specs = [self.stored_output(a, self.inner.output_specs[0])]

    def stored_output(self, a: TensorSpec, spec: TensorSpec) -> TensorSpec:
        """The output spec, from the inner kernel's (`spec`) and input 0's."""
        return spec

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return self.inner.bind(inputs, outputs)


class _QExtreme(QStored):
    def stored_output(self, a: TensorSpec, spec: TensorSpec) -> TensorSpec:
        oq = self.attrs.output_quant[0] if self.attrs.output_quant else None
        oq = oq if oq is not None else self.quantization(a, "input 0")
        self.tensor_params(TensorSpec((), a.dtype, quant=oq), "the output")
        return self.out_spec(spec.shape, a.dtype, oq)


class QMaximum(_QExtreme):
    op = OpCode.MAXIMUM
    base = elementwise.Maximum


class QMinimum(_QExtreme):
    op = OpCode.MINIMUM
    base = elementwise.Minimum


class QLeakyRelu(QuantizedKernel):
    op = OpCode.LEAKY_RELU

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, zx = self.tensor_params(x, "the input")
        oq, so, zo = self.declared_output(x.dtype)
        alpha = attrs.float("alpha", 0.01)
        if not alpha >= 0:
            raise self.fail(f"an int8 leaky relu needs alpha >= 0, got {alpha}")
        lo, hi = dtype_range(x.dtype)
        q = np.arange(lo, hi + 1, dtype=np.int64) - zx
        positive, negative = q.copy(), q.copy()
        Requantizer(sx / so, 0, -(1 << 40), 1 << 40).multiply(positive)
        Requantizer(alpha * sx / so, 0, -(1 << 40), 1 << 40).multiply(negative)
        values = np.clip(np.where(q >= 0, positive, negative) + zo, lo, hi)
        self.table = values.astype(x.dtype)
        self.offset = -lo
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, table, offset = required(inputs, 0), outputs[0], self.table, self.offset
        index = np.empty(out.shape, np.int64)

        def compute() -> None:
            np.copyto(index, x)
            np.add(index, offset, out=index)
            table.take(index, out=out)

        return compute


class _QCompare(QuantizedKernel):
    """TFLite's ComparisonWithScaling: each operand (q - z) * 2^8 rescaled by its scale
    (MultiplyByQuantizedMultiplierSmallerThanOneExp), then compared; a bool output."""

    base: ClassVar[type[elementwise.BinaryKernel]]
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_pair()
        self.scaled = []
        for spec, what in ((a, "input 0"), (b, "input 1")):
            scale, zero = self.tensor_params(spec, what)
            if not 0 < scale < 1:
                raise self.fail(f"{what} scale {scale} must be in (0, 1), as TFLite requires")
            self.scaled.append((zero, Requantizer(scale, 0, -(1 << 40), 1 << 40)))
        self.inner = self.base(
            Attrs(attrs.op, {}),
            [TensorSpec(a.shape, np.dtype(np.int64)), TensorSpec(b.shape, np.dtype(np.int64))],
        )
        self.output_specs = [TensorSpec(self.inner.output_specs[0].shape, np.dtype(np.bool_))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        wide = [np.empty(self.inner.input(k).shape, np.int64) for k in range(2)]
        compare = self.inner.bind(list(wide), outputs)
        quantized = [required(inputs, k) for k in range(2)]
        pairs = list(zip(quantized, wide, self.scaled, strict=True))

        def compute() -> None:
            for q, w, (zero, requant) in pairs:
                np.copyto(w, q)
                np.subtract(w, zero, out=w)
                np.left_shift(w, 8, out=w)
                requant.multiply(w)
            compare()

        return compute


class QEqual(_QCompare):
    op = OpCode.EQUAL
    base = elementwise.Equal


class QGreater(_QCompare):
    op = OpCode.GREATER
    base = elementwise.Greater


class QLess(_QCompare):
    op = OpCode.LESS
    base = elementwise.Less


class QSquaredDifference(QuantizedKernel):
    """Each operand's (q - z) * 2^7 rescaled by s / (2 max(s_a, s_b)) (multipliers below
    one), the difference squared in int32, requantized by (2 max(s_a, s_b))^2 /
    (2^14 s_out), plus z_out, clamped."""

    op = OpCode.SQUARED_DIFFERENCE
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_pair()
        (sa, za), (sb, zb) = self.tensor_params(a, "input 0"), self.tensor_params(b, "input 1")
        oq, so, zo = self.declared_output(a.dtype)
        twice = 2 * max(sa, sb)
        wide = (-(1 << 40), 1 << 40)
        self.sides = [
            (za, Requantizer(sa / twice, 0, *wide)),
            (zb, Requantizer(sb / twice, 0, *wide)),
        ]
        self.requant = Requantizer(twice * twice / ((1 << 14) * so), zo, *dtype_range(a.dtype))
        shape = self.broadcast_shape(a, b)
        self.output_specs = [self.out_spec(shape, a.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        out = outputs[0]
        wide = [np.empty(self.input(k).shape, np.int64) for k in range(2)]
        acc = np.empty(out.shape, np.int64)
        quantized = [required(inputs, k) for k in range(2)]
        pairs = list(zip(quantized, wide, self.sides, strict=True))
        requant = self.requant

        def compute() -> None:
            for q, w, (zero, scale) in pairs:
                np.copyto(w, q)
                np.subtract(w, zero, out=w)
                np.left_shift(w, 7, out=w)
                scale.multiply(w)
            np.subtract(wide[0], wide[1], out=acc)
            np.multiply(acc, acc, out=acc)
            requant.apply(acc, out)

        return compute


# tflitefix: int8 PRELU on the parameters a TFLite file declares.
class QPRelu(QuantizedKernel):
    """TFLite's int8 PRELU: with v = q - z_in, v * s_in / s_out when v >= 0, else
    v * (alpha - z_alpha) * s_in s_alpha / s_out (each MultiplyByQuantizedMultiplier),
    plus z_out, clamped. alpha is a constant that broadcasts to the input."""

    op = OpCode.PRELU
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, self.zx = self.tensor_params(x, "the input")
        a = self.quantized_input(1)
        sa, za = self.tensor_params(a, "alpha (input 1)")
        alpha = self.constant(1, "alpha").astype(np.int64) - za
        try:
            shape = np.broadcast_shapes(x.shape, alpha.shape)
        except ValueError:
            raise self.fail(
                f"alpha {list(alpha.shape)} does not broadcast to the input {list(x.shape)}"
            ) from None
        if shape != tuple(x.shape):
            raise self.fail(f"alpha {list(alpha.shape)} must broadcast to {list(x.shape)}")
        self.alpha = alpha
        oq, so, self.zo = self.declared_output(x.dtype)
        wide = -(1 << 40), 1 << 40
        self.positive = Requantizer(sx / so, 0, *wide)
        self.negative = Requantizer(sx * sa / so, 0, *wide)
        self.lo, self.hi = dtype_range(x.dtype)
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        zx, zo, alpha, lo, hi = self.zx, self.zo, self.alpha, self.lo, self.hi
        positive, negative = self.positive, self.negative

        def compute() -> None:
            v = x.astype(np.int64) - zx
            up = v.copy()
            positive.multiply(up)
            down = v * alpha
            negative.multiply(down)
            np.copyto(out, np.clip(np.where(v >= 0, up, down) + zo, lo, hi), casting="unsafe")

        return compute
