"""sporenet.converter: ONNX and TFLite models in, optimized .spore files out.

The ONNX entry points are imported on first use, so the IR graph passes
(`sporenet.converter.passes`), which need no `onnx`, can be used without it installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sporenet.converter.errors import ConversionError, InvalidOnnxError, UnsupportedOnnxOpError

if TYPE_CHECKING:
    from sporenet.converter.convert import ConversionReport, convert_onnx, convert_onnx_model
    from sporenet.converter.convert_tflite import convert_tflite, convert_tflite_model
    from sporenet.converter.onnx_import.registry import supported_onnx_ops
    from sporenet.converter.tflite_import.importer import (
        UnsupportedTfliteOpError,
        supported_tflite_ops,
    )
    from sporenet.converter.tflite_import.reader import InvalidTfliteError

_LAZY = {
    "ConversionReport": "sporenet.converter.convert",
    "convert_onnx": "sporenet.converter.convert",
    "convert_onnx_model": "sporenet.converter.convert",
    "supported_onnx_ops": "sporenet.converter.onnx_import.registry",
    "convert_tflite": "sporenet.converter.convert_tflite",
    "convert_tflite_model": "sporenet.converter.convert_tflite",
    "UnsupportedTfliteOpError": "sporenet.converter.tflite_import.importer",
    "supported_tflite_ops": "sporenet.converter.tflite_import.importer",
    "InvalidTfliteError": "sporenet.converter.tflite_import.reader",
}
"""Public names imported on first use (the ONNX ones need `onnx`), and their modules."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sporenet.converter' has no attribute {name!r}")
    imported = importlib.import_module(module)
    # Importing a submodule binds its name here (`convert_tflite` is a module and a
    # function): every public name of that module is bound now, over the module.
    for public, home in _LAZY.items():
        if home == module:
            globals()[public] = getattr(imported, public)
    return globals()[name]


__all__ = [
    "ConversionError",
    "ConversionReport",
    "InvalidOnnxError",
    "InvalidTfliteError",
    "UnsupportedOnnxOpError",
    "UnsupportedTfliteOpError",
    "convert_onnx",
    "convert_onnx_model",
    "convert_tflite",
    "convert_tflite_model",
    "supported_onnx_ops",
    "supported_tflite_ops",
]
