"""sporenet.converter: ONNX models in, optimized .spore files out."""

from sporenet.converter.convert import ConversionReport, convert_onnx, convert_onnx_model
from sporenet.converter.errors import ConversionError, InvalidOnnxError, UnsupportedOnnxOpError
from sporenet.converter.onnx_import.registry import supported_onnx_ops

__all__ = [
    "ConversionError",
    "ConversionReport",
    "InvalidOnnxError",
    "UnsupportedOnnxOpError",
    "convert_onnx",
    "convert_onnx_model",
    "supported_onnx_ops",
]
