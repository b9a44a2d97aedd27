"""The kernel registry: one explicit entry per op code."""

from __future__ import annotations

from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.kernels import (
    argmax_pool,
    control_flow,
    conv,
    conv_transpose,
    cumsum,
    dynamic_quantize,
    elementwise,
    fake_quant,
    fft,
    gather_nd,
    l2_norm,
    layer_norm,
    linear,
    normalization,
    onehot,
    pad,
    pooling,
    ranges,
    recurrent,
    reduce,
    reshape,
    resize,
    scatter,
    scatter_nd,
    sequence_lstm,
    softmax,
    state,
    topk,
    transform,
    unary,
)
from sporenet.lite.kernels.base import Kernel, TensorSpec
from sporenet.lite.kernels.ml import label_encoder as ml_label_encoder
from sporenet.lite.kernels.ml import linear_classifier as ml_linear
from sporenet.lite.kernels.ml import svm as ml_svm
from sporenet.lite.kernels.ml import tree_ensemble as ml_trees
from sporenet.lite.kernels.quantized import activation as q_activation
from sporenet.lite.kernels.quantized import conv as q_conv
from sporenet.lite.kernels.quantized import conv_transpose as q_conv_transpose
from sporenet.lite.kernels.quantized import convert as q_convert
from sporenet.lite.kernels.quantized import elementwise as q_elementwise
from sporenet.lite.kernels.quantized import elementwise_extra as q_elementwise_extra

# tfliteq: int16x8 kernels
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import int16_elementwise as q_int16_elementwise
from sporenet.lite.kernels.quantized import int16_linear as q_int16_linear
from sporenet.lite.kernels.quantized import int16_lut as q_int16_lut
from sporenet.lite.kernels.quantized import int16_sigmoid as q_int16_sigmoid
from sporenet.lite.kernels.quantized import int16_softmax as q_int16_softmax
from sporenet.lite.kernels.quantized import l2_norm as q_l2_norm
from sporenet.lite.kernels.quantized import linear as q_linear
from sporenet.lite.kernels.quantized import lookup as q_lookup
from sporenet.lite.kernels.quantized import pooling as q_pooling
from sporenet.lite.kernels.quantized import reduce as q_reduce
from sporenet.lite.kernels.quantized import resize as q_resize
from sporenet.lite.kernels.quantized import shape as q_shape
from sporenet.lite.kernels.quantized import softmax as q_softmax
from sporenet.lite.kernels.quantized.base import is_int16_quantized, is_quantized
from sporenet.lite.kernels.training import (
    activation_grad,
    broadcast,
    conv_grad,
    dropout,
    losses,
    matmul,
    norm_grad,
    optimizers,
    pool_grad,
    recurrent_grad,
    shape_grad,
)
from sporenet.lite.ops import OpCode

KERNELS: dict[OpCode, type[Kernel]] = {
    # structural
    OpCode.IDENTITY: reshape.Identity,
    OpCode.RESHAPE: reshape.Reshape,
    OpCode.FLATTEN: reshape.Flatten,
    OpCode.SQUEEZE: transform.Squeeze,
    OpCode.UNSQUEEZE: transform.Unsqueeze,
    OpCode.TRANSPOSE: transform.Transpose,
    OpCode.CONCAT: transform.Concat,
    OpCode.SPLIT: transform.Split,
    OpCode.SLICE: transform.Slice,
    OpCode.GATHER: transform.Gather,
    OpCode.CAST: transform.Cast,
    OpCode.EXPAND: transform.Expand,
    OpCode.TILE: transform.Tile,
    OpCode.SHAPE: transform.Shape,
    OpCode.WHERE: transform.Where,
    OpCode.DEPTH_TO_SPACE: transform.DepthToSpace,
    OpCode.SPACE_TO_DEPTH: transform.SpaceToDepth,
    OpCode.ONE_HOT: onehot.OneHot,
    OpCode.RANGE: ranges.Range,
    # linear algebra
    OpCode.FULLY_CONNECTED: linear.FullyConnected,
    OpCode.MATMUL: linear.MatMul,
    OpCode.CONV2D: conv.Conv2D,
    OpCode.CONV_TRANSPOSE2D: conv_transpose.ConvTranspose2D,
    # pooling
    OpCode.MAX_POOL2D: pooling.MaxPool2D,
    OpCode.AVG_POOL2D: pooling.AvgPool2D,
    OpCode.GLOBAL_AVG_POOL: pooling.GlobalAvgPool,
    OpCode.GLOBAL_MAX_POOL: pooling.GlobalMaxPool,
    OpCode.BATCH_NORM: normalization.BatchNorm,
    OpCode.LRN: normalization.LRN,
    OpCode.INSTANCE_NORM: normalization.InstanceNorm,
    OpCode.PAD: pad.Pad,
    OpCode.RESIZE: resize.Resize,
    # binary elementwise
    OpCode.ADD: elementwise.Add,
    OpCode.SUB: elementwise.Sub,
    OpCode.MUL: elementwise.Mul,
    OpCode.DIV: elementwise.Div,
    OpCode.MAXIMUM: elementwise.Maximum,
    OpCode.MINIMUM: elementwise.Minimum,
    OpCode.POW: elementwise.Pow,
    OpCode.EQUAL: elementwise.Equal,
    OpCode.GREATER: elementwise.Greater,
    OpCode.LESS: elementwise.Less,
    # unary and activations
    OpCode.RELU: unary.Relu,
    OpCode.SIGMOID: unary.Sigmoid,
    OpCode.TANH: unary.Tanh,
    OpCode.RELU6: unary.Relu6,
    OpCode.CLIP: unary.Clip,
    OpCode.LEAKY_RELU: unary.LeakyRelu,
    OpCode.PRELU: unary.PRelu,
    OpCode.HARD_SIGMOID: unary.HardSigmoid,
    OpCode.HARD_SWISH: unary.HardSwish,
    OpCode.SILU: unary.Silu,
    OpCode.GELU: unary.Gelu,
    OpCode.ELU: unary.Elu,
    OpCode.SOFTPLUS: unary.Softplus,
    OpCode.EXP: unary.Exp,
    OpCode.LOG: unary.Log,
    OpCode.SQRT: unary.Sqrt,
    OpCode.RSQRT: unary.Rsqrt,
    OpCode.NEG: unary.Neg,
    OpCode.ABS: unary.Abs,
    OpCode.RECIPROCAL: unary.Reciprocal,
    OpCode.ERF: unary.Erf,
    OpCode.FLOOR: unary.Floor,
    OpCode.CEIL: unary.Ceil,
    OpCode.SQUARE: unary.Square,
    # softmax and normalization
    OpCode.SOFTMAX: softmax.Softmax,
    OpCode.LOG_SOFTMAX: softmax.LogSoftmax,
    OpCode.LAYER_NORM: layer_norm.LayerNorm,
    # reductions
    OpCode.REDUCE_MEAN: reduce.ReduceMean,
    OpCode.REDUCE_SUM: reduce.ReduceSum,
    OpCode.REDUCE_MAX: reduce.ReduceMax,
    OpCode.REDUCE_MIN: reduce.ReduceMin,
    OpCode.REDUCE_PROD: reduce.ReduceProd,
    OpCode.ARGMAX: reduce.ArgMax,
    OpCode.ARGMIN: reduce.ArgMin,
    # quantization-aware training
    OpCode.FAKE_QUANT: fake_quant.FakeQuant,
    OpCode.DYNAMIC_QUANTIZE: dynamic_quantize.DynamicQuantize,
    # recurrent layers over a whole sequence
    OpCode.LSTM: recurrent.LSTM,
    OpCode.GRU: recurrent.GRU,
    OpCode.RNN: recurrent.RNN,
    # control flow over subgraphs of the same model
    OpCode.IF: control_flow.If,
    OpCode.LOOP: control_flow.Loop,
    # functions with their own gradient (autodiff)
    OpCode.CALL: control_flow.Call,
    # training: dropout, losses, backward ops, optimizer updates (lite/kernels/training/)
    OpCode.DROPOUT: dropout.Dropout,
    OpCode.SOFTMAX_CROSS_ENTROPY: losses.SoftmaxCrossEntropy,
    OpCode.SOFTMAX_CROSS_ENTROPY_GRAD: losses.SoftmaxCrossEntropyGrad,
    OpCode.MSE_LOSS: losses.MSELoss,
    OpCode.MSE_LOSS_GRAD: losses.MSELossGrad,
    OpCode.BCE_WITH_LOGITS: losses.BCEWithLogits,
    OpCode.BCE_WITH_LOGITS_GRAD: losses.BCEWithLogitsGrad,
    OpCode.REDUCE_SUM_TO: broadcast.ReduceSumTo,
    OpCode.REDUCE_GRAD: broadcast.ReduceGrad,
    OpCode.FAKE_QUANT_GRAD: fake_quant.FakeQuantGrad,
    OpCode.MATMUL_TRANSPOSED: matmul.MatMulTransposed,
    OpCode.ACTIVATION_GRAD: activation_grad.ActivationGrad,
    OpCode.SOFTMAX_GRAD: activation_grad.SoftmaxGrad,
    OpCode.SGD_UPDATE: optimizers.SGDUpdate,
    OpCode.ADAM_UPDATE: optimizers.AdamUpdate,
    OpCode.ASSIGN: optimizers.Assign,
    OpCode.CONV2D_BACKPROP_INPUT: conv_grad.Conv2DBackpropInput,
    OpCode.CONV2D_BACKPROP_FILTER: conv_grad.Conv2DBackpropFilter,
    OpCode.MAX_POOL2D_GRAD: pool_grad.MaxPool2DGrad,
    OpCode.AVG_POOL2D_GRAD: pool_grad.AvgPool2DGrad,
    OpCode.BATCH_NORM_TRAINING: norm_grad.BatchNormTraining,
    OpCode.BATCH_NORM_GRAD: norm_grad.BatchNormGrad,
    OpCode.LAYER_NORM_GRAD: norm_grad.LayerNormGrad,
    OpCode.SLICE_GRAD: shape_grad.SliceGrad,
    OpCode.PAD_GRAD: shape_grad.PadGrad,
    OpCode.GATHER_GRAD: shape_grad.GatherGrad,
    OpCode.LSTM_GRAD: recurrent_grad.LSTMGrad,
    OpCode.GRU_GRAD: recurrent_grad.GRUGrad,
    OpCode.RNN_GRAD: recurrent_grad.RNNGrad,
    # quantization boundaries (float or float16 in; see QUANTIZED_KERNELS for int8 in)
    OpCode.QUANTIZE: q_convert.Quantize,
    OpCode.DEQUANTIZE: q_convert.Dequantize,
    # TFLite builtins (tfliteops): variables, floor division, trigonometry, gathers, sums
    OpCode.READ_VARIABLE: state.ReadVariable,
    OpCode.FLOOR_DIV: elementwise.FloorDiv,
    OpCode.FLOOR_MOD: elementwise.FloorMod,
    OpCode.SIN: unary.Sin,
    OpCode.COS: unary.Cos,
    OpCode.GATHER_ND: gather_nd.GatherNd,
    OpCode.CUMSUM: cumsum.CumSum,
    OpCode.MAX_POOL_WITH_ARGMAX: argmax_pool.MaxPoolWithArgmax,
    OpCode.MAX_UNPOOL: argmax_pool.MaxUnpool,
    OpCode.RFFT2D: fft.Rfft2d,
    OpCode.COMPLEX_PART: fft.ComplexPart,
    OpCode.ROUND: unary.Round,
    OpCode.SIGN: unary.Sign,
    OpCode.SCATTER_ND: scatter_nd.ScatterNd,
    OpCode.ATAN2: elementwise.Atan2,
    OpCode.L2_NORMALIZATION: l2_norm.L2Normalization,
    OpCode.SQUARED_DIFFERENCE: elementwise.SquaredDifference,
    # ONNX scatters and element gathers (onnxgap)
    OpCode.SCATTER_ND_UPDATE: scatter.ScatterNdUpdate,
    OpCode.SCATTER_ELEMENTS: scatter.ScatterElements,
    OpCode.GATHER_ELEMENTS: scatter.GatherElements,
    # classic machine learning, ai.onnx.ml (lite/kernels/ml/)
    OpCode.TREE_ENSEMBLE: ml_trees.TreeEnsemble,
    OpCode.LINEAR_CLASSIFIER: ml_linear.LinearClassifier,
    OpCode.SVM: ml_svm.SVM,
    OpCode.LABEL_ENCODER: ml_label_encoder.LabelEncoder,
    OpCode.TOP_K: topk.TopK,
    # tfliteq: TFLite's LSTM with projection, CIFG, layer norm, clipping
    OpCode.SEQUENCE_LSTM: sequence_lstm.SequenceLSTM,
}

QUANTIZED_KERNELS: dict[OpCode, type[Kernel]] = {
    # The planner picks these when a node's first input is int8/uint8 with quantization.
    # conversions
    OpCode.DEQUANTIZE: q_convert.Dequantize,
    OpCode.REQUANTIZE: q_convert.Requantize,
    # linear algebra
    OpCode.CONV2D: q_conv.QConv2D,
    OpCode.FULLY_CONNECTED: q_linear.QFullyConnected,
    OpCode.MATMUL: q_linear.QMatMul,
    # binary elementwise
    OpCode.ADD: q_elementwise.QAdd,
    OpCode.SUB: q_elementwise.QSub,
    OpCode.MUL: q_elementwise.QMul,
    # pooling
    OpCode.MAX_POOL2D: q_pooling.QMaxPool2D,
    OpCode.AVG_POOL2D: q_pooling.QAvgPool2D,
    OpCode.GLOBAL_AVG_POOL: q_pooling.QGlobalAvgPool,
    # activations (clamps and lookup tables) and softmax
    OpCode.RELU: q_activation.QRelu,
    OpCode.RELU6: q_activation.QRelu6,
    OpCode.CLIP: q_activation.QClip,
    OpCode.SIGMOID: q_activation.QLogistic,
    OpCode.TANH: q_activation.QTanh,
    OpCode.HARD_SWISH: q_activation.QHardSwish,
    OpCode.SILU: q_activation.QSilu,
    OpCode.SOFTMAX: q_softmax.QSoftmax,
    # data movement (parameters carried through)
    OpCode.IDENTITY: q_shape.QIdentity,
    OpCode.RESHAPE: q_shape.QReshape,
    OpCode.FLATTEN: q_shape.QFlatten,
    OpCode.SQUEEZE: q_shape.QSqueeze,
    OpCode.UNSQUEEZE: q_shape.QUnsqueeze,
    OpCode.TRANSPOSE: q_shape.QTranspose,
    OpCode.SLICE: q_shape.QSlice,
    OpCode.CONCAT: q_shape.QConcat,
    OpCode.PAD: q_shape.QPad,
    # TFLite resource variables (tfliteops): the stored integers are read and written as
    # they are, as TFLite does
    OpCode.ASSIGN: optimizers.Assign,
    OpCode.READ_VARIABLE: q_shape.QReadVariable,
    # int8 data movement with the input's parameters (tfliteops)
    OpCode.SPLIT: q_shape.QSplit,
    OpCode.GATHER: q_shape.QGather,
    OpCode.GATHER_ND: q_shape.QGatherNd,
    OpCode.TILE: q_shape.QTile,
    OpCode.EXPAND: q_shape.QExpand,
    OpCode.DEPTH_TO_SPACE: q_shape.QDepthToSpace,
    OpCode.SPACE_TO_DEPTH: q_shape.QSpaceToDepth,
    # int8 reductions with TFLite's integer semantics (tfliteops)
    OpCode.REDUCE_MEAN: q_reduce.QReduceMean,
    OpCode.REDUCE_SUM: q_reduce.QReduceSum,
    OpCode.REDUCE_MAX: q_reduce.QReduceMax,
    OpCode.REDUCE_MIN: q_reduce.QReduceMin,
    OpCode.RESIZE: q_resize.QResize,
    OpCode.MAXIMUM: q_elementwise_extra.QMaximum,
    OpCode.MINIMUM: q_elementwise_extra.QMinimum,
    OpCode.LEAKY_RELU: q_elementwise_extra.QLeakyRelu,
    OpCode.CONV2D_BACKPROP_INPUT: q_conv_transpose.QConv2DBackpropInput,
    OpCode.L2_NORMALIZATION: q_l2_norm.QL2Normalization,
    OpCode.EQUAL: q_elementwise_extra.QEqual,
    OpCode.GREATER: q_elementwise_extra.QGreater,
    OpCode.LESS: q_elementwise_extra.QLess,
    OpCode.SQUARED_DIFFERENCE: q_elementwise_extra.QSquaredDifference,
    # tflitefix: int8 unary math as lookup tables on a TFLite file's parameters
    OpCode.ABS: q_lookup.QAbs,
    OpCode.NEG: q_lookup.QNeg,
    OpCode.EXP: q_lookup.QExp,
    OpCode.LOG: q_lookup.QLog,
    OpCode.RSQRT: q_lookup.QRsqrt,
    OpCode.ELU: q_lookup.QElu,
    OpCode.GELU: q_lookup.QGelu,
    OpCode.LOG_SOFTMAX: q_softmax.QLogSoftmax,
    OpCode.PRELU: q_elementwise_extra.QPRelu,
}


# tfliteops: int8 kernels written for the parameters a TFLite file declares (TFLite's
# rounding; operands that must share one set of parameters; variables): the static
# quantizer and QDQ folding leave these ops float rather than choose parameters for them.
FILE_QUANTIZED_ONLY: frozenset[OpCode] = frozenset(
    {
        OpCode.ASSIGN,
        OpCode.READ_VARIABLE,
        OpCode.REDUCE_MEAN,
        OpCode.REDUCE_SUM,
        OpCode.REDUCE_MAX,
        OpCode.REDUCE_MIN,
        OpCode.RESIZE,
        OpCode.MAXIMUM,
        OpCode.MINIMUM,
        OpCode.LEAKY_RELU,
        OpCode.CONV2D_BACKPROP_INPUT,
        OpCode.TILE,
        OpCode.EXPAND,
        OpCode.GATHER_ND,
        OpCode.L2_NORMALIZATION,
        OpCode.EQUAL,
        OpCode.GREATER,
        OpCode.LESS,
        OpCode.SQUARED_DIFFERENCE,
        # tflitefix: int8 lookup-table unary math
        OpCode.ABS,
        OpCode.NEG,
        OpCode.EXP,
        OpCode.LOG,
        OpCode.RSQRT,
        OpCode.ELU,
        OpCode.GELU,
        OpCode.LOG_SOFTMAX,
        OpCode.PRELU,
    }
)


# tfliteq: int16x8 kernels (16-bit activations, 8-bit weights, TFLite's reference
# arithmetic), picked when a node's first input is int16 with quantization.
INT16_KERNELS: dict[OpCode, type[Kernel]] = {
    OpCode.CONV2D: q_int16_linear.QConv2D16,
    OpCode.FULLY_CONNECTED: q_int16_linear.QFullyConnected16,
    OpCode.CONV2D_BACKPROP_INPUT: q_conv_transpose.QConv2DBackpropInput16,
    OpCode.MATMUL: q_linear.QMatMul16,
    OpCode.DEQUANTIZE: q_convert.Dequantize,
    OpCode.REQUANTIZE: q_int16.QRequantize16,
    OpCode.ADD: q_int16_elementwise.QAdd16,
    OpCode.SUB: q_int16_elementwise.QSub16,
    OpCode.MUL: q_int16_elementwise.QMul16,
    OpCode.MAX_POOL2D: q_int16.QMaxPool2D16,
    OpCode.AVG_POOL2D: q_int16.QAvgPool2D16,
    OpCode.RELU: q_int16.QRelu16,
    OpCode.RELU6: q_int16.QRelu6_16,
    OpCode.LEAKY_RELU: q_int16.QLeakyRelu16,
    OpCode.ABS: q_int16.QAbs16,
    OpCode.SIGMOID: q_int16_sigmoid.QLogistic16,
    OpCode.TANH: q_int16_sigmoid.QTanh16,
    OpCode.SOFTMAX: q_int16_softmax.QSoftmax16,
    OpCode.CONCAT: q_int16.QConcat16,
    OpCode.MAXIMUM: q_int16.QMaximum16,
    OpCode.MINIMUM: q_int16.QMinimum16,
    OpCode.PRELU: q_int16.QPRelu16,
    OpCode.EQUAL: q_int16.QEqual16,
    OpCode.GREATER: q_int16.QGreater16,
    OpCode.LESS: q_int16.QLess16,
    OpCode.REDUCE_MEAN: q_int16.QReduceMean16,
    OpCode.REDUCE_SUM: q_int16.QReduceSum16,
    OpCode.REDUCE_MAX: q_int16.QReduceMax16,
    OpCode.REDUCE_MIN: q_int16.QReduceMin16,
    OpCode.RESIZE: q_int16.QResize16,
    OpCode.NEG: q_int16.QNeg16,
    OpCode.EXP: q_int16_lut.QExp16,
    OpCode.LOG: q_int16_lut.QLog16,
    OpCode.RSQRT: q_int16_lut.QRsqrt16,
    OpCode.GELU: q_int16_lut.QGelu16,
    # data movement and variables: the int8 kernels carry int16 parameters unchanged
    **{
        op: QUANTIZED_KERNELS[op]
        for op in (
            OpCode.IDENTITY,
            OpCode.RESHAPE,
            OpCode.FLATTEN,
            OpCode.SQUEEZE,
            OpCode.UNSQUEEZE,
            OpCode.TRANSPOSE,
            OpCode.SLICE,
            OpCode.PAD,
            OpCode.SPLIT,
            OpCode.GATHER,
            OpCode.GATHER_ND,
            OpCode.TILE,
            OpCode.EXPAND,
            OpCode.READ_VARIABLE,
            OpCode.ASSIGN,
        )
    },
}


def max_op_versions() -> dict[int, int]:
    """Newest op version this runtime runs, per op code (float and int8 kernels)."""
    versions = {int(op): kernel.version for op, kernel in QUANTIZED_KERNELS.items()}
    for op, kernel in KERNELS.items():
        versions[int(op)] = max(kernel.version, versions.get(int(op), 1))
    return versions


def supported_ops() -> list[str]:
    """Names of every op this runtime has a kernel for, sorted."""
    return sorted(op.name for op in {*KERNELS, *QUANTIZED_KERNELS})


def kernel_class(op: OpCode, first: TensorSpec | None, where: str) -> type[Kernel]:
    """The kernel for a node: the int8 one when its first input is a quantized int8/uint8
    tensor, else the float (or dtype-generic) one."""
    if is_int16_quantized(first):  # tfliteq
        cls = INT16_KERNELS.get(op)
        if cls is None:
            raise UnsupportedOpError(
                f"{where}: no int16x8 kernel for {op.name}; int16x8 ops: "
                f"{', '.join(sorted(o.name for o in INT16_KERNELS))}"
            )
        return cls
    if is_quantized(first):
        cls = QUANTIZED_KERNELS.get(op)
        if cls is None:
            raise UnsupportedOpError(
                f"{where}: no int8 kernel for {op.name} (input {first.dtype} with "  # type: ignore[union-attr]
                f"quantization); int8 ops: {', '.join(sorted(o.name for o in QUANTIZED_KERNELS))}"
            )
        return cls
    cls = KERNELS.get(op)
    if cls is None:
        raise UnsupportedOpError(
            f"{where}: {op.name} runs only on int8/uint8 tensors with "
            f"quantization, got {None if first is None else first.dtype}"
        )
    return cls
