"""Writing compressed models: pruned weights stored sparse, optionally int8 on top."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.cloud.errors import ExportError
from sporenet.cloud.export import export, to_inference_ir
from sporenet.cloud.module import Module
from sporenet.lite.errors import LiteError
from sporenet.lite.format import serialize
from sporenet.lite.graph import Model


def export_sparse(model: Module, path: str | os.PathLike, **options: Any) -> Model:
    """`cloud.export` with the pruned weights stored in the sparse BITMASK layout.

    Args:
        model: a (pruned) cloud model.
        path: where to write the .spore file.
        options: passed on to `cloud.export` (input_shape, labels, ...).
    Returns:
        The exported IR (dense in memory; the file holds the sparse form).
    Raises:
        ExportError: the model cannot be traced or written.
    """
    return export(model, path, sparsify=True, **options)


def sparse_int8(
    model: Module,
    calibration: np.ndarray,
    *,
    path: str | os.PathLike | None = None,
    input_shape: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    **options: Any,
) -> bytes:
    """A pruned model quantized to int8 by the converter (weights symmetric, so pruned
    zeros stay zero) and written with its sparse weights in the BITMASK layout.

    Args:
        model: a (pruned) cloud model.
        calibration: input samples (N, ...) for the activation ranges.
        path: also write the bytes there.
        input_shape, labels: as for `cloud.export`.
        options: passed on to `quantize_model` (mode, per_channel, method).
    Returns:
        The .spore bytes.
    Raises:
        ExportError: the model cannot be traced, quantized or written.
    """
    from sporenet.converter.errors import ConversionError
    from sporenet.converter.quantize import quantize_model

    ir = to_inference_ir(model, input_shape=input_shape, labels=labels)
    try:
        result = quantize_model(
            ir,
            calibration={"input": np.asarray(calibration, np.float32)},
            report=False,
            **{"mode": "int8", **options},
        )
        data = serialize(result.model, sparsify=True)
    except (ConversionError, LiteError) as exc:
        raise ExportError(f"could not quantize the pruned model: {exc}") from exc
    if path is not None:
        Path(path).write_bytes(data)
    return data
