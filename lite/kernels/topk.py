"""TOPK (TFLite's TOPK_V2): the k largest values along the last axis, largest first,
ties broken by the lower index, with their int32 indices."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class TopK(Kernel):
    """inputs: x (rank >= 1), k (a constant scalar, 0 <= k <= the last axis)."""

    op = OpCode.TOPK
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.rank < 1 or x.dtype.kind not in "iuf":
            raise self.fail(
                f"x must be a numeric tensor of rank >= 1, got {x.dtype}{list(x.shape)}"
            )
        k = np.ravel(self.constant(1, "k"))
        if k.size != 1 or not 0 <= int(k[0]) <= x.shape[-1]:
            raise self.fail(f"k must be one value in 0..{x.shape[-1]}, got {k.tolist()}")
        self.k = int(k[0])
        shape = (*x.shape[:-1], self.k)
        self.output_specs = [TensorSpec(shape, x.dtype), TensorSpec(shape, np.dtype(np.int32))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x: np.ndarray = inputs[0]  # type: ignore[assignment]
        values, indices, k = outputs[0], outputs[1], self.k

        def compute() -> None:
            # A stable sort of the negated values keeps equal values in index order.
            order = np.argsort(-x if x.dtype.kind == "f" else ~x, axis=-1, kind="stable")
            top = order[..., :k]
            np.copyto(indices, top, casting="unsafe")
            np.copyto(values, np.take_along_axis(x, top, axis=-1))

        return compute
