"""Quantized data movement: Reshape/Flatten/Squeeze/Unsqueeze/Transpose/Slice/Identity
(views or copies with the input's parameters unchanged), Concat (inputs requantized to
the output's parameters when they differ) and Pad (pads with the zero point, i.e. a real
zero, or the quantized `value`).

The movement itself is the dtype-generic float kernel's; these subclasses only carry the
quantization parameters through and check them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import gather_nd, pad, reshape, state, transform
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.quantized.base import (
    QuantizedKernel,
    dtype_range,
    is_int16_quantized,
    is_quantized,
)
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, round_half_away
from sporenet.lite.ops import OpCode


def _carry_quant(kernel: Kernel) -> None:
    """Give every output spec the first input's quantization."""
    x = kernel.input(0)
    if not (is_quantized(x) or is_int16_quantized(x)):
        raise kernel.fail(f"input 0 must be int8/uint8/int16 with quantization, got {x.dtype}")
    kernel.output_specs = [TensorSpec(s.shape, s.dtype, quant=x.quant) for s in kernel.output_specs]


def passthrough(base: type[Kernel]) -> type[Kernel]:
    """The quantized form of a dtype-generic movement kernel: same work, parameters kept."""

    def __init__(self: Kernel, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        base.__init__(self, attrs, inputs)
        _carry_quant(self)

    return type(
        f"Q{base.__name__}",
        (base,),
        {"__init__": __init__, "__doc__": f"Quantized {base.__name__}."},
    )


QReshape = passthrough(reshape.Reshape)
QFlatten = passthrough(reshape.Flatten)
QIdentity = passthrough(reshape.Identity)
QSqueeze = passthrough(transform.Squeeze)
QUnsqueeze = passthrough(transform.Unsqueeze)
QTranspose = passthrough(transform.Transpose)
QSlice = passthrough(transform.Slice)
# data movement TFLite runs on int8 with the input's parameters (tfliteops)
QReadVariable = passthrough(state.ReadVariable)
QSplit = passthrough(transform.Split)
QGather = passthrough(transform.Gather)
QGatherNd = passthrough(gather_nd.GatherNd)
QTile = passthrough(transform.Tile)
QExpand = passthrough(transform.Expand)
QDepthToSpace = passthrough(transform.DepthToSpace)
QSpaceToDepth = passthrough(transform.SpaceToDepth)


class QPad(pad.Pad):
    """Pad whose constant fill is the quantized `value` (the zero point for 0.0)."""

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        _carry_quant(self)
        x = self.input(0)
        quant = x.quant
        if quant is None or quant.scale.size != 1:
            raise self.fail("input must be quantized per tensor")
        scale = float(quant.scale.flat[0])
        zp = int(quant.zero_point.flat[0]) if quant.zero_point.size else 0
        if self.optional_input(2) is not None and self.input(2).dtype == x.dtype:
            return  # a fill given already quantized, in the input's dtype
        q = zp + int(
            round_half_away(np.asarray(np.float32(self.value) / np.float32(scale), np.float64))
        )
        lo, hi = dtype_range(x.dtype)
        self.value = min(max(q, lo), hi)


class QConcat(QuantizedKernel):
    """Concat along `axis`; an input whose parameters differ from the output's is
    requantized as REQUANTIZE does, the others are copied."""

    op = OpCode.CONCAT
    num_inputs = (1, 1 << 16)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.inner = transform.Concat(attrs, inputs)
        x = self.quantized_input(0)
        oq = self.attrs.output_quant[0] if self.attrs.output_quant else None
        oq = oq if oq is not None else x.quant
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        self.requants: list[tuple[np.int64, Requantizer] | None] = []
        self.scratch_layout = []
        for k in range(len(inputs)):
            spec = self.quantized_input(k)
            s, z = self.tensor_params(spec, f"input {k}")
            if (s, z) == (so, zo):
                self.requants.append(None)
                continue
            self.requants.append((np.int64(z), Requantizer(s / so, zo, *dtype_range(x.dtype))))
            self.scratch_layout += [(spec.shape, np.dtype(np.int64)), (spec.shape, x.dtype)]
        self.output_specs = [self.out_spec(self.inner.output_specs[0].shape, x.dtype, oq)]

    def output_region(self, index: int) -> tuple[slice, ...] | None:
        # A requantized input is not the output's bytes.
        return self.inner.output_region(index) if self.requants[index] is None else None

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute | None:
        out = outputs[0]
        scratch = iter(self.scratch_arrays())
        steps, parts = [], []
        for x, rq in zip(inputs, self.requants, strict=True):
            if rq is None:
                parts.append(x)
                continue
            acc, narrow = next(scratch), next(scratch)
            steps.append((x, rq[0], rq[1], acc, narrow))
            parts.append(narrow)
        join = self.inner.bind(parts, [out])
        if join is None:  # every input was computed in place (so none is requantized)
            return None
        subtract = np.subtract

        def compute() -> None:
            for x, z, rq, acc, narrow in steps:
                subtract(x, z, out=acc)
                rq.apply(acc, narrow)
            join()

        return compute
