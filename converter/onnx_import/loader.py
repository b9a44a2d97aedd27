"""Reading an ONNX model from a path, bytes or a ModelProto, with clear errors.

Every failure to obtain a well-formed ModelProto (not ONNX at all, a truncated protobuf,
external-data files that are missing) becomes one InvalidOnnxError naming the problem.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from sporenet.converter.errors import InvalidOnnxError

OnnxSource = str | os.PathLike | bytes | bytearray | memoryview | onnx.ModelProto


def _describe_non_onnx(data: bytes) -> str:
    if data[4:8] == b"SPOR":
        return "it is a sporenet .spore model, not ONNX"
    if data[:1] in (b"{", b"[") or data[:5] == b"<?xml":
        return "it is a text file (JSON or XML), not an ONNX protobuf"
    if not data:
        return "it is empty"
    return "it does not parse as an ONNX ModelProto"


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        hint = _describe_non_onnx(data)
        if hint == "it does not parse as an ONNX ModelProto":
            hint = f"the protobuf is truncated or corrupt ({exc})"
        raise InvalidOnnxError(f"{where}: not a valid ONNX model: {hint}") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise InvalidOnnxError(f"{where}: not a valid ONNX model: {_describe_non_onnx(data)}")
    return model


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t)
    ]


def _load_external(model: onnx.ModelProto, base_dir: Path | None, where: str) -> None:
    tensors = _external_tensors(model)
    if not tensors:
        return
    if base_dir is None:
        raise InvalidOnnxError(
            f"{where}: {len(tensors)} initializer(s) keep their data in external files, "
            "which cannot be found from in-memory bytes; pass the model's path instead"
        )
    missing: dict[str, list[str]] = {}
    for t in tensors:
        info = external_data_helper.ExternalDataInfo(t)
        location = Path(info.location)
        resolved = (base_dir / location).resolve()
        if location.is_absolute() or base_dir.resolve() not in resolved.parents:
            raise InvalidOnnxError(
                f"{where}: initializer {t.name!r} points at external file {info.location!r} "
                "outside the model's directory"
            )
        if not resolved.is_file():
            missing.setdefault(info.location, []).append(t.name)
            continue
        size = resolved.stat().st_size
        end = (info.offset or 0) + (info.length or 0)
        if end > size:
            raise InvalidOnnxError(
                f"{where}: initializer {t.name!r} needs bytes up to {end} of external file "
                f"{info.location!r}, which holds only {size} (truncated?)"
            )
    if missing:
        listed = "; ".join(
            f"{loc!r} (for {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for loc, names in sorted(missing.items())
        )
        raise InvalidOnnxError(
            f"{where}: missing external-data file(s) next to the model in {base_dir}: {listed}"
        )
    try:
        external_data_helper.load_external_data_for_model(model, str(base_dir))
    except (OSError, ValueError) as exc:
        raise InvalidOnnxError(f"{where}: cannot read external data: {exc}") from None


def _checked_on_disk(path: Path) -> bool:
    """Whether the ONNX checker accepts the file at `path`, read by the checker itself.

    Run before the model is read here: given a ModelProto, the checker serializes it into
    one more copy and parses that, which would hold three copies of the weights at once.
    Any failure returns False, and the model is then read and checked in memory, where the
    error is reported with the loader's own messages (external data, truncation).
    """
    try:
        onnx.checker.check_model(os.fspath(path))
    except Exception:  # any failure: re-checked in memory, which reports it clearly
        return False
    return True


def load_onnx(source: OnnxSource) -> onnx.ModelProto:
    """The ModelProto behind `source` (a path, serialized bytes or a ModelProto), checked."""
    checked = False
    if isinstance(source, onnx.ModelProto):
        model, where, base = source, "model", None
        if _external_tensors(model):
            model = onnx.ModelProto()
            model.CopyFrom(source)
    elif isinstance(source, bytes | bytearray | memoryview):
        model, where, base = _parse(bytes(source), "model bytes"), "model bytes", None
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise InvalidOnnxError(f"{where}: no such file")
        checked = _checked_on_disk(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidOnnxError(f"{where}: cannot read: {exc.strerror}") from None
        model, base = _parse(data, where), path.parent
        del data  # the parsed model holds its own copy: two at once would double the peak
    else:
        raise TypeError(
            f"model must be a path, bytes or onnx.ModelProto, got {type(source).__name__}"
        )
    external = bool(_external_tensors(model))
    _load_external(model, base, where)
    if checked and not external:
        return model
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise InvalidOnnxError(f"{where}: the ONNX checker rejects the model: {first}") from None
    return model
