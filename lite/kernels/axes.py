"""Prepare-time helpers shared by axis-taking kernels: axis normalization and int arguments
that come either as an attribute or as a constant input (ONNX moved several from one to
the other: Squeeze's axes, Slice's starts/ends, Split's sizes, Reduce*'s axes)."""

from __future__ import annotations

from collections.abc import Sequence

from sporenet.lite.kernels.base import Kernel


def normalize_axis(kernel: Kernel, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) as a non-negative index; out of range is a ShapeError."""
    if not -rank <= axis < rank:
        raise kernel.fail(
            f"{what} {axis} is out of range for rank {rank} (expected {-rank}..{rank - 1})"
        )
    return axis + rank if axis < 0 else axis


def normalize_axes(kernel: Kernel, axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Each axis normalized; duplicates are a ShapeError."""
    result = [normalize_axis(kernel, a, rank, f"{what} entry") for a in axes]
    if len(set(result)) != len(result):
        raise kernel.fail(f"{what} {list(axes)} name the same axis twice")
    return result


def ints_arg(kernel: Kernel, index: int, name: str) -> list[int] | None:
    """A list of ints from constant input `index` if present, else from attribute `name`.

    None when neither is given. A non-constant input is a ShapeError: shapes are planned
    when the model loads.
    """
    spec = kernel.optional_input(index)
    if spec is None:
        return kernel.attrs.ints(name)
    value = kernel.constant(index, name)
    if value.dtype.kind not in "iu":
        raise kernel.fail(f"input {index} ({name}) must hold integers, got {value.dtype}")
    if value.ndim > 1:
        raise kernel.fail(f"input {index} ({name}) must be 1-D, got shape {list(value.shape)}")
    return [int(v) for v in value.ravel()]
