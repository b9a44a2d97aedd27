"""Reading and replacing a model's weights by name: what federated clients and servers exchange."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.format import Source, load, serialize
from sporenet.lite.graph import Model


def read_weights(source: Source | Model, *, trainable_only: bool = False) -> dict[str, np.ndarray]:
    """Float constant tensors of a model by name, in tensor-table order (read-only views).

    With `trainable_only`, only tensors flagged trainable are returned; a model with no
    trainable flags at all returns every float constant (all of it is trainable).
    """
    model = load(source)
    floats = [t for t in model.tensors if t.data is not None and t.dtype.kind == "f"]
    if trainable_only and any(t.trainable for t in floats):
        floats = [t for t in floats if t.trainable]
    return {t.name: t.data for t in floats}  # type: ignore[misc]


def replace_weights(source: Source | Model, weights: dict[str, np.ndarray]) -> Model:
    """A copy of the model whose named constant tensors hold `weights` (names, shapes and
    dtypes must match the existing tensors exactly)."""
    model = load(source)
    return _with_data(model, _replacements(model, weights))


def replace_weights_bytes(source: Source | Model, weights: dict[str, np.ndarray]) -> bytes:
    """The .spore bytes of `replace_weights(source, weights)`.

    From a model's bytes (or file), the new data are written over the old at the same
    offsets: the structure stays the source's, byte for byte, and nothing is serialized
    again. A federated server does this every round; at a million parameters it costs
    about a fifth of a new serialization. A Model, or bytes with a tensor that is not a
    view of its own into them (copied by the parser from a misaligned buffer, or sharing
    bytes with another tensor), are serialized anew.
    """
    if isinstance(source, Model):
        return serialize(replace_weights(source, weights))
    buf = memoryview(
        Path(source).read_bytes() if isinstance(source, str | os.PathLike) else source
    ).cast("B")
    model = load(buf)
    new = _replacements(model, weights)
    spliced = _spliced(buf, model, new)
    return spliced if spliced is not None else serialize(_with_data(model, new))


def _replacements(model: Model, weights: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Tensor index -> new value for each of `weights`, checked against the tensor it
    replaces (InputError naming what was expected and found)."""
    by_name = {t.name: i for i, t in enumerate(model.tensors) if t.data is not None}
    unknown = sorted(set(weights) - set(by_name))
    if unknown:
        raise InputError(f"unknown weight tensors {unknown}; the model has {sorted(by_name)}")
    new = {}
    for name, value in weights.items():
        old = model.tensors[by_name[name]]
        value = np.asarray(value)
        if value.shape != tuple(old.shape) or value.dtype != old.dtype:
            raise InputError(
                f"weight {name!r}: expected {old.dtype}{list(old.shape)}, got "
                f"{value.dtype}{list(value.shape)}"
            )
        new[by_name[name]] = value
    return new


def _with_data(model: Model, new: dict[int, np.ndarray]) -> Model:
    """A copy of `model` whose tensors at the indices of `new` hold those values."""
    tensors = list(model.tensors)
    for i, value in new.items():
        tensors[i] = dataclasses.replace(tensors[i], data=value)
    return dataclasses.replace(model, tensors=tensors)


def _spliced(buf: memoryview, model: Model, new: dict[int, np.ndarray]) -> bytes | None:
    """`buf` with the data of the tensors in `new` replaced in place, or None when one of
    them is not a view into `buf` of its own (the parser copied it, or its bytes are
    shared with another tensor)."""
    spans: list[tuple[int, int, int]] = []  # (start, end, tensor index) in `buf`
    for i, t in enumerate(model.tensors):
        if t.data is None or not t.data.nbytes:
            continue
        at = _offset_in(buf, t.data)
        if at is not None:
            spans.append((at, at + t.data.nbytes, i))
        elif i in new:
            return None
    spans.sort()
    pieces: list[bytes | memoryview] = []
    pos = reach = 0  # end of the last piece taken; furthest end of the spans so far
    for k, (start, end, i) in enumerate(spans):
        if i in new:
            later = spans[k + 1][0] if k + 1 < len(spans) else len(buf)
            if reach > start or later < end:  # shares bytes with another tensor
                return None
            pieces += [buf[pos:start], memoryview(np.ascontiguousarray(new[i])).cast("B")]
            pos = end
        reach = max(reach, end)
    pieces.append(buf[pos:])
    return b"".join(pieces)


class _TensorAt(NamedTuple):
    """One float constant of a parsed model: where its data lie in the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    count: int  # elements


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where a model's float constants lie, and every other byte of the model."""

    size: int
    tensors: tuple[_TensorAt, ...]
    gaps: tuple[tuple[int, int], ...]  # the byte ranges outside the tensors' data
    rest: bytes  # those bytes, in file order

    def rest_of(self, buf: memoryview) -> bytes:
        """The bytes of `buf` in this layout's gaps."""
        return b"".join(buf[start:end] for start, end in self.gaps)


class WeightsReader:
    """`read_weights` for a series of models that differ only in their weights, as the
    models of a federated job do from round to round.

    The first model is parsed and checked in full. A later one whose bytes outside the
    float tensors' data equal the last parsed model's has, byte for byte, the same
    structure, so its tensors lie at the same offsets: they are returned as read-only
    views without parsing it again (a model's parse costs far more than the comparison).
    Any other model is parsed and checked in full, and becomes the reference.

    With `trainable_only`, it reads what `read_weights(..., trainable_only=True)` does (the
    weights a federated job trains; the other constants count as structure).
    """

    def __init__(self, *, trainable_only: bool = False) -> None:
        self.trainable_only = trainable_only
        self._layout: _Layout | None = None
        self.full_parses = 0  # models parsed in full, for the curious and for tests

    def read(self, data: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
        """Float constant tensors of the model in `data` by name (read-only views)."""
        buf = memoryview(data).cast("B")
        layout = self._layout
        if layout is not None and layout.size == len(buf) and layout.rest_of(buf) == layout.rest:
            weights = {}
            for t in layout.tensors:
                view = np.frombuffer(buf, t.dtype, t.count, t.offset).reshape(t.shape)
                view.flags.writeable = False
                weights[t.name] = view
            return weights
        weights = read_weights(buf, trainable_only=self.trainable_only)
        self.full_parses += 1
        self._layout = _layout_of(buf, weights)
        return weights


def _layout_of(buf: memoryview, weights: dict[str, np.ndarray]) -> _Layout | None:
    """The layout of a parsed model, or None when a tensor is not a view into `buf`
    (a misaligned buffer is copied by the parser: then every model is parsed)."""
    tensors = []
    for name, array in weights.items():
        at = _offset_in(buf, array)
        if at is None:
            return None
        tensors.append(_TensorAt(name, array.dtype, tuple(array.shape), at, array.size))
    gaps, pos = [], 0
    for t in sorted(tensors, key=lambda t: t.offset):
        gaps.append((pos, max(pos, t.offset)))
        pos = max(pos, t.offset + t.count * t.dtype.itemsize)
    gaps.append((pos, len(buf)))
    layout = _Layout(len(buf), tuple(tensors), tuple(gaps), b"")
    return dataclasses.replace(layout, rest=layout.rest_of(buf))


def _offset_in(buf: memoryview, array: np.ndarray) -> int | None:
    """Where `array`'s data start in `buf`, if it is a contiguous view of `buf`'s bytes."""
    base = np.frombuffer(buf, np.uint8).ctypes.data if len(buf) else 0
    at = array.ctypes.data - base
    inside = at >= 0 and at + array.nbytes <= len(buf) and array.flags.c_contiguous
    return at if inside else None
