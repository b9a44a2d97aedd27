"""Gradients of data-movement ops whose backward is a scatter: Slice, Pad, Gather.

Each takes the forward node's attributes (constant-input arguments are passed as
attributes by the gradient rule) and x, which lends its shape: SLICE_GRAD(g, x) writes g
into the sliced region of zeros; PAD_GRAD(g, x) crops the padding off g (constant mode);
GATHER_GRAD(g, indices, x) scatter-adds g at the gathered indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.pad import Pad
from sporenet.lite.kernels.transform import Slice
from sporenet.lite.ops import OpCode


def _check_grad(kernel: Kernel, g: TensorSpec, expected: tuple[int, ...]) -> None:
    if g.shape != tuple(expected):
        raise kernel.fail(
            f"gradient shape {list(g.shape)} differs from the forward output shape {list(expected)}"
        )


class SliceGrad(Kernel):
    op = OpCode.SLICE_GRAD
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x = self.require_float(0), self.input(1)
        # The forward kernel resolves starts/ends/axes/steps exactly as the Slice did.
        forward = Slice(Attrs("SLICE", attrs.values), [x])
        _check_grad(self, g, forward.output_specs[0].shape)
        self.index = forward.index
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, out = inputs[0], outputs[0]
        region = out[self.index]

        def compute() -> None:
            out.fill(0)
            np.copyto(region, g)

        return compute


class PadGrad(Kernel):
    op = OpCode.PAD_GRAD
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x = self.require_float(0), self.input(1)
        forward = Pad(Attrs("PAD", attrs.values), [x])
        if forward.mode != "constant":
            raise self.fail(f"only constant padding has a gradient here, got mode {forward.mode!r}")
        _check_grad(self, g, forward.output_specs[0].shape)
        # x[src] was copied to out[dst]; cropped parts of x (negative pads) get zero.
        self.src = tuple(
            slice(max(-b, 0), n - max(-e, 0))
            for n, b, e in zip(x.shape, forward.begin, forward.end, strict=True)
        )
        self.dst = tuple(
            slice(max(b, 0), max(b, 0) + (s.stop - s.start))
            for b, s in zip(forward.begin, self.src, strict=True)
        )
        self.cropped = any(b < 0 or e < 0 for b, e in zip(forward.begin, forward.end, strict=True))
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, out = inputs[0], outputs[0]
        region, source = out[self.src], g[self.dst]
        if not self.cropped:
            return lambda: np.copyto(out, source)

        def compute() -> None:
            out.fill(0)
            np.copyto(region, source)

        return compute


class GatherGrad(Kernel):
    op = OpCode.GATHER_GRAD
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, indices, x = self.require_float(0), self.input(1), self.input(2)
        if indices.dtype.kind not in "iu":
            raise self.fail(f"indices must be integers, got {indices.dtype}")
        self.axis = normalize_axis(self, attrs.int("axis", 0), x.rank)
        a = self.axis
        _check_grad(self, g, (*x.shape[:a], *indices.shape, *x.shape[a + 1 :]))
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, indices, out = inputs[0], inputs[1], outputs[0]
        lead = (slice(None),) * self.axis

        def compute() -> None:
            out.fill(0)
            np.add.at(out, (*lead, indices), g)

        return compute
