"""DROPOUT: identity at inference; in training mode zeroes elements with probability `ratio`.

Attributes: ratio (0.5), training (0/1), seed (0). Training mode scales the kept elements
by 1 / (1 - ratio) and writes the scaled mask as output 1, so the gradient is g * mask.

The masks come from a counter-based generator (Philox keyed by `seed`), one stream per
step. Optional input 1 is the step counter, an int64 scalar the kernel advances in place:
a training model keeps it with its other state, so a checkpoint carries it and a resumed
run draws the same masks as an uninterrupted one, and a re-planned graph (another batch
size) continues the sequence instead of restarting it. Without that input the counter is
private to the planned kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode

_KEY_MASK = (1 << 64) - 1


def step_generator(seed: int, step: int) -> np.random.Generator:
    """The generator of step `step`: Philox keyed by the seed, its counter's second word at
    the step, so the steps' streams never overlap."""
    counter = np.array([0, step & _KEY_MASK, 0, 0], np.uint64)
    return np.random.Generator(np.random.Philox(key=seed & _KEY_MASK, counter=counter))


class Dropout(Kernel):
    op = OpCode.DROPOUT
    num_inputs = (1, 2)
    foldable = False  # random in training mode

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        self.ratio = attrs.float("ratio", 0.5)
        if not 0.0 <= self.ratio < 1.0:
            raise self.fail(f"ratio must be in [0, 1), got {self.ratio}")
        self.training = bool(attrs.int("training", 0))
        self.seed = attrs.int("seed", 0)
        state = self.optional_input(1)
        if state is not None and (state.dtype != np.int64 or state.size != 1):
            raise self.fail(
                f"input 1 (the step counter) must be one int64, got {state.dtype}"
                f"{list(state.shape)}"
            )
        # At inference (or ratio 0) the output is the input itself.
        self.is_view = not self.training or self.ratio == 0.0
        self.output_specs = [TensorSpec(x.shape, x.dtype), TensorSpec(x.shape, x.dtype)]

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = inputs[0]
        return [x, np.ones_like(x)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, y = inputs[0], outputs[0]
        mask = outputs[1] if len(outputs) > 1 else np.empty_like(y)
        state = inputs[1] if len(inputs) > 1 else None
        if state is None or not state.flags.writeable:  # a read-only file constant
            state = np.zeros((), np.int64) if state is None else state.copy()
        step = state.reshape(())
        uniform = np.empty(y.shape, np.float32 if y.dtype == np.float32 else np.float64)
        keep, scale, seed = self.ratio, 1.0 / (1.0 - self.ratio), self.seed

        def compute() -> None:
            step_generator(seed, int(step)).random(out=uniform, dtype=uniform.dtype)
            step[...] += 1
            np.greater_equal(uniform, keep, out=mask, casting="unsafe")
            np.multiply(mask, scale, out=mask)
            np.multiply(x, mask, out=y)

        return compute
