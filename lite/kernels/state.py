"""READ_VARIABLE: the value of a variable (a tensor ASSIGN writes) copied where it is read.

A variable's storage changes when a later ASSIGN runs; the copy keeps what was read, as
TFLite's READ_VARIABLE does, for readers that run after that ASSIGN. When no write to the
variable runs before the read's last reader, the planner makes the read a view of the
variable's storage instead (planner._read_views): one step less, same values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import raw
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


class ReadVariable(Kernel):
    """out = a copy of input 0, of its shape and dtype."""

    op = OpCode.READ_VARIABLE
    num_inputs = (1, 1)
    foldable = False  # a variable's value is known only when the graph runs

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        return lambda: raw.copyto(out, x)

    def read_in_place(self, view: bool) -> None:
        """Make the read a view of the variable, or a copy again (the planner checks that
        no write to the variable runs before the read's last reader)."""
        self.is_view = view

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [required(inputs, 0)]
