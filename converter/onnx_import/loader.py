"""Reading an ONNX model from a path, bytes or a ModelProto, with clear errors.

Every failure to obtain a well-formed ModelProto (not ONNX at all, a truncated protobuf,
external-data files that are missing) becomes one InvalidOnnxError naming the problem.

A file is memory-mapped and its large tensors are read in place (in_place.py): the
parsed message holds the model without them, and the import reads them as views of the
mapping (so an IR from convert_onnx_model reads the file while it lives: replace a model
file by writing a new one and renaming it, not by rewriting it in place). External-data
files (every layout the onnx package writes: all tensors or some outside, one file or
several, at offsets with lengths or to the end of a file) are mapped the same way, each
checked to lie in the model's directory and to hold the spans its tensors name.

The ONNX checker is not run on the way: its operator registry alone costs more memory
than a small model, and the import checks what it relies on (names defined before use
and once, opsets, initializer sizes, the inputs and attributes each op handler reads).
When an import fails, `explain_invalid` asks the checker whether the model is invalid
ONNX, so such a model is still reported as the checker words it.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from sporenet.converter.errors import InvalidOnnxError
from sporenet.converter.onnx_import.in_place import (
    IN_PLACE,
    TensorBytes,
    WireError,
    external_ref,
    in_place_span,
    split_in_place,
)

OnnxSource = str | os.PathLike | bytes | bytearray | memoryview | onnx.ModelProto


def _describe_non_onnx(data: bytes | memoryview) -> str:
    if data[4:8] == b"SPOR":
        return "it is a sporenet .spore model, not ONNX"
    if data[:1] in (b"{", b"[") or data[:5] == b"<?xml":
        return "it is a text file (JSON or XML), not an ONNX protobuf"
    if not data:
        return "it is empty"
    return "it does not parse as an ONNX ModelProto"


def _parse(
    data: bytes | memoryview, where: str, original: memoryview | None = None
) -> onnx.ModelProto:
    """Parse `data` (the model, or `original` with its tensors read in place)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        hint = _describe_non_onnx(original if original is not None else data)
        if hint == "it does not parse as an ONNX ModelProto":
            hint = f"the protobuf is truncated or corrupt ({exc})"
        raise InvalidOnnxError(f"{where}: not a valid ONNX model: {hint}") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        hint = _describe_non_onnx(original if original is not None else data)
        raise InvalidOnnxError(f"{where}: not a valid ONNX model: {hint}")
    return model


def _parse_in_place(data: memoryview, where: str) -> tuple[onnx.ModelProto, memoryview | None]:
    """The model in `data`, its large tensors read in place when the layout allows (then
    `data` is returned too: their values are views of it)."""
    try:
        stripped = split_in_place(data)
    except WireError:
        stripped = None  # not the layout ONNX writes: parsed whole, which says what is wrong
    if stripped is None:
        return _parse(data, where), None
    return _parse(stripped, where, data), data


def _map(path: Path, where: str) -> memoryview:
    """The file's bytes, memory-mapped (read-only): pages are read when they are used."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return memoryview(b"")
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except OSError as exc:
        raise InvalidOnnxError(f"{where}: cannot read: {exc.strerror}") from None


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t) and in_place_span(t) is None
    ]


def _map_external(model: onnx.ModelProto, base_dir: Path | None, where: str) -> TensorBytes:
    """Every external-data file the model's tensors name, memory-mapped (read-only), after
    checking each lies in the model's directory and holds the spans read from it: the
    import reads those tensors as views of the mappings, as it reads the model's own."""
    tensors = _external_tensors(model)
    if not tensors:
        return {}
    if base_dir is None:
        raise InvalidOnnxError(
            f"{where}: {len(tensors)} initializer(s) keep their data in external files, "
            "which cannot be found from in-memory bytes; pass the model's path instead"
        )
    missing: dict[str, list[str]] = {}
    files: dict[str, memoryview] = {}
    for t in tensors:
        try:
            ref = external_ref(t)
        except ValueError as exc:
            raise InvalidOnnxError(f"{where}: initializer {t.name!r}: {exc}") from None
        if ref is None:
            continue
        location, offset, length = ref
        resolved = (base_dir / location).resolve()
        inside = base_dir.resolve() in resolved.parents
        if not location or Path(location).is_absolute() or not inside:
            raise InvalidOnnxError(
                f"{where}: initializer {t.name!r} points at external file {location!r} "
                "outside the model's directory"
            )
        if location not in files:
            if not resolved.is_file():
                missing.setdefault(location, []).append(t.name)
                continue
            files[location] = _map(resolved, f"{where}: external file {location!r}")
        size = len(files[location])
        end = offset + (length or 0)
        if end > size or offset > size:
            raise InvalidOnnxError(
                f"{where}: initializer {t.name!r} needs bytes up to {max(end, offset)} of "
                f"external file {location!r}, which holds only {size} (truncated?)"
            )
    if missing:
        listed = "; ".join(
            f"{loc!r} (for {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for loc, names in sorted(missing.items())
        )
        raise InvalidOnnxError(
            f"{where}: missing external-data file(s) next to the model in {base_dir}: {listed}"
        )
    return files


@dataclass(frozen=True)
class LoadedOnnx:
    """A parsed model, and the bytes its in-place tensors are views of (None if none)."""

    model: onnx.ModelProto
    data: TensorBytes  # location -> bytes of the external tensors (IN_PLACE: the model's)
    where: str  # how messages name the source
    source_bytes: int  # the model's size, its external-data files included

    def release_pages(self) -> None:
        """Let the kernel drop the mapped files' pages read so far (release_pages)."""
        release_pages(self.data)


def release_pages(data: TensorBytes) -> None:
    """Let the kernel drop the pages of the mapped files in `data` read so far (the
    scan's, those of weights a pass replaced, those already copied out): they are clean,
    and read again if a view is used, so memory holds only the weights still being
    written out."""
    for view in data.values():
        mapped = view.obj
        if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            mapped.madvise(mmap.MADV_DONTNEED)


def load_onnx(source: OnnxSource) -> LoadedOnnx:
    """The model behind `source` (a path, serialized bytes or a ModelProto), its external
    data files mapped; not run through the ONNX checker (see the module docstring)."""
    own: memoryview | None = None
    if isinstance(source, onnx.ModelProto):
        model, where, base, size = source, "model", None, source.ByteSize()
    elif isinstance(source, bytes | bytearray | memoryview):
        where, base = "model bytes", None
        # Views of immutable bytes are safe to keep; a mutable buffer is copied first.
        view = memoryview(source if isinstance(source, bytes) else bytes(source))
        model, own = _parse_in_place(view, where)
        size = view.nbytes
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise InvalidOnnxError(f"{where}: no such file")
        mapped = _map(path, where)
        model, own = _parse_in_place(mapped, where)
        base, size = path.parent, mapped.nbytes
    else:
        raise TypeError(
            f"model must be a path, bytes or onnx.ModelProto, got {type(source).__name__}"
        )
    files = _map_external(model, base, where)
    data = dict(files)
    if own is not None:
        data[IN_PLACE] = own
    size += sum(view.nbytes for view in files.values())
    loaded = LoadedOnnx(model, data, where, size)
    loaded.release_pages()
    return loaded


def explain_invalid(source: OnnxSource) -> str | None:
    """The ONNX checker's objection to the model at `source` (its first line), or None
    when the checker accepts it. Used after an import fails, so an invalid model is named
    so; it reads the model again, in the checker's own way."""
    target = source
    if isinstance(source, str | os.PathLike):
        target = os.fspath(source)
    elif isinstance(source, bytearray | memoryview):
        target = bytes(source)
    try:
        onnx.checker.check_model(target)  # type: ignore[arg-type]
    except onnx.checker.ValidationError as exc:
        text = " ".join(str(exc).split())
        return text[:300] if text else "invalid model"
    except Exception:  # unreadable for the checker: the import's own error stands
        return None
    return None
