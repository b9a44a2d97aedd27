"""Generated single-op .tflite cases: one spec per TFLite builtin op, as data.

A spec names the op, its inputs (`In`: a fed tensor; `Const`: data in the file, with a
role saying how it is quantized), its options table and the variants to generate
(`modes`: float32, float16 weights, int8 per-tensor or per-channel, int16x8). `cases()`
expands every spec into `Case`s; `tflite_suite.py` writes each one (`build`), runs it by
LiteRT and by sporenet and compares.

Output shapes and the output's range are not written by hand: `build` first runs a float
version through LiteRT's reference kernels, which compute them, then writes the file
with the declared shapes (and -1 where a dimension follows a dynamic input) and the
quantization chosen from that range, as a real converter would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from sporenet.proto import tflite_schema_generated as tfl

# ----------------------------------------------------------------------------- specs


class Mode(StrEnum):
    """How a case stores its tensors."""

    FLOAT = "float32"
    FLOAT16 = "float16 weights"  # weights stored float16 behind a DEQUANTIZE
    INT8 = "int8"  # activations and weights int8, per-tensor
    INT8_CHANNEL = "int8 per-channel"  # weights int8 per output channel
    INT16 = "int16x8"  # activations int16 (symmetric), weights int8


class Role(StrEnum):
    """What a constant input is, for quantization."""

    VALUE = "value"  # an operand: quantized like an activation
    WEIGHT = "weight"  # a filter: symmetric int8, per channel in INT8_CHANNEL
    BIAS = "bias"  # int32 (int64 under INT16) at input scale x weight scale
    PARAM = "param"  # axes, shapes, paddings, indices: stored as given, never quantized
    ALPHA = "alpha"  # PRELU's slopes: an int8 operand, also under int16x8 (as LiteRT reads it)


@dataclass(frozen=True)
class In:
    """A fed input: its shape and dtype, its values' range; `dynamic` axes are -1 in the
    shape signature and fed at `dynamic_size` by both engines."""

    shape: tuple[int, ...]
    dtype: Any = np.float32
    low: float = -2.0
    high: float = 2.0
    dynamic: tuple[int, ...] = ()


@dataclass(frozen=True)
class Const:
    """An input stored in the file."""

    value: Any
    dtype: Any = np.float32
    role: Role = Role.VALUE
    channel_axis: int = 0  # the output-channel axis of a WEIGHT


@dataclass(frozen=True)
class State:
    """A variable tensor the op keeps between invokes (a recurrent state, zeros first)."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class Absent:
    """An optional input left out (tensor index -1)."""


@dataclass(frozen=True)
class Spec:
    """One single-op model: op, inputs, options, outputs' dtypes, the variants to make."""

    op: str
    inputs: tuple[In | Const | State | Absent, ...]
    options: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    out_dtypes: tuple[Any, ...] = (None,)  # None: the first input's (float) dtype
    modes: tuple[Mode, ...] = (Mode.FLOAT,)
    # int8/int16 outputs whose quantization the kernel fixes (LOGISTIC: 1/256, -128)
    fixed_quant: dict[Mode, tuple[float, int]] = field(default_factory=dict)
    same_quant: bool = False  # the output must take input 0's quantization
    version: int = 1  # the op version written (some ops start above 1: BROADCAST_TO)
    out_shape: tuple[int, ...] | None = None  # for kernels that check it (SLICE)
    label: str = ""
    slow: bool = False


@dataclass(frozen=True)
class Case:
    """One generated model: `name` is unique, `op` the builtin op it tests."""

    name: str
    op: str
    spec: Spec
    mode: Mode
    slow: bool = False


def _r(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


A = tfl.ActivationFunctionType
P = tfl.Padding
F, I8, I8C, I16, F16 = Mode.FLOAT, Mode.INT8, Mode.INT8_CHANNEL, Mode.INT16, Mode.FLOAT16
i32 = np.int32
BOOL = np.bool_


def unary(
    op: str,
    *,
    low: float = -3.0,
    high: float = 3.0,
    modes: tuple[Mode, ...] = (F,),
    fixed: dict[Mode, tuple[float, int]] | None = None,
    options: str | None = None,
    same_quant: bool = False,
    dynamic: bool = True,
    **fields: Any,
) -> list[Spec]:
    """An elementwise op of one input: a 4-D case and a 2-D one with a dynamic batch."""
    specs = [
        Spec(
            op,
            (In((1, 4, 5, 3), low=low, high=high),),
            options,
            fields,
            modes=modes,
            fixed_quant=fixed or {},
            same_quant=same_quant,
            label="4d",
        ),
        Spec(
            op,
            (In((2, 7), low=low, high=high, dynamic=(0,)),),
            options,
            fields,
            modes=(F,),
            label="dynamic batch",
        ),
    ]
    return specs if dynamic else specs[:1]


BROADCASTS: tuple[tuple[tuple[int, ...], tuple[int, ...], str], ...] = (
    ((2, 3, 4), (2, 3, 4), "same shape"),
    ((2, 3, 4), (4,), "trailing vector"),
    ((1, 3, 1, 5), (2, 1, 4, 1), "both broadcast"),
    ((3, 4), (), "scalar"),
)


def binary(
    op: str,
    *,
    modes: tuple[Mode, ...] = (F,),
    options: str | None = None,
    out: Any = None,
    low: float = -2.0,
    high: float = 2.0,
    dtypes: tuple[Any, ...] = (np.float32,),
    const_second: bool = True,
    broadcast: bool = True,
    **fields: Any,
) -> list[Spec]:
    """A broadcasting binary op: every broadcast pattern (`broadcast`: else equal shapes
    only), both inputs fed, one constant."""
    specs = []
    for a, b, label in BROADCASTS if broadcast else BROADCASTS[:1]:
        for dtype in dtypes:
            int_like = np.dtype(dtype).kind in "iub"
            lo, hi = (low, high)
            specs.append(
                Spec(
                    op,
                    (In(a, dtype, lo, hi), In(b, dtype, lo, hi)),
                    options,
                    fields,
                    out_dtypes=(out,),
                    modes=modes if not int_like else (F,),
                    label=f"{label} {np.dtype(dtype).name}",
                )
            )
    second = (5,) if broadcast else (2, 5)
    specs.append(
        Spec(
            op,
            (
                In((2, 5), dtypes[0], low, high, dynamic=(0,)),
                In(second, dtypes[0], low, high, dynamic=(0,) if len(second) == 2 else ()),
            ),
            options,
            fields,
            out_dtypes=(out,),
            label="dynamic batch",
        )
    )
    if const_second:
        value = _r(*((2, 3, 4) if not broadcast else (3, 4)), seed=7, low=low, high=high)
        specs.append(
            Spec(
                op,
                (In((2, 3, 4), low=low, high=high), Const(value)),
                options,
                fields,
                out_dtypes=(out,),
                modes=modes,
                label="constant operand",
            )
        )
    return specs


def fused(op: str, options: str, **kw: Any) -> list[Spec]:
    """A binary op with a fused activation option: none (every dtype), RELU, RELU6."""
    specs = binary(op, options=options, FusedActivationFunction=A.NONE, **kw)
    kw.pop("dtypes", None)
    for act, name in ((A.RELU, " relu"), (A.RELU6, " relu6")):
        for s in binary(op, options=options, FusedActivationFunction=act, **kw)[:2]:
            specs.append(replace(s, label=s.label + name))
    return specs


def reduce_specs(op: str, *, modes: tuple[Mode, ...] = (F,), dtype: Any = np.float32) -> list:
    specs = []
    same = op in ("REDUCE_MAX", "REDUCE_MIN")  # LiteRT keeps the input's int8 parameters
    for axes, keep in (([1], False), ([1, 2], True), ([-1], False), ([0, 1, 2, 3], False)):
        specs.append(
            Spec(
                op,
                (In((2, 3, 4, 5), dtype), Const(np.array(axes, i32), i32, Role.PARAM)),
                "ReducerOptions",
                {"KeepDims": keep},
                modes=modes if dtype == np.float32 else (F,),
                same_quant=same,
                label=f"axes {axes} keep {keep}",
            )
        )
    return specs


def conv_specs() -> list[Spec]:
    specs = []
    w = _r(4, 3, 3, 3, seed=1)
    bias = _r(4, seed=2)
    for stride, dilation, padding, act in (
        (1, 1, P.SAME, A.NONE),
        (2, 1, P.SAME, A.RELU),
        (1, 2, P.VALID, A.RELU6),
        (2, 1, P.VALID, A.NONE),
    ):
        specs.append(
            Spec(
                "CONV_2D",
                (
                    In((1, 9, 9, 3)),
                    Const(w, role=Role.WEIGHT),
                    Const(bias, role=Role.BIAS),
                ),
                "Conv2DOptions",
                {
                    "Padding": padding,
                    "StrideW": stride,
                    "StrideH": stride,
                    "DilationWFactor": dilation,
                    "DilationHFactor": dilation,
                    "FusedActivationFunction": act,
                },
                modes=(F, F16, I8, I8C, I16),
                label=f"stride {stride} dilation {dilation} padding {padding} act {act}",
            )
        )
    specs.append(
        Spec(
            "CONV_2D",
            (
                In((1, 6, 6, 3), dynamic=(0,)),
                Const(w, role=Role.WEIGHT),
                Const(bias, role=Role.BIAS),
            ),
            "Conv2DOptions",
            {"Padding": P.SAME, "StrideW": 1, "StrideH": 1},
            label="dynamic batch",
        )
    )
    for multiplier, stride, padding in ((1, 1, P.SAME), (2, 2, P.SAME), (1, 2, P.VALID)):
        specs.append(
            Spec(
                "DEPTHWISE_CONV_2D",
                (
                    In((1, 8, 8, 3)),
                    Const(_r(1, 3, 3, 3 * multiplier, seed=3), role=Role.WEIGHT, channel_axis=3),
                    Const(_r(3 * multiplier, seed=4), role=Role.BIAS),
                ),
                "DepthwiseConv2DOptions",
                {
                    "Padding": padding,
                    "StrideW": stride,
                    "StrideH": stride,
                    "DepthMultiplier": multiplier,
                    "DilationWFactor": 1,
                    "DilationHFactor": 1,
                    "FusedActivationFunction": A.RELU6,
                },
                modes=(F, F16, I8, I8C, I16),
                label=f"multiplier {multiplier} stride {stride} padding {padding}",
            )
        )
    for keep, bias_on, shape in (
        (False, True, (2, 6)),
        (True, True, (2, 3, 6)),
        (False, False, (2, 6)),
    ):
        inputs: tuple[In | Const, ...] = (In(shape), Const(_r(5, 6, seed=5), role=Role.WEIGHT))
        if bias_on:
            inputs += (Const(_r(5, seed=6), role=Role.BIAS),)
        specs.append(
            Spec(
                "FULLY_CONNECTED",
                inputs,
                "FullyConnectedOptions",
                {"KeepNumDims": keep, "FusedActivationFunction": A.RELU},
                modes=(F, F16, I8, I8C, I16),
                label=f"keep_num_dims {keep} bias {bias_on} input {list(shape)}",
            )
        )
    specs.append(
        Spec(
            "FULLY_CONNECTED",
            (In((3, 6), dynamic=(0,)), Const(_r(5, 6, seed=5), role=Role.WEIGHT)),
            "FullyConnectedOptions",
            {},
            label="dynamic batch",
        )
    )
    for stride, padding in ((2, P.SAME), (1, P.VALID)):
        out = 8 if stride == 2 else 6
        specs.append(
            Spec(
                "TRANSPOSE_CONV",
                (
                    Const(np.array([1, out, out, 2], i32), i32, Role.PARAM),
                    Const(_r(2, 3, 3, 3, seed=8), role=Role.WEIGHT),
                    In((1, 4, 4, 3)),
                ),
                "TransposeConvOptions",
                {"Padding": padding, "StrideW": stride, "StrideH": stride},
                modes=(F, F16, I8C, I16),
                label=f"stride {stride} padding {padding}",
            )
        )
    for op in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
        for size, stride, padding in ((2, 2, P.VALID), (3, 1, P.SAME), (3, 2, P.SAME)):
            specs.append(
                Spec(
                    op,
                    (In((1, 7, 7, 3)),),
                    "Pool2DOptions",
                    {
                        "Padding": padding,
                        "StrideW": stride,
                        "StrideH": stride,
                        "FilterWidth": size,
                        "FilterHeight": size,
                    },
                    modes=(F, I8, I16) if op != "L2_POOL_2D" else (F,),
                    same_quant=True,
                    label=f"size {size} stride {stride} padding {padding}",
                )
            )
    return specs


def shape_specs() -> list[Spec]:
    P_ = Role.PARAM

    def p(v: Any, dtype: Any = i32) -> Const:
        return Const(np.array(v, dtype), dtype, P_)

    x4 = In((2, 3, 4, 5))
    specs = [
        Spec("RESHAPE", (x4, p([6, 20])), modes=(F, I8, I16), same_quant=True, label="shape input"),
        Spec("RESHAPE", (x4, p([-1, 5])), modes=(F, I8, I16), same_quant=True, label="-1"),
        Spec("RESHAPE", (In((2, 12), dynamic=(0,)), p([-1, 3, 4])), label="dynamic batch"),
        Spec("SQUEEZE", (In((1, 3, 1, 5)),), "SqueezeOptions", {}, label="all unit axes"),
        Spec(
            "SQUEEZE",
            (In((1, 3, 1, 5), dynamic=(0,)),),
            "SqueezeOptions",
            {"SqueezeDims": [2]},
            modes=(F, I8, I16),
            same_quant=True,
            label="squeeze_dims, dynamic batch",
        ),
        Spec("RESHAPE", (x4,), "ReshapeOptions", {"NewShape": [24, 5]}, label="new_shape"),
        Spec(
            "EXPAND_DIMS", (In((3, 4)), p(1)), modes=(F, I8, I16), same_quant=True, label="axis 1"
        ),
        Spec("EXPAND_DIMS", (In((3, 4)), p(-1)), label="axis -1"),
        Spec("TRANSPOSE", (x4, p([0, 3, 1, 2])), modes=(F, I8, I16), same_quant=True, label="nchw"),
        Spec("TRANSPOSE", (In((3, 4)), p([1, 0])), label="2d"),
        Spec("CONCATENATION", (x4, In((2, 3, 4, 2))), "ConcatenationOptions", {"Axis": 3}),
        Spec(
            "CONCATENATION",
            (x4, In((2, 3, 4, 5)), In((2, 3, 4, 5))),
            "ConcatenationOptions",
            {"Axis": 0},
            modes=(F, I8, I16),
            same_quant=True,
            label="three inputs",
        ),
        Spec("PACK", (In((3, 4)), In((3, 4))), "PackOptions", {"Axis": 1, "ValuesCount": 2}),
        Spec(
            "UNPACK", (In((3, 4)),), "UnpackOptions", {"Axis": 0, "Num": 3}, out_dtypes=(None,) * 3
        ),
        Spec("SPLIT", (p(1), x4), "SplitOptions", {"NumSplits": 3}, out_dtypes=(None,) * 3),
        Spec(
            "SPLIT_V",
            (x4, p([1, 3]), p(2)),
            "SplitVOptions",
            {"NumSplits": 2},
            out_dtypes=(None,) * 2,
        ),
        Spec(
            "SLICE",
            (x4, p([0, 1, 1, 0]), p([2, 2, -1, 3])),
            modes=(F, I8, I16),
            same_quant=True,
            out_shape=(2, 2, 3, 3),
        ),
        Spec("PAD", (x4, p([[0, 0], [1, 1], [0, 2], [0, 0]])), modes=(F, I8, I16), same_quant=True),
        Spec("PADV2", (x4, p([[0, 0], [1, 1], [0, 2], [0, 0]]), Const(np.float32(0.5)))),
        Spec(
            "MIRROR_PAD",
            (x4, p([[0, 0], [1, 1], [2, 2], [0, 0]])),
            "MirrorPadOptions",
            {"Mode": 0},
            label="reflect",
        ),
        Spec(
            "MIRROR_PAD",
            (x4, p([[0, 0], [1, 1], [2, 2], [0, 0]])),
            "MirrorPadOptions",
            {"Mode": 1},
            label="symmetric",
        ),
        Spec("TILE", (In((2, 3)), p([2, 3]))),
        Spec("BROADCAST_TO", (In((3, 1)), p([2, 3, 4])), version=2),
        Spec("REVERSE_V2", (x4, p([1, 2]))),
        Spec(
            "GATHER",
            (x4, p([2, 0, 1, 1])),
            "GatherOptions",
            {"Axis": 1},
            modes=(F, I8, I16),
            same_quant=True,
        ),
        Spec(
            "GATHER", (x4, p([[0, 1], [1, 0]])), "GatherOptions", {"Axis": 0}, label="2-d indices"
        ),
        Spec("GATHER_ND", (x4, p([[0, 1], [1, 2]]))),
        Spec("SCATTER_ND", (p([[0], [2]]), In((2, 4)), p([3, 4])), label="updates fed"),
        Spec("CAST", (In((3, 4), low=-5, high=5),), out_dtypes=(i32,), label="float to int32"),
        Spec("CAST", (In((3, 4), i32, -5, 5),), out_dtypes=(np.float32,), label="int32 to float"),
        Spec("SHAPE", (x4,), "ShapeOptions", {"OutType": tfl.TensorType.INT32}, out_dtypes=(i32,)),
        Spec("FILL", (p([2, 3]), Const(np.float32(1.5)))),
        Spec("RANGE", (p(1), p(10), p(2)), out_dtypes=(i32,)),
        Spec(
            "ONE_HOT",
            (p([0, 2, 1]), p(4), Const(np.float32(1)), Const(np.float32(0))),
            "OneHotOptions",
            {"Axis": -1},
        ),
        Spec(
            "ARG_MAX",
            (x4, p([3])),
            "ArgMaxOptions",
            {"OutputType": tfl.TensorType.INT32},
            out_dtypes=(i32,),
        ),
        Spec(
            "ARG_MIN",
            (x4, p([1])),
            "ArgMinOptions",
            {"OutputType": tfl.TensorType.INT32},
            out_dtypes=(i32,),
        ),
        Spec("TOPK_V2", (In((3, 6)), p(2)), out_dtypes=(None, i32)),
        Spec("CUMSUM", (In((3, 6)), p(1)), "CumsumOptions", {"Exclusive": False, "Reverse": False}),
        Spec(
            "CUMSUM",
            (In((3, 6)), p(1)),
            "CumsumOptions",
            {"Exclusive": True, "Reverse": True},
            label="exclusive reverse",
        ),
        Spec("SELECT", (In((2, 3), BOOL), In((2, 3)), In((2, 3))), modes=(F, I8, I16)),
        Spec("SELECT", (In((4,), BOOL), In((4, 3)), In((4, 3))), label="row condition"),
        Spec("SELECT_V2", (In((2, 1), BOOL), In((2, 3)), In((3,))), modes=(F, I8, I16)),
        Spec(
            "SELECT_V2",
            (In((2, 3), BOOL), In((2, 3)), Const(_r(2, 3, seed=13))),
            modes=(F, I8, I16),
            label="constant operand",
        ),
        Spec(
            "DEPTH_TO_SPACE",
            (In((1, 2, 3, 8)),),
            "DepthToSpaceOptions",
            {"BlockSize": 2},
            modes=(F, I8),
            same_quant=True,
        ),
        Spec(
            "SPACE_TO_DEPTH",
            (In((1, 4, 6, 2)),),
            "SpaceToDepthOptions",
            {"BlockSize": 2},
            modes=(F, I8),
            same_quant=True,
        ),
        Spec("SPACE_TO_BATCH_ND", (In((1, 4, 4, 2)), p([2, 2]), p([[0, 0], [0, 0]]))),
        Spec("BATCH_TO_SPACE_ND", (In((4, 2, 2, 2)), p([2, 2]), p([[0, 0], [0, 0]]))),
        Spec(
            "BATCH_MATMUL",
            (In((2, 3, 4)), In((2, 4, 5))),
            "BatchMatMulOptions",
            {},
            modes=(F, I8, I16),
        ),
        Spec(
            "BATCH_MATMUL",
            (In((2, 4, 3)), In((5, 4))),
            "BatchMatMulOptions",
            {"AdjX": True, "AdjY": True},
            label="adjoint, broadcast",
        ),
        Spec("EMBEDDING_LOOKUP", (p([2, 0, 1]), Const(_r(4, 5, seed=9)))),
        Spec("ZEROS_LIKE", (In((3, 4)),)),
    ]
    for begin, end, strides, masks, label in (
        ([0, 1, 0, 1], [2, 3, 4, 5], [1, 1, 2, 2], {}, "strides"),
        ([0, 0, 0, 0], [1, 3, 4, 5], [1, 1, 1, 1], {"ShrinkAxisMask": 1}, "shrink axis 0"),
        (
            [0, 2, 0, 0],
            [0, 0, 0, 0],
            [1, -1, 1, 1],
            {"BeginMask": 13, "EndMask": 15},
            "masks, negative stride",
        ),
    ):
        specs.append(
            Spec(
                "STRIDED_SLICE",
                (x4, p(begin), p(end), p(strides)),
                "StridedSliceOptions",
                masks,
                modes=(F, I8, I16),
                same_quant=True,
                label=label,
            )
        )
    for op, mode in (
        ("RESIZE_BILINEAR", "ResizeBilinearOptions"),
        ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
    ):
        for align, half in ((False, False), (True, False), (False, True)):
            specs.append(
                Spec(
                    op,
                    (In((1, 3, 4, 2)), p([6, 8])),
                    mode,
                    {"AlignCorners": align, "HalfPixelCenters": half},
                    modes=(F, I8, I16),
                    same_quant=True,
                    label=f"align {align} half {half}",
                )
            )
    return specs


def recurrent_specs() -> list[Spec]:
    """The sequence builtins on a batch-major [2, 5, 3] input, 4 units, zero states."""
    x, h = In((2, 5, 3)), 4

    def w(*shape: int, seed: int) -> Const:
        return Const(_r(*shape, seed=seed, low=-0.5, high=0.5), role=Role.WEIGHT)

    rnn = Spec(
        "UNIDIRECTIONAL_SEQUENCE_RNN",
        (
            x,
            w(h, 3, seed=21),
            w(h, h, seed=22),
            Const(_r(h, seed=23), role=Role.BIAS),
            State((2, h)),
        ),
        "SequenceRNNOptions",
        {"TimeMajor": False, "FusedActivationFunction": A.TANH},
    )
    gates = tuple(w(h, 3, seed=30 + k) for k in range(4))
    recurrent = tuple(w(h, h, seed=40 + k) for k in range(4))
    biases = tuple(Const(_r(h, seed=50 + k), role=Role.BIAS) for k in range(4))
    peepholes, projection, norms = (Absent(),) * 3, (Absent(),) * 2, (Absent(),) * 4
    states = (State((2, h)), State((2, h)))  # output state, cell state
    lstm = Spec(
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        (x, *gates, *recurrent, *peepholes, *biases, *projection, *states, *norms),
        "UnidirectionalSequenceLSTMOptions",
        {"FusedActivationFunction": A.TANH, "CellClip": 0.0, "ProjClip": 0.0, "TimeMajor": False},
    )
    return [rnn, lstm, *lstm_variant_specs()]


def lstm_variant_specs() -> list[Spec]:
    """UNIDIRECTIONAL_SEQUENCE_LSTM's variants: peepholes, CIFG, projection, layer norm,
    cell and projection clipping, and all of them together (float, as TFLite's float
    kernel; x [2, 5, 3], 4 cells); the one-step LSTM builtin (x [2, 3])."""
    h = 4

    def w(*shape: int, seed: int) -> Const:
        return Const(_r(*shape, seed=seed, low=-0.5, high=0.5), role=Role.WEIGHT)

    def vec(seed: int, low: float = -0.5, high: float = 0.5) -> Const:
        return Const(_r(h, seed=seed, low=low, high=high))

    def spec(
        label: str,
        *,
        cifg: bool = False,
        peephole: bool = False,
        projection: int = 0,
        norm: bool = False,
        cell_clip: float = 0.0,
        proj_clip: float = 0.0,
        one_step: bool = False,
    ) -> Spec:
        out = projection or h
        skip = (0,) if cifg else ()
        gates = tuple(Absent() if g in skip else w(h, 3, seed=60 + g) for g in range(4))
        recurrent = tuple(Absent() if g in skip else w(h, out, seed=70 + g) for g in range(4))
        peep = tuple(
            Absent() if not peephole or (cifg and k == 0) else vec(80 + k) for k in range(3)
        )
        biases = tuple(Absent() if g in skip else vec(90 + g) for g in range(4))
        proj: tuple[Const | Absent, ...] = (
            (w(projection, h, seed=95), Const(_r(projection, seed=96)))
            if projection
            else (Absent(), Absent())
        )
        norms: tuple[Const | Absent, ...] = tuple(
            Absent() if not norm or g in skip else vec(100 + g, 0.5, 1.5) for g in range(4)
        )
        options = {"FusedActivationFunction": A.TANH, "CellClip": cell_clip, "ProjClip": proj_clip}
        return Spec(
            "LSTM" if one_step else "UNIDIRECTIONAL_SEQUENCE_LSTM",
            (
                In((2, 3) if one_step else (2, 5, 3)),
                *gates,
                *recurrent,
                *peep,
                *biases,
                *proj,
                State((2, out)),
                State((2, h)),
                *norms,
            ),
            "LSTMOptions" if one_step else "UnidirectionalSequenceLSTMOptions",
            {**options, "KernelType": 0} if one_step else {**options, "TimeMajor": False},
            label=label,
        )

    def bidirectional(
        label: str, *, cifg: bool = False, peephole: bool = False, projection: int = 0
    ) -> Spec:
        clip = 0.4 if projection else 0.0
        one = spec("", cifg=cifg, peephole=peephole, projection=projection)
        weights = one.inputs[1:18]  # the same weights both ways; the states differ
        out = projection or h
        states = (State((2, out)), State((2, h)), State((2, out)), State((2, h)))
        return Spec(
            "BIDIRECTIONAL_SEQUENCE_LSTM",
            # time-major: LiteRT's batch-major kernel disagrees with its own time-major
            # one for more than one sequence (tests/unit/converter/test_tflite_ops_recurrent)
            (In((5, 2, 3)), *weights, *weights, *states, *(Absent(),) * 9),
            "BidirectionalSequenceLSTMOptions",
            {
                "FusedActivationFunction": A.TANH,
                "CellClip": clip,
                "ProjClip": clip,
                "TimeMajor": True,
                "MergeOutputs": True,
            },
            label=label,
        )

    return [
        spec("peephole", peephole=True),
        spec("cifg", cifg=True),
        spec("cifg peephole", cifg=True, peephole=True),
        spec("projection", projection=3),
        spec("layer norm", norm=True),
        spec("cell clip", cell_clip=0.3),
        spec("projection clip", projection=3, proj_clip=0.1),
        spec(
            "cifg peephole projection layer norm clips",
            cifg=True,
            peephole=True,
            projection=3,
            norm=True,
            cell_clip=0.5,
            proj_clip=0.2,
        ),
        bidirectional("plain"),
        bidirectional("cifg peephole projection clips", cifg=True, peephole=True, projection=3),
        spec("one step", one_step=True),
        spec(
            "one step cifg peephole projection layer norm",
            cifg=True,
            peephole=True,
            projection=3,
            norm=True,
            one_step=True,
        ),
    ]


def misc_specs() -> list[Spec]:
    """The remaining builtins TF/Keras converters emit: one plain case each."""

    def p(v: Any, dtype: Any = i32) -> Const:
        return Const(np.array(v, dtype), dtype, Role.PARAM)

    tanh = {"FusedActivationFunction": A.NONE}
    return [
        Spec("ADD_N", (In((2, 3)), In((2, 3)), In((2, 3))), "AddNOptions", {}),
        Spec("RANK", (In((2, 3, 4)),), "RankOptions", {}, out_dtypes=(i32,)),
        Spec("WHERE", (In((3, 4), BOOL),), "WhereOptions", {}, out_dtypes=(np.int64,)),
        Spec(
            "REVERSE_SEQUENCE",
            (In((2, 5, 3)), p([3, 5])),
            "ReverseSequenceOptions",
            {"SeqDim": 1, "BatchDim": 0},
        ),
        Spec("MATRIX_DIAG", (In((2, 3)),), "MatrixDiagOptions", {}),
        Spec("MATRIX_SET_DIAG", (In((2, 3, 3)), In((2, 3))), "MatrixSetDiagOptions", {}),
        Spec("BROADCAST_ARGS", (p([2, 1, 3]), p([4, 1])), out_dtypes=(i32,)),
        Spec("DYNAMIC_UPDATE_SLICE", (In((4, 5)), In((2, 2)), p([1, 2]))),
        Spec("SEGMENT_SUM", (In((4, 3)), p([0, 0, 1, 2])), "SegmentSumOptions", {}),
        *(
            Spec(op, (In((4, 3)), p([0, 2, 0, 1]), p(3)), options, {})
            for op, options in (
                ("UNSORTED_SEGMENT_SUM", "UnsortedSegmentSumOptions"),
                ("UNSORTED_SEGMENT_MAX", "UnsortedSegmentMaxOptions"),
                ("UNSORTED_SEGMENT_MIN", "UnsortedSegmentMinOptions"),
                ("UNSORTED_SEGMENT_PROD", "UnsortedSegmentProdOptions"),
            )
        ),
        Spec(
            "RIGHT_SHIFT", (In((3, 4), i32, 0, 100), In((3, 4), i32, 0, 3)), "RightShiftOptions", {}
        ),
        Spec(
            "BITWISE_XOR",
            (In((3, 4), i32, 0, 100), In((3, 4), i32, 0, 100)),
            "BitwiseXorOptions",
            {},
        ),
        Spec(
            "FAKE_QUANT",
            (In((3, 4)),),
            "FakeQuantOptions",
            {"Min": -1.0, "Max": 1.0, "NumBits": 8, "NarrowRange": False},
        ),
        Spec(
            "SPARSE_TO_DENSE",
            (
                p([[0, 1], [2, 3]]),
                p([3, 4]),
                Const(np.array([1.5, -2.0], np.float32)),
                Const(np.float32(0)),
            ),
            "SparseToDenseOptions",
            {"ValidateIndices": False},
        ),
        Spec(
            "UNIQUE",
            (In((6,)),),
            "UniqueOptions",
            {"IdxOutType": tfl.TensorType.INT32},
            out_dtypes=(None, i32),
        ),
        Spec(
            "CONV_3D",
            (
                In((1, 4, 5, 5, 2)),
                Const(_r(3, 3, 3, 2, 4, seed=60), role=Role.WEIGHT),
                Const(_r(4, seed=61), role=Role.BIAS),
            ),
            "Conv3DOptions",
            {
                "Padding": P.SAME,
                "StrideD": 1,
                "StrideW": 1,
                "StrideH": 1,
                "DilationDFactor": 1,
                "DilationWFactor": 1,
                "DilationHFactor": 1,
                **tanh,
            },
        ),
    ]


def _specs() -> list[Spec]:
    s: list[Spec] = []
    act_fixed = {I8: (1 / 256, -128), I16: (1 / 32768, 0)}
    s += unary("ABS", modes=(F, I8, I16))
    s += unary("CEIL")
    s += unary("FLOOR")
    s += unary("ROUND")
    s += unary("COS")
    s += unary("SIN")
    s += unary("EXP", modes=(F, I8, I16))
    s += unary("LOG", low=0.1, high=5.0, modes=(F, I8, I16))
    s += unary("SQRT", low=0.0, high=5.0)
    s += unary("RSQRT", low=0.1, high=5.0, modes=(F, I8, I16))
    s += unary("SQUARE")
    s += unary("NEG", modes=(F, I8, I16))
    s += unary("SIGN")
    s += unary("RELU", modes=(F, I8, I16))
    s += unary("RELU6", modes=(F, I8, I16))
    s += unary("RELU_N1_TO_1", modes=(F, I8))
    s += unary("RELU_0_TO_1", modes=(F, I8))
    s += unary("ELU", modes=(F, I8))
    s += unary("GELU", modes=(F, I8, I16), options="GeluOptions", Approximate=False)
    s += unary("HARD_SWISH", modes=(F, I8))
    s += unary("LOGISTIC", modes=(F, I8, I16), fixed=act_fixed)
    s += unary("TANH", modes=(F, I8, I16), fixed={I8: (1 / 128, 0), I16: (1 / 32768, 0)})
    s += unary("LEAKY_RELU", modes=(F, I8, I16), options="LeakyReluOptions", Alpha=0.2)
    s += unary("SOFTMAX", modes=(F, I8, I16), fixed=act_fixed, options="SoftmaxOptions", Beta=1.0)
    s += unary("LOG_SOFTMAX", modes=(F, I8), fixed={I8: (16 / 256, 127)})
    s += unary("L2_NORMALIZATION", modes=(F, I8), fixed={I8: (1 / 128, 0)}, options="L2NormOptions")
    s += unary(
        "LOCAL_RESPONSE_NORMALIZATION",
        options="LocalResponseNormalizationOptions",
        dynamic=False,
        Radius=2,
        Bias=1.0,
        Alpha=0.5,
        Beta=0.75,
    )
    s += [Spec("LOGICAL_NOT", (In((3, 4), BOOL),))]
    s += fused("ADD", "AddOptions", modes=(F, I8, I16), dtypes=(np.float32, i32))
    s += fused("SUB", "SubOptions", modes=(F, I8, I16), dtypes=(np.float32, i32))
    s += fused("MUL", "MulOptions", modes=(F, I8, I16), dtypes=(np.float32, i32))
    s += fused("DIV", "DivOptions", low=0.5, high=2.0)
    s += binary("MAXIMUM", modes=(F, I8, I16), dtypes=(np.float32, i32))
    s += binary("MINIMUM", modes=(F, I8, I16), dtypes=(np.float32, i32))
    s += binary("POW", low=0.5, high=2.0)
    s += binary("SQUARED_DIFFERENCE", modes=(F, I8))
    s += binary("FLOOR_DIV", low=1.0, high=5.0, dtypes=(np.float32, i32))
    s += binary("FLOOR_MOD", low=1.0, high=5.0, dtypes=(np.float32, i32))
    s += binary("ATAN2", broadcast=False)
    for op in ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL"):
        s += binary(op, out=BOOL, modes=(F, I8, I16), dtypes=(np.float32, i32), low=-3, high=3)
    for op in ("LOGICAL_AND", "LOGICAL_OR"):
        s += binary(op, dtypes=(BOOL,), const_second=False)
    s += [
        Spec(
            "PRELU",
            (In((1, 4, 4, 3)), Const(_r(3, seed=11, low=0, high=0.5), role=Role.ALPHA)),
            modes=(F, I8, I16),
            label="channel alpha",
        ),
        Spec(
            "PRELU",
            (In((1, 4, 4, 3)), Const(_r(1, 1, 3, seed=12, low=0, high=0.5))),
            label="alpha [1, 1, 3]",
        ),
    ]
    for op in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"):
        s += reduce_specs(op, modes=(F, I8, I16))
    s += reduce_specs("REDUCE_PROD")
    s += reduce_specs("REDUCE_ANY", dtype=BOOL)
    s += reduce_specs("REDUCE_ALL", dtype=BOOL)
    s += conv_specs()
    s += shape_specs()
    s += recurrent_specs()
    s += misc_specs()
    s += [
        Spec("QUANTIZE", (In((3, 4)),), modes=(I8, I16), label="from float"),
        Spec("DEQUANTIZE", (In((3, 4)),), modes=(I8, I16), label="to float"),
    ]
    return s


# ----------------------------------------------------------------------------- cases


def _valid_modes(spec: Spec) -> Iterator[Mode]:
    has_weight = any(isinstance(a, Const) and a.role is Role.WEIGHT for a in spec.inputs)
    for mode in spec.modes:
        if mode in (Mode.FLOAT16, Mode.INT8_CHANNEL) and not has_weight:
            continue
        yield mode


def cases() -> list[Case]:
    """Every generated case, in a stable order, names unique."""
    out: list[Case] = []
    seen: dict[str, int] = {}
    for spec in _specs():
        for mode in _valid_modes(spec):
            base = f"{spec.op.lower()}[{spec.label or 'default'}, {mode.value}]"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}#{seen[base]}"
            out.append(Case(name=name, op=spec.op, spec=spec, mode=mode, slow=spec.slow))
    return out


def covered_ops() -> set[str]:
    """Builtin ops that have at least one generated case."""
    return {s.op for s in _specs()}


__all__: Sequence[str] = [
    "Absent",
    "Case",
    "Const",
    "In",
    "Mode",
    "Role",
    "Spec",
    "State",
    "cases",
    "covered_ops",
]
Builder = Callable[[Case], tuple[bytes, dict[str, np.ndarray]]]
