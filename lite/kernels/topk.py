"""TOP_K (ONNX TopK): the k largest or smallest entries along an axis and their indices;
equal values keep the lower index first. k is planned when the model loads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class TopK(Kernel):
    """inputs x[, k (one int64, read when the graph is planned)]; attributes k (when the
    input is absent), axis (default -1), largest (1), sorted (1)."""

    op = OpCode.TOP_K
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.rank == 0 or x.dtype.kind not in "iuf":
            raise self.fail(
                f"x must be a numeric tensor of rank >= 1, got {x.dtype}{list(x.shape)}"
            )
        self.axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        if self.optional_input(1) is not None:
            k_value = np.ravel(self.constant(1, "k"))
            if k_value.size != 1:
                raise self.fail(f"k must hold one value, got {k_value.size}")
            self.k = int(k_value[0])
        else:
            self.k = attrs.int("k")
        if self.k is None or not 0 <= self.k <= x.shape[self.axis]:
            raise self.fail(f"k must lie in [0, {x.shape[self.axis]}], got {self.k}")
        self.largest = bool(attrs.int("largest", 1))
        shape = list(x.shape)
        shape[self.axis] = self.k
        self.output_specs = [
            TensorSpec(tuple(shape), x.dtype),
            TensorSpec(tuple(shape), np.dtype(np.int64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = cast(np.ndarray, inputs[0])  # a required input, checked when prepared
        values, indices = outputs
        axis, k, largest = self.axis, self.k, self.largest

        def compute() -> None:
            # A stable sort of -x (largest) keeps equal values in index order; unsigned
            # values are flipped through their maximum instead of negated.
            if not largest:
                key = x
            elif x.dtype.kind == "u":
                key = np.iinfo(x.dtype).max - x
            else:
                key = -x
            order = np.argsort(key, axis=axis, kind="stable")
            top = np.take(order, np.arange(k), axis=axis)
            indices[...] = top
            values[...] = np.take_along_axis(x, top, axis=axis)

        return compute
