"""DROPOUT: identity at inference; in training mode zeroes elements with probability `ratio`.

Attributes: ratio (0.5), training (0/1), seed (0). Training mode scales the kept elements
by 1 / (1 - ratio) and writes the scaled mask as output 1, so the gradient is g * mask.
The random generator is created once when the graph is planned (seeded) and advances
every step, so a run is reproducible for a given seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class Dropout(Kernel):
    op = OpCode.DROPOUT
    foldable = False  # random in training mode

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        self.ratio = attrs.float("ratio", 0.5)
        if not 0.0 <= self.ratio < 1.0:
            raise self.fail(f"ratio must be in [0, 1), got {self.ratio}")
        self.training = bool(attrs.int("training", 0))
        self.seed = attrs.int("seed", 0)
        # At inference (or ratio 0) the output is the input itself.
        self.is_view = not self.training or self.ratio == 0.0
        self.output_specs = [TensorSpec(x.shape, x.dtype), TensorSpec(x.shape, x.dtype)]

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = inputs[0]
        return [x, np.ones_like(x)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, y = inputs[0], outputs[0]
        mask = outputs[1] if len(outputs) > 1 else np.empty_like(y)
        rng = np.random.default_rng(self.seed)
        uniform = np.empty(y.shape, np.float32 if y.dtype == np.float32 else np.float64)
        keep, scale = self.ratio, 1.0 / (1.0 - self.ratio)

        def compute() -> None:
            rng.random(out=uniform, dtype=uniform.dtype)
            np.greater_equal(uniform, keep, out=mask, casting="unsafe")
            np.multiply(mask, scale, out=mask)
            np.multiply(x, mask, out=y)

        return compute
