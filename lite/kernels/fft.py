"""Signal ops of TFLite's audio front ends: RFFT2D and the parts of its complex result.

RFFT2D is NumPy's 2-D real FFT over the last two axes (computed in float64, stored as
complex64), the input cropped or zero-padded at the end of each axis to fft_length, as
TFLite's RFFT2D does. COMPLEX_PART gives the real part, the imaginary part or the
magnitude as float32 (TFLite's REAL, IMAG, COMPLEX_ABS, and CAST of complex to float).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import REQUIRED, Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode

PARTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "real": np.real,
    "imag": np.imag,
    "abs": np.abs,
}


class Rfft2d(Kernel):
    """inputs: x (float32, rank >= 2), fft_length (two positive constants)."""

    op = OpCode.RFFT2D
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank < 2:
            raise self.fail(f"input must have rank >= 2, got shape {list(x.shape)}")
        length = [int(v) for v in np.ravel(self.constant(1, "fft_length"))]
        if len(length) != 2 or min(length) < 1 or max(length) > 1 << 20:
            raise self.fail(f"fft_length must be two sizes in 1..2^20, got {length}")
        self.length = tuple(length)
        shape = (*x.shape[:-2], length[0], length[1] // 2 + 1)
        self.output_specs = [TensorSpec(shape, np.dtype(np.complex64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, length = required(inputs, 0), outputs[0], self.length

        def compute() -> None:
            np.copyto(out, np.fft.rfft2(x, s=length, axes=(-2, -1)), casting="same_kind")

        return compute


class ComplexPart(Kernel):
    """out = real(x), imag(x) or abs(x) as float32; attribute part."""

    op = OpCode.COMPLEX_PART

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype != np.complex64:
            raise self.fail(f"input must be complex64, got {x.dtype}")
        self.part = attrs.str("part", REQUIRED)
        if self.part not in PARTS:
            raise self.fail(f"part must be one of {sorted(PARTS)}, got {self.part!r}")
        self.output_specs = [TensorSpec(x.shape, np.dtype(np.float32))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        out, f, part = outputs[0], PARTS[self.part], self.part

        def compute() -> None:
            if part == "abs":
                np.abs(x, out=out)
            else:
                np.copyto(out, f(x))

        return compute
