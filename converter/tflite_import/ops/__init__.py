"""TFLite builtin operators onto IR nodes: one handler per op, in an explicit table.

A handler reads its TFLite operator (inputs, outputs, decoded builtin options), emits IR
nodes through the LayoutContext and records the IR tensor (and axis order) of every output.
Convolutions and pools run in NCHW; other ops keep their inputs' axis order. Each entry
declares the IR ops its handler may emit (`emits`; tests check the graphs against it), and
an op is offered only when the runtime has a kernel for each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sporenet.converter.tflite_import.ops import (
    control_flow,
    conv,
    custom,
    elementwise,
    logic,
    math,
    more,
    quantize,
    recurrent,
    shape,
    variables,
)
from sporenet.converter.tflite_import.ops.common import Handler
from sporenet.lite.ops import OpCode


@dataclass(frozen=True)
class Entry:
    """A TFLite op's handler and the IR ops it may emit (besides the TRANSPOSE, RESHAPE
    and CAST that moving a tensor between axis orders or widening float16 may need)."""

    convert: Handler
    emits: tuple[OpCode, ...] = ()


def _e(convert: Handler, *emits: OpCode) -> Entry:
    return Entry(convert, emits)


LAYOUT = (OpCode.TRANSPOSE, OpCode.RESHAPE, OpCode.CAST)
"""What LayoutContext.get may add to any handler's nodes."""

_O = OpCode
_FUSED = (_O.RELU, _O.RELU6, _O.TANH, _O.CLIP)  # float fused activations as nodes
_SHAPE_ARITHMETIC = (_O.SHAPE, _O.GATHER, _O.EXPAND)
_RECURRENT = (_O.READ_VARIABLE, _O.ASSIGN, _O.RESHAPE, _O.SQUEEZE)

HANDLERS: dict[str, Entry] = {
    # convolution, linear, pooling
    "CONV_2D": _e(conv.conv_2d, _O.CONV2D),  # fused activations as attributes
    "DEPTHWISE_CONV_2D": _e(conv.depthwise_conv_2d, _O.CONV2D),
    "FULLY_CONNECTED": _e(conv.fully_connected, _O.FULLY_CONNECTED),
    "TRANSPOSE_CONV": _e(conv.transpose_conv, _O.CONV2D_BACKPROP_INPUT, _O.ADD, *_FUSED),
    "AVERAGE_POOL_2D": _e(conv.pool(_O.AVG_POOL2D), _O.AVG_POOL2D, *_FUSED),
    "MAX_POOL_2D": _e(conv.pool(_O.MAX_POOL2D), _O.MAX_POOL2D, *_FUSED),
    "L2_POOL_2D": _e(more.l2_pool_2d, _O.MUL, _O.AVG_POOL2D, _O.SQRT, *_FUSED),
    # binary elementwise (NumPy broadcasting)
    "ADD": _e(elementwise.binary(_O.ADD), _O.ADD, *_FUSED),
    "SUB": _e(elementwise.binary(_O.SUB), _O.SUB, *_FUSED),
    "MUL": _e(elementwise.binary(_O.MUL), _O.MUL, *_FUSED),
    "DIV": _e(elementwise.binary(_O.DIV), _O.DIV, *_FUSED),
    "MAXIMUM": _e(elementwise.binary(_O.MAXIMUM), _O.MAXIMUM),
    "MINIMUM": _e(elementwise.binary(_O.MINIMUM), _O.MINIMUM),
    "POW": _e(elementwise.binary(_O.POW), _O.POW),
    "FLOOR_DIV": _e(elementwise.binary(_O.FLOOR_DIV), _O.FLOOR_DIV),
    "FLOOR_MOD": _e(elementwise.binary(_O.FLOOR_MOD), _O.FLOOR_MOD),
    "ATAN2": _e(elementwise.binary(_O.ATAN2), _O.ATAN2),
    "SQUARED_DIFFERENCE": _e(math.squared_difference, _O.SQUARED_DIFFERENCE),
    "ADD_N": _e(more.add_n, _O.ADD),
    # comparisons, logic, selection
    "EQUAL": _e(logic.compare(_O.EQUAL), _O.EQUAL),
    "NOT_EQUAL": _e(logic.compare(_O.EQUAL, negate=True), _O.EQUAL),
    "GREATER": _e(logic.compare(_O.GREATER), _O.GREATER),
    "GREATER_EQUAL": _e(
        logic.compare(_O.GREATER, or_equal=True), _O.GREATER, _O.LESS, _O.EQUAL, _O.MAXIMUM
    ),
    "LESS": _e(logic.compare(_O.LESS), _O.LESS),
    "LESS_EQUAL": _e(
        logic.compare(_O.LESS, or_equal=True), _O.LESS, _O.GREATER, _O.EQUAL, _O.MAXIMUM
    ),
    "LOGICAL_AND": _e(logic.logical(_O.MUL), _O.MUL),
    "LOGICAL_OR": _e(logic.logical(_O.MAXIMUM), _O.MAXIMUM),
    "LOGICAL_NOT": _e(logic.logical_not, _O.EQUAL),
    "SELECT": _e(logic.select, _O.WHERE),
    "SELECT_V2": _e(logic.select, _O.WHERE),
    # activations and unary
    "RELU": _e(elementwise.unary(_O.RELU), _O.RELU),
    "RELU6": _e(elementwise.unary(_O.RELU6), _O.RELU6),
    # clamps at the output's quantization (int8: requantized, as TFLite's ReluX)
    "RELU_N1_TO_1": _e(elementwise.unary(_O.CLIP, min=-1.0, max=1.0), _O.CLIP),
    "RELU_0_TO_1": _e(elementwise.unary(_O.CLIP, min=0.0, max=1.0), _O.CLIP),
    "LOGISTIC": _e(elementwise.unary(_O.SIGMOID), _O.SIGMOID),
    "TANH": _e(elementwise.unary(_O.TANH), _O.TANH),
    "HARD_SWISH": _e(elementwise.unary(_O.HARD_SWISH), _O.HARD_SWISH),
    "LEAKY_RELU": _e(elementwise.leaky_relu, _O.LEAKY_RELU),
    "PRELU": _e(elementwise.prelu, _O.PRELU),
    "ELU": _e(elementwise.unary(_O.ELU), _O.ELU),
    "GELU": _e(elementwise.gelu, _O.GELU),
    "EXP": _e(elementwise.unary(_O.EXP), _O.EXP),
    "LOG": _e(elementwise.unary(_O.LOG), _O.LOG),
    "SQRT": _e(elementwise.unary(_O.SQRT), _O.SQRT),
    "RSQRT": _e(elementwise.unary(_O.RSQRT), _O.RSQRT),
    "NEG": _e(elementwise.unary(_O.NEG), _O.NEG),
    "ABS": _e(elementwise.unary(_O.ABS), _O.ABS),
    "SQUARE": _e(elementwise.unary(_O.SQUARE), _O.SQUARE),
    "FLOOR": _e(elementwise.unary(_O.FLOOR), _O.FLOOR),
    "CEIL": _e(elementwise.unary(_O.CEIL), _O.CEIL),
    "SIN": _e(elementwise.unary(_O.SIN), _O.SIN),
    "COS": _e(elementwise.unary(_O.COS), _O.COS),
    "ROUND": _e(elementwise.unary(_O.ROUND), _O.ROUND),
    "SIGN": _e(elementwise.unary(_O.SIGN), _O.SIGN),
    # softmax and normalization
    "SOFTMAX": _e(elementwise.softmax, _O.SOFTMAX, _O.MUL),
    "LOG_SOFTMAX": _e(math.log_softmax, _O.LOG_SOFTMAX),
    "L2_NORMALIZATION": _e(
        math.l2_normalization,
        _O.MUL,
        _O.REDUCE_SUM,
        _O.SQRT,
        _O.MAXIMUM,
        _O.DIV,
        _O.L2_NORMALIZATION,
    ),
    "LOCAL_RESPONSE_NORMALIZATION": _e(math.local_response_normalization, _O.LRN),
    # shapes and data movement
    "SHAPE": _e(logic.shape, *_SHAPE_ARITHMETIC),
    "FILL": _e(logic.fill, _O.EXPAND),
    "ZEROS_LIKE": _e(logic.fill_like(0), _O.SHAPE, _O.EXPAND),
    "RANGE": _e(logic.range_, _O.RANGE),
    "RANK": _e(more.rank),
    "RESHAPE": _e(shape.reshape, _O.RESHAPE),
    "SQUEEZE": _e(shape.squeeze, _O.SQUEEZE),
    "TRANSPOSE": _e(shape.transpose),
    "CONCATENATION": _e(shape.concatenation, _O.CONCAT, *_FUSED),
    "PAD": _e(shape.pad, _O.PAD),
    "PADV2": _e(shape.pad, _O.PAD),
    "MIRROR_PAD": _e(math.mirror_pad, _O.PAD),
    "SLICE": _e(logic.slice_, _O.SLICE),
    "STRIDED_SLICE": _e(shape.strided_slice, _O.SLICE),
    "REVERSE_V2": _e(math.reverse_v2, _O.SLICE),
    "SPLIT": _e(shape.split, _O.SPLIT),
    "SPLIT_V": _e(shape.split_v, _O.SPLIT),
    "EXPAND_DIMS": _e(shape.expand_dims, _O.UNSQUEEZE),
    "PACK": _e(shape.pack, _O.UNSQUEEZE, _O.CONCAT),
    "UNPACK": _e(shape.unpack, _O.SPLIT, _O.SQUEEZE),
    "TILE": _e(math.tile, _O.TILE),
    "BROADCAST_TO": _e(math.broadcast_to, _O.EXPAND),
    "GATHER": _e(shape.gather, _O.GATHER),
    "GATHER_ND": _e(math.gather_nd, _O.GATHER_ND),
    "EMBEDDING_LOOKUP": _e(more.embedding_lookup, _O.GATHER),
    "SCATTER_ND": _e(more.scatter_nd, _O.SCATTER_ND),
    "TOPK_V2": _e(more.topk_v2, _O.TOP_K, _O.CAST),
    "SPACE_TO_BATCH_ND": _e(more.space_to_batch_nd, _O.PAD, _O.RESHAPE, _O.TRANSPOSE),
    "BATCH_TO_SPACE_ND": _e(more.batch_to_space_nd, _O.RESHAPE, _O.TRANSPOSE, _O.SLICE),
    "ONE_HOT": _e(math.one_hot, _O.ONE_HOT),
    "CUMSUM": _e(math.cumsum, _O.CUMSUM),
    "CAST": _e(shape.cast, _O.CAST, _O.COMPLEX_PART),
    "BATCH_MATMUL": _e(shape.batch_matmul, _O.MATMUL),
    "DEPTH_TO_SPACE": _e(shape.space(_O.DEPTH_TO_SPACE), _O.DEPTH_TO_SPACE),
    "SPACE_TO_DEPTH": _e(shape.space(_O.SPACE_TO_DEPTH), _O.SPACE_TO_DEPTH),
    "RESIZE_BILINEAR": _e(shape.resize("linear"), _O.RESIZE),
    "RESIZE_NEAREST_NEIGHBOR": _e(shape.resize("nearest"), _O.RESIZE),
    # signal
    "RFFT2D": _e(math.rfft2d, _O.RFFT2D),
    "REAL": _e(math.complex_part("real"), _O.COMPLEX_PART),
    "IMAG": _e(math.complex_part("imag"), _O.COMPLEX_PART),
    "COMPLEX_ABS": _e(math.complex_part("abs"), _O.COMPLEX_PART),
    # reductions
    "MEAN": _e(shape.reduce(_O.REDUCE_MEAN), _O.REDUCE_MEAN),
    "SUM": _e(shape.reduce(_O.REDUCE_SUM), _O.REDUCE_SUM),
    "REDUCE_MAX": _e(shape.reduce(_O.REDUCE_MAX), _O.REDUCE_MAX),
    "REDUCE_MIN": _e(shape.reduce(_O.REDUCE_MIN), _O.REDUCE_MIN),
    "REDUCE_PROD": _e(shape.reduce(_O.REDUCE_PROD), _O.REDUCE_PROD),
    "REDUCE_ANY": _e(more.reduce_bool(_O.REDUCE_MAX), _O.REDUCE_MAX),
    "REDUCE_ALL": _e(more.reduce_bool(_O.REDUCE_MIN), _O.REDUCE_MIN),
    "ARG_MAX": _e(math.arg(_O.ARGMAX), _O.ARGMAX),
    "ARG_MIN": _e(math.arg(_O.ARGMIN), _O.ARGMIN),
    # quantization
    "DEQUANTIZE": _e(quantize.dequantize, _O.DEQUANTIZE),
    "QUANTIZE": _e(quantize.quantize, _O.QUANTIZE, _O.REQUANTIZE),
    "DENSIFY": _e(quantize.densify),
    # resource variables and their initialization
    "VAR_HANDLE": _e(variables.var_handle),
    "READ_VARIABLE": _e(variables.read_variable, _O.READ_VARIABLE),
    "ASSIGN_VARIABLE": _e(variables.assign_variable, _O.ASSIGN),
    "CALL_ONCE": _e(variables.call_once),
    # recurrent layers over a whole sequence (their states are variables)
    "LSTM": _e(recurrent.lstm, *_RECURRENT, _O.UNSQUEEZE, _O.SEQUENCE_LSTM),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _e(
        recurrent.unidirectional_sequence_lstm, *_RECURRENT, _O.LSTM, _O.SEQUENCE_LSTM
    ),
    "BIDIRECTIONAL_SEQUENCE_LSTM": _e(
        recurrent.bidirectional_sequence_lstm, *_RECURRENT, _O.LSTM, _O.CONCAT, _O.SEQUENCE_LSTM
    ),
    "UNIDIRECTIONAL_SEQUENCE_RNN": _e(recurrent.unidirectional_sequence_rnn, *_RECURRENT, _O.RNN),
    # control flow: subgraphs of the same file (their operators are imported, and declare
    # what they emit, under their own names)
    "IF": _e(control_flow.if_, _O.IF),
    "WHILE": _e(control_flow.while_, _O.LOOP),
    # custom ops of published models (custom options layout: ops/custom.py)
    "CUSTOM:Convolution2DTransposeBias": _e(
        custom.transpose_conv_bias, _O.CONV2D_BACKPROP_INPUT, _O.ADD
    ),
    "CUSTOM:MaxPoolingWithArgmax2D": _e(
        custom.max_pool_with_argmax, _O.MAX_POOL_WITH_ARGMAX, *_FUSED
    ),
    "CUSTOM:MaxUnpooling2D": _e(custom.max_unpooling, _O.MAX_UNPOOL),
}
RUNS_SUBGRAPHS = ("CALL_ONCE", "IF", "WHILE")
"""Ops whose nodes include those of the subgraphs they import (inlined)."""
