"""float16 models computed through float32 kernels.

NumPy's float16 arithmetic has no BLAS: a float16 matmul or convolution runs an
element-by-element loop tens to hundreds of times slower than float32, and accumulates
in float16. A node of a BLAS-bound op whose inputs are float16 is therefore prepared as
the same op on float32: its float16 weights are widened once at prepare time, its other
float16 inputs are widened into temporaries on every call, and its float32 results are
rounded back to the float16 outputs the graph declares (what onnxruntime does for CPU ops
without float16 kernels, by inserting casts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_set

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

WIDENED = derived_set(lambda d: d.float16_widened)
"""Ops whose float kernels run on BLAS, computed in float32 for float16 inputs."""


def widens(op: OpCode, inputs: Sequence[TensorSpec | None]) -> bool:
    """Whether a node of `op` with these inputs runs through float32."""
    return op in WIDENED and any(s is not None and s.dtype == F16 for s in inputs)


def _wide(spec: TensorSpec | None) -> TensorSpec | None:
    if spec is None or spec.dtype != F16:
        return spec
    value = None if spec.value is None else spec.value.astype(F32)
    return TensorSpec(spec.shape, F32, value, spec.quant)


class Float32Compute(Kernel):
    """A float32 kernel (`inner`) run for float16 inputs and outputs."""

    num_inputs = (0, 1 << 16)

    def __init__(
        self, kernel: type[Kernel], attrs: Attrs, inputs: Sequence[TensorSpec | None]
    ) -> None:
        super().__init__(attrs, inputs)
        self.op = kernel.op  # type: ignore[misc]
        self.inner = kernel(attrs, [_wide(s) for s in inputs])
        self.output_specs = [
            TensorSpec(s.shape, F16) if s.dtype == F32 else s for s in self.inner.output_specs
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        wide_in: list[np.ndarray | None] = []
        widen: list[tuple[np.ndarray, np.ndarray]] = []
        for spec, x in zip(self.inputs, inputs, strict=True):
            if x is None or spec is None or spec.dtype != F16:
                wide_in.append(x)
            elif spec.value is not None:
                wide_in.append(spec.value.astype(F32))  # a weight: widened once
            else:
                buf = temporary(x.shape, F32)
                widen.append((buf, x))
                wide_in.append(buf)
        wide_out: list[np.ndarray] = []
        narrow: list[tuple[np.ndarray, np.ndarray]] = []
        for spec, y in zip(self.inner.output_specs, outputs, strict=False):
            if spec.dtype == F32 and y.dtype == F16:
                buf = temporary(y.shape, F32)
                narrow.append((y, buf))
                wide_out.append(buf)
            else:
                wide_out.append(y)
        run = self.inner.bind(wide_in, wide_out)

        def step() -> None:
            for dst, src in widen:
                np.copyto(dst, src)
            if run is not None:
                run()
            for dst, src in narrow:
                np.copyto(dst, src, casting="same_kind")

        return step
