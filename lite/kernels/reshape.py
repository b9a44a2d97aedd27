"""Reshape, Flatten and Identity: view kernels that alias their input (no copy, no run step)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


def resolve_reshape(
    op: Kernel, in_shape: tuple[int, ...], target: Sequence[int], allow_zero: bool = False
) -> tuple[int, ...]:
    """ONNX/NumPy reshape target: 0 copies the input dim (unless allow_zero), one -1 is inferred."""
    dims = [int(d) for d in target]
    if not allow_zero:
        for i, d in enumerate(dims):
            if d == 0:
                if i >= len(in_shape):
                    raise op.fail(
                        f"target {dims}: 0 at axis {i} but the input has rank {len(in_shape)}"
                    )
                dims[i] = in_shape[i]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise op.fail(f"target shape {dims} may hold at most one -1 and no other negative")
    total = int(np.prod(in_shape, dtype=np.int64))
    known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
    if -1 in dims:
        if known == 0 or total % known:
            raise op.fail(f"cannot reshape {list(in_shape)} ({total} elements) to {dims}")
        dims[dims.index(-1)] = total // known
    elif known != total:
        raise op.fail(f"cannot reshape {list(in_shape)} ({total} elements) to {dims}")
    return tuple(dims)


class ViewKernel(Kernel):
    """Output 0 is input 0 viewed with a new shape."""

    is_view = True

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [inputs[0].reshape(self.output_specs[0].shape)]


class Reshape(ViewKernel):
    """Target shape from the `shape` attribute or a constant second input."""

    op = OpCode.RESHAPE
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if self.optional_input(1) is not None:
            target = [int(v) for v in np.ravel(self.constant(1, "shape"))]
        else:
            target = attrs.ints("shape")
            if target is None:
                raise self.fail("needs a `shape` attribute or a constant shape input")
        shape = resolve_reshape(self, x.shape, target, bool(attrs.int("allowzero", 0)))
        self.output_specs = [TensorSpec(shape, x.dtype)]


class Flatten(ViewKernel):
    """Collapse axes [0, axis) and [axis, rank) into two (ONNX Flatten)."""

    op = OpCode.FLATTEN

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        axis = attrs.int("axis", 1)
        if not -x.rank <= axis <= x.rank:
            raise self.fail(f"axis {axis} out of range for rank {x.rank}")
        if axis < 0:
            axis += x.rank
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis:], dtype=np.int64))
        self.output_specs = [TensorSpec((outer, inner), x.dtype)]


class Identity(ViewKernel):
    op = OpCode.IDENTITY

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]
