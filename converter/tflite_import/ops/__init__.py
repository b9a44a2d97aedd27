"""TFLite builtin operators onto IR nodes: one handler per op, in an explicit table.

A handler reads its TFLite operator (inputs, outputs, decoded builtin options), emits IR
nodes through the LayoutContext and records the IR tensor (and axis order) of every output.
Convolutions and pools run in NCHW; other ops keep their inputs' axis order.
"""

from __future__ import annotations

from sporenet.converter.tflite_import.ops import conv, elementwise, quantize, shape, variables
from sporenet.converter.tflite_import.ops.common import Handler
from sporenet.lite.ops import OpCode

HANDLERS: dict[str, Handler] = {
    # convolution, linear, pooling
    "CONV_2D": conv.conv_2d,
    "DEPTHWISE_CONV_2D": conv.depthwise_conv_2d,
    "FULLY_CONNECTED": conv.fully_connected,
    "TRANSPOSE_CONV": conv.transpose_conv,
    "AVERAGE_POOL_2D": conv.pool(OpCode.AVG_POOL2D),
    "MAX_POOL_2D": conv.pool(OpCode.MAX_POOL2D),
    # binary elementwise (NumPy broadcasting)
    "ADD": elementwise.binary(OpCode.ADD),
    "SUB": elementwise.binary(OpCode.SUB),
    "MUL": elementwise.binary(OpCode.MUL),
    "DIV": elementwise.binary(OpCode.DIV),
    "MAXIMUM": elementwise.binary(OpCode.MAXIMUM),
    "MINIMUM": elementwise.binary(OpCode.MINIMUM),
    # activations and unary
    "RELU": elementwise.unary(OpCode.RELU),
    "RELU6": elementwise.unary(OpCode.RELU6),
    "RELU_N1_TO_1": elementwise.relu_n1_to_1,
    "LOGISTIC": elementwise.unary(OpCode.SIGMOID),
    "TANH": elementwise.unary(OpCode.TANH),
    "HARD_SWISH": elementwise.unary(OpCode.HARD_SWISH),
    "LEAKY_RELU": elementwise.leaky_relu,
    "PRELU": elementwise.prelu,
    "ELU": elementwise.unary(OpCode.ELU),
    "GELU": elementwise.gelu,
    "EXP": elementwise.unary(OpCode.EXP),
    "LOG": elementwise.unary(OpCode.LOG),
    "SQRT": elementwise.unary(OpCode.SQRT),
    "RSQRT": elementwise.unary(OpCode.RSQRT),
    "NEG": elementwise.unary(OpCode.NEG),
    "ABS": elementwise.unary(OpCode.ABS),
    "SQUARE": elementwise.unary(OpCode.SQUARE),
    "FLOOR": elementwise.unary(OpCode.FLOOR),
    "CEIL": elementwise.unary(OpCode.CEIL),
    "SOFTMAX": elementwise.softmax,
    # shapes and data movement
    "RESHAPE": shape.reshape,
    "SQUEEZE": shape.squeeze,
    "TRANSPOSE": shape.transpose,
    "CONCATENATION": shape.concatenation,
    "PAD": shape.pad,
    "PADV2": shape.pad,
    "STRIDED_SLICE": shape.strided_slice,
    "SPLIT": shape.split,
    "SPLIT_V": shape.split_v,
    "EXPAND_DIMS": shape.expand_dims,
    "PACK": shape.pack,
    "UNPACK": shape.unpack,
    "GATHER": shape.gather,
    "CAST": shape.cast,
    "BATCH_MATMUL": shape.batch_matmul,
    "DEPTH_TO_SPACE": shape.space(OpCode.DEPTH_TO_SPACE),
    "SPACE_TO_DEPTH": shape.space(OpCode.SPACE_TO_DEPTH),
    "RESIZE_BILINEAR": shape.resize("linear"),
    "RESIZE_NEAREST_NEIGHBOR": shape.resize("nearest"),
    # reductions
    "MEAN": shape.reduce(OpCode.REDUCE_MEAN),
    "SUM": shape.reduce(OpCode.REDUCE_SUM),
    "REDUCE_MAX": shape.reduce(OpCode.REDUCE_MAX),
    "REDUCE_MIN": shape.reduce(OpCode.REDUCE_MIN),
    "REDUCE_PROD": shape.reduce(OpCode.REDUCE_PROD),
    # quantization
    "DEQUANTIZE": quantize.dequantize,
    "QUANTIZE": quantize.quantize,
    "DENSIFY": quantize.densify,
    # resource variables and their initialization
    "VAR_HANDLE": variables.var_handle,
    "READ_VARIABLE": variables.read_variable,
    "ASSIGN_VARIABLE": variables.assign_variable,
    "CALL_ONCE": variables.call_once,
}
