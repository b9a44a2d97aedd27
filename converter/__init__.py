"""sporenet.converter: ONNX models in, optimized .spore files out.

The ONNX entry points are imported on first use, so the IR graph passes
(`sporenet.converter.passes`), which need no `onnx`, can be used without it installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sporenet.converter.errors import ConversionError, InvalidOnnxError, UnsupportedOnnxOpError

if TYPE_CHECKING:
    from sporenet.converter.convert import ConversionReport, convert_onnx, convert_onnx_model
    from sporenet.converter.onnx_import.registry import supported_onnx_ops

_LAZY = {
    "ConversionReport": "sporenet.converter.convert",
    "convert_onnx": "sporenet.converter.convert",
    "convert_onnx_model": "sporenet.converter.convert",
    "supported_onnx_ops": "sporenet.converter.onnx_import.registry",
}
"""Public names that need `onnx`, and the module each comes from."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sporenet.converter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ConversionError",
    "ConversionReport",
    "InvalidOnnxError",
    "UnsupportedOnnxOpError",
    "convert_onnx",
    "convert_onnx_model",
    "supported_onnx_ops",
]
