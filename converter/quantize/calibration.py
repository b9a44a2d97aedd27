"""Calibration data: checked against the model's inputs, then run through the float model.

A calibration set maps every model input name to an array of samples along axis 0 (an
.npz file written with numpy.savez). The model's first axis is its batch axis: a dynamic
batch is fed in chunks, a fixed batch B in chunks of B (a trailing partial chunk is left
out). `probe` runs a copy of the model whose outputs are all of its activations, so one
run yields every intermediate tensor.
"""

from __future__ import annotations

import copy
import os
import zipfile
from collections.abc import Iterator, Mapping

import numpy as np

from sporenet.converter.errors import CalibrationError
from sporenet.lite.graph import DYNAMIC, Model
from sporenet.lite.interpreter import Interpreter

CHUNK = 16
"""Most samples per run when the batch axis is dynamic."""

CHUNK_BYTES = 64 << 20
"""Fewer samples per run when one sample's activations are large (all are kept at once)."""


def _chunk(model: Model) -> int:
    per_sample = sum(
        int(np.prod([d for d in t.shape if d != DYNAMIC], dtype=np.int64)) * t.dtype.itemsize
        for t in model.tensors
        if t.data is None
    )
    return int(max(1, min(CHUNK, CHUNK_BYTES // max(per_sample, 1))))


def load_calibration(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz calibration file by name (pickled objects are refused)."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise CalibrationError(
                f"calibration file {os.fspath(path)!r} is a single .npy "
                "array; expected an .npz with one array per input name"
            )
        with data:
            return {name: data[name] for name in data.files}
    except CalibrationError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CalibrationError(
            f"cannot read calibration file {os.fspath(path)!r}: {exc} "
            "(expected an .npz written by numpy.savez)"
        ) from None


def check_calibration(model: Model, data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every input present with the right dtype, rank, per-sample shape and >= 1 batch."""
    signature = model.signature("infer")
    expected = signature.inputs
    missing = sorted(set(expected) - set(data))
    unknown = sorted(set(data) - set(expected))
    if missing or unknown:
        raise CalibrationError(
            f"calibration data must have one array per model input {sorted(expected)}; "
            f"missing {missing}, unknown {unknown}"
        )
    checked: dict[str, np.ndarray] = {}
    counts = set()
    for name, index in expected.items():
        tensor = model.tensors[index]
        array = data[name]
        if not isinstance(array, np.ndarray):
            raise CalibrationError(
                f"calibration input {name!r}: expected a NumPy array, got {type(array).__name__}"
            )
        shape = tuple(tensor.shape)
        wanted = "(N, " + ", ".join("?" if d == DYNAMIC else str(d) for d in shape[1:]) + ")"
        if array.dtype != tensor.dtype:
            raise CalibrationError(
                f"calibration input {name!r}: expected dtype {tensor.dtype}, found {array.dtype}"
            )
        if not shape:
            raise CalibrationError(
                f"calibration input {name!r}: the model input is a scalar; "
                "calibration needs a batch axis"
            )
        if array.ndim != len(shape) or any(
            d != DYNAMIC and d != s for d, s in zip(shape[1:], array.shape[1:], strict=True)
        ):
            raise CalibrationError(
                f"calibration input {name!r}: expected samples of shape "
                f"{wanted} (samples on axis 0), found {list(array.shape)}"
            )
        batch = shape[0]
        need = 1 if batch == DYNAMIC else batch
        if array.shape[0] < need:
            raise CalibrationError(
                f"calibration input {name!r}: expected at least {need} "
                f"sample(s), found {array.shape[0]}"
            )
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise CalibrationError(f"calibration input {name!r}: contains NaN or infinity")
        counts.add(array.shape[0])
        checked[name] = array
    if len(counts) > 1:
        raise CalibrationError(
            "calibration inputs must have the same number of samples, got "
            + ", ".join(f"{k}: {v.shape[0]}" for k, v in checked.items())
        )
    return checked


def batches(
    model: Model, data: Mapping[str, np.ndarray], limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Feeds of the model's batch size over the calibration samples (up to `limit`)."""
    signature = model.signature("infer")
    first = next(iter(signature.inputs.values()))
    batch = model.tensors[first].shape[0]
    step = _chunk(model) if batch == DYNAMIC else batch
    total = min(next(iter(data.values())).shape[0], limit or np.iinfo(np.int64).max)
    for start in range(0, total - step + 1 if batch != DYNAMIC else total, step):
        yield {name: array[start : start + step] for name, array in data.items()}


def probe_model(model: Model, names: list[str] | None = None) -> Model:
    """A copy of `model` whose outputs are every tensor a node produces (or `names`),
    keyed by tensor name, besides its own outputs."""
    probe = copy.copy(model)
    probe.graphs = [copy.copy(g) for g in model.graphs]
    probe.signatures = {k: copy.copy(s) for k, s in model.signatures.items()}
    graph = probe.graphs[0]
    wanted = None if names is None else set(names)
    outputs = dict(probe.signature("infer").outputs)
    for node in graph.nodes:
        for i in node.outputs:
            if i != -1 and (wanted is None or model.tensors[i].name in wanted):
                outputs[model.tensors[i].name] = i
    graph.outputs = list(dict.fromkeys([*graph.outputs, *outputs.values()]))
    signature = probe.signature("infer")
    signature.outputs = outputs
    probe.signatures = {"infer": signature}
    return probe


def run_all(
    model: Model, data: Mapping[str, np.ndarray], limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Every activation of `model` (by tensor name) for each batch of calibration data."""
    interpreter = Interpreter(model=probe_model(model))
    for feeds in batches(model, data, limit):
        yield interpreter.run(feeds)
