"""Post-training quantization of .spore models: static int8/uint8 with calibration,
dynamic-range int8 weights, float16 weights; and the per-tensor error report."""

from sporenet.converter.errors import CalibrationError
from sporenet.converter.quantize.api import (
    Mode,
    QuantizationResult,
    calibrate,
    quantize_model,
)
from sporenet.converter.quantize.calibration import check_calibration, load_calibration
from sporenet.converter.quantize.observers import Method
from sporenet.converter.quantize.report import QuantizationReport, TensorError

__all__ = [
    "CalibrationError",
    "Method",
    "Mode",
    "QuantizationReport",
    "QuantizationResult",
    "TensorError",
    "calibrate",
    "check_calibration",
    "load_calibration",
    "quantize_model",
]
