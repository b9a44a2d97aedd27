"""Shape inference: every tensor gets the shape and dtype the runtime's kernels infer."""

from __future__ import annotations

from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.graph import Model


def infer_shapes(model: Model) -> int:
    """Store inferred shapes on all non-constant tensors (dynamic dims as -1); returns the
    number of tensors whose shape or dtype changed."""
    before = [(t.shape, t.dtype) for t in model.tensors]
    for gi in range(len(model.graphs)):
        fill_inferred_shapes(model, gi)
    return sum(1 for t, old in zip(model.tensors, before, strict=True) if (t.shape, t.dtype) != old)
