"""sporenet.converter: ONNX and TFLite models in, optimized .spore files out."""

from sporenet.converter.convert import ConversionReport, convert_onnx, convert_onnx_model
from sporenet.converter.convert_tflite import convert_tflite, convert_tflite_model
from sporenet.converter.errors import ConversionError, InvalidOnnxError, UnsupportedOnnxOpError
from sporenet.converter.onnx_import.registry import supported_onnx_ops
from sporenet.converter.tflite_import.importer import (
    UnsupportedTfliteOpError,
    supported_tflite_ops,
)
from sporenet.converter.tflite_import.reader import InvalidTfliteError

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
