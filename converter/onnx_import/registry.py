"""The explicit table of ONNX op types the converter imports, and the runtime ops each needs.

An ONNX op is available when its handler exists and every IR op it maps onto has a kernel
in this runtime (so the list grows as kernels land, and never promises what cannot run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.functions import FUNCTION_OPS
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import (
    activation,
    composite,
    constant,
    control_flow,
    conv,
    elementwise,
    indexing,
    linear,
    logsumexp,
    ml_encoding,
    ml_linear,
    ml_preprocess,
    ml_trees,
    normalization,
    quantized,
    recurrent,
    reduce,
    resize,
    shape,
    topk,
)
from sporenet.lite.kernels import KERNELS
from sporenet.lite.ops import OpCode


@dataclass(frozen=True)
class Handler:
    """Converts one ONNX node; `requires` are the IR ops its usual translation emits."""

    convert: Callable[[ImportContext, OnnxNode], list[int]]
    requires: tuple[OpCode, ...] = ()


def _h(convert: Callable[[ImportContext, OnnxNode], list[int]], *requires: OpCode) -> Handler:
    return Handler(convert, requires)


_QUANTIZE = (
    OpCode.DIV,
    OpCode.ADD,
    OpCode.SUB,
    OpCode.MAXIMUM,
    OpCode.MINIMUM,
    OpCode.CAST,
    OpCode.RESHAPE,
    OpCode.QUANTIZE,
)
_DEQUANTIZE = (
    OpCode.CAST,
    OpCode.SUB,
    OpCode.MUL,
    OpCode.RESHAPE,
    OpCode.DEQUANTIZE,
)
_BLOCKED = (OpCode.GATHER,)  # blocked parameters repeated along their axis
_AS_2D = (OpCode.RESHAPE, OpCode.SQUEEZE, OpCode.UNSQUEEZE)  # 1-D and 3-D windows run as 2-D
_STATISTICS = (OpCode.REDUCE_MEAN, OpCode.SUB, OpCode.MUL, OpCode.ADD)  # computed per batch
# How ai.onnx.ml handlers bring a feature input to [N, F].
_ML_SHAPE = (OpCode.UNSQUEEZE, OpCode.FLATTEN)
_E = elementwise
_A = activation
_N = normalization
_R = reduce
HANDLERS: dict[str, Handler] = {
    # constants and pass-through
    "Constant": _h(constant.constant),
    "ConstantOfShape": _h(constant.constant_of_shape, OpCode.EXPAND),
    "Shape": _h(constant.shape),
    "Size": _h(constant.size),
    "Identity": _h(constant.identity),
    "Dropout": _h(constant.dropout),
    # control flow: subgraphs of the same model file
    "If": _h(control_flow.if_, OpCode.IF),
    "Loop": _h(control_flow.loop, OpCode.LOOP),
    "Scan": _h(control_flow.scan, OpCode.LOOP, OpCode.GATHER),
    # linear algebra
    "Gemm": _h(
        linear.gemm, OpCode.FULLY_CONNECTED, OpCode.MATMUL, OpCode.ADD, OpCode.MUL, OpCode.TRANSPOSE
    ),
    "MatMul": _h(linear.matmul, OpCode.FULLY_CONNECTED, OpCode.MATMUL, OpCode.TRANSPOSE),
    # binary elementwise
    "Add": _h(_E.binary(OpCode.ADD), OpCode.ADD),
    "Sub": _h(_E.binary(OpCode.SUB), OpCode.SUB),
    "Mul": _h(_E.binary(OpCode.MUL), OpCode.MUL),
    "Div": _h(_E.binary(OpCode.DIV), OpCode.DIV),
    "Pow": _h(_E.binary(OpCode.POW), OpCode.POW),
    "Equal": _h(_E.binary(OpCode.EQUAL), OpCode.EQUAL),
    "Greater": _h(_E.binary(OpCode.GREATER), OpCode.GREATER),
    "Less": _h(_E.binary(OpCode.LESS), OpCode.LESS),
    "Sum": _h(_E.variadic(OpCode.ADD), OpCode.ADD),
    "Mean": _h(_E.variadic(OpCode.ADD, mean=True), OpCode.ADD, OpCode.DIV),
    "Max": _h(_E.variadic(OpCode.MAXIMUM), OpCode.MAXIMUM),
    "Min": _h(_E.variadic(OpCode.MINIMUM), OpCode.MINIMUM),
    "Mod": _h(
        _E.mod,
        OpCode.DIV,
        OpCode.MUL,
        OpCode.SUB,
        OpCode.EQUAL,
        OpCode.LESS,
        OpCode.WHERE,
        OpCode.ADD,
        OpCode.CEIL,
        OpCode.FLOOR,
    ),
    "PRelu": _h(_E.prelu, OpCode.PRELU),
    "Where": _h(_E.where, OpCode.WHERE),
    "Not": _h(_E.logical_not, OpCode.EQUAL),
    "And": _h(_E.logical("and"), OpCode.MUL),
    "Or": _h(_E.logical("or"), OpCode.MAXIMUM),
    "Xor": _h(_E.logical("xor"), OpCode.EQUAL),
    "GreaterOrEqual": _h(_E.negated(OpCode.LESS), OpCode.LESS, OpCode.EQUAL),
    "LessOrEqual": _h(_E.negated(OpCode.GREATER), OpCode.GREATER, OpCode.EQUAL),
    # unary and activations
    "Relu": _h(_A.unary(OpCode.RELU), OpCode.RELU),
    "Sigmoid": _h(_A.unary(OpCode.SIGMOID), OpCode.SIGMOID),
    "Tanh": _h(_A.unary(OpCode.TANH), OpCode.TANH),
    "LeakyRelu": _h(_A.unary(OpCode.LEAKY_RELU, alpha=0.01), OpCode.LEAKY_RELU),
    "Elu": _h(_A.unary(OpCode.ELU, alpha=1.0), OpCode.ELU),
    "Selu": _h(_A.selu, OpCode.ELU, OpCode.MUL),
    "HardSigmoid": _h(_A.unary(OpCode.HARD_SIGMOID, alpha=0.2, beta=0.5), OpCode.HARD_SIGMOID),
    "HardSwish": _h(_A.unary(OpCode.HARD_SWISH), OpCode.HARD_SWISH),
    "Softplus": _h(_A.unary(OpCode.SOFTPLUS), OpCode.SOFTPLUS),
    "Softsign": _h(_A.softsign, OpCode.ABS, OpCode.ADD, OpCode.DIV),
    "Gelu": _h(_A.gelu, OpCode.GELU),
    "Clip": _h(_A.clip, OpCode.CLIP, OpCode.MAXIMUM, OpCode.MINIMUM),
    "Exp": _h(_A.unary(OpCode.EXP), OpCode.EXP),
    "Log": _h(_A.unary(OpCode.LOG), OpCode.LOG),
    "Sqrt": _h(_A.unary(OpCode.SQRT), OpCode.SQRT),
    "Neg": _h(_A.unary(OpCode.NEG), OpCode.NEG),
    "Abs": _h(_A.unary(OpCode.ABS), OpCode.ABS),
    "Reciprocal": _h(_A.unary(OpCode.RECIPROCAL), OpCode.RECIPROCAL),
    "Erf": _h(_A.unary(OpCode.ERF), OpCode.ERF),
    "Floor": _h(_A.unary(OpCode.FLOOR), OpCode.FLOOR),
    "Ceil": _h(_A.unary(OpCode.CEIL), OpCode.CEIL),
    "Mish": _h(_A.mish, OpCode.SOFTPLUS, OpCode.TANH, OpCode.MUL),
    "ThresholdedRelu": _h(_A.thresholded_relu, OpCode.GREATER, OpCode.WHERE),
    "Celu": _h(_A.celu, OpCode.ELU, OpCode.DIV, OpCode.MUL),
    "Swish": _h(composite.swish, OpCode.SILU, OpCode.MUL, OpCode.SIGMOID),
    "Sign": _h(composite.sign, OpCode.WHERE, OpCode.LESS, OpCode.GREATER, OpCode.EQUAL),
    "Shrink": _h(
        composite.shrink, OpCode.WHERE, OpCode.LESS, OpCode.GREATER, OpCode.ADD, OpCode.SUB
    ),
    "IsNaN": _h(composite.is_nan, OpCode.EQUAL),
    "IsInf": _h(composite.is_inf, OpCode.EQUAL, OpCode.MAXIMUM),
    "Trilu": _h(composite.trilu, OpCode.WHERE, OpCode.GREATER, OpCode.LESS),
    "EyeLike": _h(composite.eye_like),
    "CumSum": _h(composite.cumsum, OpCode.CUMSUM, OpCode.MATMUL, OpCode.TRANSPOSE),
    "OneHot": _h(composite.one_hot, OpCode.ONE_HOT),
    # index-driven gathers and scatters
    "GatherND": _h(indexing.gather_nd, OpCode.GATHER_ND),
    "GatherElements": _h(indexing.gather_elements, OpCode.GATHER_ELEMENTS),
    "ScatterND": _h(indexing.scatter_nd, OpCode.SCATTER_ND_UPDATE),
    "ScatterElements": _h(indexing.scatter_elements, OpCode.SCATTER_ELEMENTS),
    "Scatter": _h(indexing.scatter_elements, OpCode.SCATTER_ELEMENTS),
    "Einsum": _h(
        composite.einsum,
        OpCode.MATMUL,
        OpCode.TRANSPOSE,
        OpCode.RESHAPE,
        OpCode.REDUCE_SUM,
        OpCode.MUL,
    ),
    "Hardmax": _h(composite.hardmax, OpCode.ARGMAX, OpCode.ONE_HOT, OpCode.FLATTEN, OpCode.RESHAPE),
    # convolution and pooling
    "Conv": _h(conv.conv, OpCode.CONV2D, OpCode.SQUEEZE, OpCode.UNSQUEEZE),
    "ConvTranspose": _h(
        conv.conv_transpose,
        OpCode.CONV2D_BACKPROP_INPUT,
        OpCode.ADD,
        OpCode.SQUEEZE,
        OpCode.UNSQUEEZE,
    ),
    "MaxPool": _h(conv.max_pool, OpCode.MAX_POOL2D, OpCode.CAST, *_AS_2D),
    "AveragePool": _h(conv.average_pool, OpCode.AVG_POOL2D, *_AS_2D),
    "GlobalAveragePool": _h(conv.global_pool(OpCode.GLOBAL_AVG_POOL), OpCode.GLOBAL_AVG_POOL),
    "GlobalMaxPool": _h(conv.global_pool(OpCode.GLOBAL_MAX_POOL), OpCode.GLOBAL_MAX_POOL),
    "LpPool": _h(conv.lp_pool, OpCode.AVG_POOL2D, OpCode.POW, OpCode.ABS, OpCode.MUL, *_AS_2D),
    "GlobalLpPool": _h(
        conv.global_lp_pool, OpCode.GLOBAL_AVG_POOL, OpCode.POW, OpCode.ABS, OpCode.MUL
    ),
    # normalization and softmax
    "BatchNormalization": _h(_N.batch_norm, OpCode.BATCH_NORM, *_STATISTICS, OpCode.RESHAPE),
    "InstanceNormalization": _h(_N.instance_norm, OpCode.INSTANCE_NORM),
    "LRN": _h(_N.lrn, OpCode.LRN),
    "LayerNormalization": _h(_N.layer_norm, OpCode.LAYER_NORM, *_STATISTICS, OpCode.RSQRT),
    "RMSNormalization": _h(
        _N.rms_norm, OpCode.REDUCE_MEAN, OpCode.MUL, OpCode.ADD, OpCode.RSQRT, OpCode.CAST
    ),
    "MeanVarianceNormalization": _h(
        _N.mean_variance_norm,
        OpCode.REDUCE_MEAN,
        OpCode.MUL,
        OpCode.SUB,
        OpCode.SQRT,
        OpCode.ADD,
        OpCode.DIV,
    ),
    "LpNormalization": _h(
        _N.lp_norm,
        OpCode.REDUCE_SUM,
        OpCode.ABS,
        OpCode.MUL,
        OpCode.SQRT,
        OpCode.EQUAL,
        OpCode.WHERE,
        OpCode.DIV,
    ),
    "Softmax": _h(_N.softmax(OpCode.SOFTMAX), OpCode.SOFTMAX, OpCode.FLATTEN, OpCode.RESHAPE),
    "LogSoftmax": _h(
        _N.softmax(OpCode.LOG_SOFTMAX), OpCode.LOG_SOFTMAX, OpCode.FLATTEN, OpCode.RESHAPE
    ),
    # shape and layout
    "Reshape": _h(shape.reshape, OpCode.RESHAPE),
    "Flatten": _h(shape.flatten, OpCode.FLATTEN),
    "Transpose": _h(shape.transpose, OpCode.TRANSPOSE),
    "Squeeze": _h(shape.squeeze, OpCode.SQUEEZE),
    "Unsqueeze": _h(shape.unsqueeze, OpCode.UNSQUEEZE),
    "Concat": _h(shape.concat, OpCode.CONCAT),
    "Split": _h(shape.split, OpCode.SPLIT),
    "Slice": _h(shape.slice_, OpCode.SLICE),
    "Gather": _h(shape.gather, OpCode.GATHER),
    "Expand": _h(shape.expand, OpCode.EXPAND),
    "Tile": _h(shape.tile, OpCode.TILE),
    "Cast": _h(shape.cast, OpCode.CAST),
    "CastLike": _h(shape.cast_like, OpCode.CAST),
    "Pad": _h(shape.pad, OpCode.PAD),
    "DepthToSpace": _h(shape.depth_to_space, OpCode.DEPTH_TO_SPACE),
    "SpaceToDepth": _h(
        shape.space_to_depth, OpCode.SPACE_TO_DEPTH, OpCode.RESHAPE, OpCode.TRANSPOSE
    ),
    "Range": _h(shape.range_, OpCode.RANGE),
    "Resize": _h(resize.resize, OpCode.RESIZE, OpCode.CONCAT, OpCode.GATHER),
    "Upsample": _h(resize.upsample, OpCode.RESIZE),
    # recurrent layers over a whole sequence
    "RNN": _h(recurrent.recurrent, OpCode.RNN),
    "GRU": _h(recurrent.recurrent, OpCode.GRU),
    "LSTM": _h(recurrent.recurrent, OpCode.LSTM),
    # reductions
    "ReduceMean": _h(_R.reduce(OpCode.REDUCE_MEAN), OpCode.REDUCE_MEAN),
    "ReduceSum": _h(_R.reduce(OpCode.REDUCE_SUM), OpCode.REDUCE_SUM),
    "ReduceMax": _h(_R.reduce(OpCode.REDUCE_MAX), OpCode.REDUCE_MAX),
    "ReduceMin": _h(_R.reduce(OpCode.REDUCE_MIN), OpCode.REDUCE_MIN),
    "ReduceProd": _h(_R.reduce(OpCode.REDUCE_PROD), OpCode.REDUCE_PROD),
    "ReduceL1": _h(
        _R.reduce(OpCode.REDUCE_SUM, before=(OpCode.ABS,)), OpCode.REDUCE_SUM, OpCode.ABS
    ),
    "ReduceL2": _h(
        _R.reduce(OpCode.REDUCE_SUM, square=True, after=(OpCode.SQRT,)),
        OpCode.REDUCE_SUM,
        OpCode.MUL,
        OpCode.SQRT,
    ),
    "ReduceSumSquare": _h(_R.reduce(OpCode.REDUCE_SUM, square=True), OpCode.REDUCE_SUM, OpCode.MUL),
    "ReduceLogSum": _h(
        _R.reduce(OpCode.REDUCE_SUM, after=(OpCode.LOG,)), OpCode.REDUCE_SUM, OpCode.LOG
    ),
    "ReduceLogSumExp": _h(
        logsumexp.reduce_log_sum_exp,
        OpCode.REDUCE_SUM,
        OpCode.REDUCE_MAX,
        OpCode.EXP,
        OpCode.LOG,
        OpCode.SUB,
        OpCode.ADD,
        OpCode.EQUAL,
        OpCode.WHERE,
    ),
    "ArgMax": _h(_R.arg(OpCode.ARGMAX), OpCode.ARGMAX),
    "TopK": _h(topk.top_k, OpCode.TOP_K),
    "ArgMin": _h(_R.arg(OpCode.ARGMIN), OpCode.ARGMIN),
    # quantized: dynamic quantization (onnxruntime's quantize_dynamic)
    "DynamicQuantizeLinear": _h(
        quantized.dynamic_quantize_linear, OpCode.DYNAMIC_QUANTIZE, OpCode.ADD, OpCode.CAST
    ),
    "MatMulInteger": _h(
        quantized.matmul_integer,
        OpCode.CAST,
        OpCode.SUB,
        OpCode.FULLY_CONNECTED,
        OpCode.MATMUL,
        OpCode.ADD,
        OpCode.FLOOR,
    ),
    "ConvInteger": _h(
        quantized.conv_integer,
        OpCode.CAST,
        OpCode.SUB,
        OpCode.CONV2D,
        OpCode.ADD,
        OpCode.FLOOR,
        OpCode.RESHAPE,
    ),
    "com.microsoft.DynamicQuantizeLSTM": _h(quantized.dynamic_quantize_lstm, OpCode.LSTM),
    # quantized: QDQ pairs and the QLinear ops of onnxruntime's quantize_static
    "QuantizeLinear": _h(quantized.quantize_linear, *_QUANTIZE, *_BLOCKED),
    "DequantizeLinear": _h(quantized.dequantize_linear, *_DEQUANTIZE, *_BLOCKED),
    "QLinearConv": _h(quantized.qlinear_conv, OpCode.CONV2D, *_QUANTIZE, *_DEQUANTIZE),
    "QLinearMatMul": _h(
        quantized.qlinear_matmul, OpCode.FULLY_CONNECTED, OpCode.MATMUL, *_QUANTIZE, *_DEQUANTIZE
    ),
    "com.microsoft.QGemm": _h(
        quantized.qgemm,
        OpCode.FULLY_CONNECTED,
        OpCode.MATMUL,
        OpCode.ADD,
        OpCode.MUL,
        *_QUANTIZE,
        *_DEQUANTIZE,
    ),
    "com.microsoft.QLinearAdd": _h(
        quantized.qlinear_binary(OpCode.ADD), OpCode.ADD, *_QUANTIZE, *_DEQUANTIZE
    ),
    "com.microsoft.QLinearMul": _h(
        quantized.qlinear_binary(OpCode.MUL), OpCode.MUL, *_QUANTIZE, *_DEQUANTIZE
    ),
    "com.microsoft.QLinearSigmoid": _h(
        quantized.qlinear_unary(_A.unary(OpCode.SIGMOID)), OpCode.SIGMOID, *_QUANTIZE, *_DEQUANTIZE
    ),
    "com.microsoft.QLinearLeakyRelu": _h(
        quantized.qlinear_unary(_A.unary(OpCode.LEAKY_RELU, alpha=0.01)),
        OpCode.LEAKY_RELU,
        *_QUANTIZE,
        *_DEQUANTIZE,
    ),
    "com.microsoft.QLinearGlobalAveragePool": _h(
        quantized.qlinear_unary(conv.global_pool(OpCode.GLOBAL_AVG_POOL)),
        OpCode.GLOBAL_AVG_POOL,
        *_QUANTIZE,
        *_DEQUANTIZE,
    ),
    "com.microsoft.QLinearAveragePool": _h(
        quantized.qlinear_unary(conv.average_pool), OpCode.AVG_POOL2D, *_QUANTIZE, *_DEQUANTIZE
    ),
    "com.microsoft.QLinearSoftmax": _h(
        quantized.qlinear_unary(_N.softmax(OpCode.SOFTMAX)),
        OpCode.SOFTMAX,
        OpCode.FLATTEN,
        OpCode.RESHAPE,
        *_QUANTIZE,
        *_DEQUANTIZE,
    ),
    "com.microsoft.QLinearConcat": _h(
        quantized.qlinear_concat, OpCode.CONCAT, *_QUANTIZE, *_DEQUANTIZE
    ),
    # classic machine learning: ai.onnx.ml (ops/ml_*.py)
    "ai.onnx.ml.TreeEnsembleClassifier": _h(
        ml_trees.tree_ensemble_classifier, OpCode.TREE_ENSEMBLE, OpCode.GATHER, *_ML_SHAPE
    ),
    "ai.onnx.ml.TreeEnsembleRegressor": _h(
        ml_trees.tree_ensemble_regressor, OpCode.TREE_ENSEMBLE, *_ML_SHAPE
    ),
    "ai.onnx.ml.TreeEnsemble": _h(
        ml_trees.tree_ensemble, OpCode.TREE_ENSEMBLE, OpCode.CAST, *_ML_SHAPE
    ),
    "ai.onnx.ml.LinearClassifier": _h(
        ml_linear.linear_classifier, OpCode.LINEAR_CLASSIFIER, OpCode.GATHER, *_ML_SHAPE
    ),
    "ai.onnx.ml.LinearRegressor": _h(
        ml_linear.linear_regressor, OpCode.FULLY_CONNECTED, OpCode.CAST, *_ML_SHAPE
    ),
    "ai.onnx.ml.SVMClassifier": _h(ml_linear.svm_classifier, OpCode.SVM, OpCode.GATHER, *_ML_SHAPE),
    "ai.onnx.ml.SVMRegressor": _h(ml_linear.svm_regressor, OpCode.SVM, *_ML_SHAPE),
    "ai.onnx.ml.Scaler": _h(ml_preprocess.scaler, OpCode.SUB, OpCode.MUL, OpCode.CAST),
    "ai.onnx.ml.Normalizer": _h(
        ml_preprocess.normalizer,
        OpCode.REDUCE_MAX,
        OpCode.REDUCE_SUM,
        OpCode.ABS,
        OpCode.MUL,
        OpCode.SQRT,
        OpCode.EQUAL,
        OpCode.WHERE,
        OpCode.DIV,
        OpCode.CAST,
        *_ML_SHAPE,
    ),
    "ai.onnx.ml.Binarizer": _h(ml_preprocess.binarizer, OpCode.GREATER, OpCode.CAST),
    "ai.onnx.ml.Imputer": _h(ml_preprocess.imputer, OpCode.EQUAL, OpCode.WHERE),
    "ai.onnx.ml.FeatureVectorizer": _h(
        ml_preprocess.feature_vectorizer, OpCode.CONCAT, OpCode.CAST, *_ML_SHAPE
    ),
    "ai.onnx.ml.ArrayFeatureExtractor": _h(
        ml_preprocess.array_feature_extractor,
        OpCode.GATHER,
        OpCode.CAST,
        OpCode.RESHAPE,
        OpCode.UNSQUEEZE,
    ),
    "ai.onnx.ml.LabelEncoder": _h(ml_encoding.label_encoder, OpCode.LABEL_ENCODER),
    "ai.onnx.ml.CategoryMapper": _h(ml_encoding.category_mapper, OpCode.LABEL_ENCODER),
    "ai.onnx.ml.OneHotEncoder": _h(
        ml_encoding.one_hot_encoder, OpCode.UNSQUEEZE, OpCode.EQUAL, OpCode.CAST
    ),
    "ai.onnx.ml.ZipMap": _h(ml_encoding.zip_map, OpCode.IDENTITY),
}


def handler_available(op_type: str) -> bool:
    """Whether `op_type` has a handler and every runtime op it needs has a kernel."""
    handler = HANDLERS.get(op_type)
    return handler is not None and all(op in KERNELS for op in handler.requires)


def is_supported(op_type: str) -> bool:
    """Whether the converter accepts `op_type`: by a handler, or through its ONNX function
    body (FUNCTION_OPS; the body's own ops are checked when it is expanded)."""
    return handler_available(op_type) or op_type in FUNCTION_OPS


def supported_onnx_ops() -> list[str]:
    """Every ONNX op type the converter accepts with this runtime, sorted."""
    return sorted({op for op in HANDLERS if handler_available(op)} | FUNCTION_OPS)
