"""int8/uint8 Conv2D, FullyConnected, MatMul, Add/Sub/Mul and the conversions against a
plain int64 reference of TFLite's arithmetic (tests/unit/lite/quantized_reference.py),
bit-exact, on models written with lite's builder and read back from bytes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import parse, serialize
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.kernels.quantized import conv as quantized_conv
from sporenet.lite.kernels.quantized.gemm import split_reduction
from sporenet.lite.ops import OpCode
from tests.unit.lite.quantized_reference import (
    RANGES,
    mbqm,
    quant,
    random_q,
    requantize,
    round_away,
    run_one_op,
)


def conv_reference(x, zx, sx, w, sw, bias, so, zo, lo, hi, pads, strides, group, dilation=1):
    """Direct convolution in int64 with the input padded by its zero point."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = pads
    xp = np.full((n, c, h + top + bottom, wd + left + right), zx, np.int64)
    xp[:, :, top : top + h, left : left + wd] = x
    oh = (xp.shape[2] - (kh - 1) * dilation - 1) // strides[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dilation - 1) // strides[1] + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    og = o // group
    for g in range(group):
        xs = xp[:, g * cg : (g + 1) * cg] - zx
        for i in range(kh):
            for j in range(kw):
                patch = xs[
                    :,
                    :,
                    i * dilation : i * dilation + strides[0] * (oh - 1) + 1 : strides[0],
                    j * dilation : j * dilation + strides[1] * (ow - 1) + 1 : strides[1],
                ]
                acc[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, i, j].astype(np.int64)
                )
    if bias is not None:
        acc += bias.reshape(1, -1, 1, 1)
    return requantize(acc, sx * np.asarray(sw, np.float64) / so, zo, lo, hi, channel_axis=1)


CONV_CASES = [
    # (x shape, out ch, kernel, pads, strides, group, dtype, per_channel)
    ((1, 3, 9, 9), 5, (3, 3), (1, 1, 1, 1), (1, 1), 1, np.int8, True),
    ((2, 4, 8, 7), 6, (3, 2), (0, 1, 2, 0), (2, 1), 2, np.int8, False),
    ((1, 8, 10, 10), 8, (3, 3), (1, 1, 1, 1), (2, 2), 8, np.int8, True),  # depthwise
    ((1, 16, 5, 5), 12, (1, 1), (0, 0, 0, 0), (1, 1), 1, np.uint8, False),  # pointwise
    ((1, 40, 6, 6), 64, (3, 3), (1, 1, 1, 1), (1, 1), 1, np.int8, True),
    ((1, 512, 3, 3), 4, (3, 3), (1, 1, 1, 1), (1, 1), 1, np.int8, True),  # chunked GEMM
    ((2, 12, 7, 9), 12, (3, 3), (1, 1, 1, 1), (1, 1), 12, np.uint8, True),  # depthwise s1
    ((1, 4, 6, 6), 4, (3, 3), (1, 0, 1, 2), (1, 2), 4, np.int8, False),  # few channels
    ((2, 3, 11, 11), 8, (7, 7), (3, 3, 3, 3), (2, 2), 1, np.int8, True),  # stem, batch 2
    ((1, 32, 3, 1), 48, (3, 1), (0, 0, 0, 0), (1, 1), 1, np.int8, True),  # matrix-vector
    ((1, 32, 9, 1), 32, (9, 1), (0, 0, 0, 0), (1, 1), 32, np.int8, True),  # streaming dw
    ((1, 16, 1, 1), 16, (3, 1), (1, 0, 1, 0), (1, 1), 16, np.uint8, False),  # padded, one pos
    ((1, 16, 3, 1), 8, (3, 1), (0, 0, 0, 0), (1, 1), 8, np.int8, True),  # 2 inputs a group
]


@pytest.fixture(params=["folded", "unfolded"])
def conv_route(request, monkeypatch):
    """Small layers run the folded route (output_stage.Folded); "unfolded" forces the
    GEMM + output stage routes on every layer, so both stay checked on the same cases."""
    if request.param == "unfolded":
        monkeypatch.setattr(quantized_conv, "FOLD_BYTES", -1)
    return request.param


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("activation", ["none", "relu6"])
def test_conv2d_matches_integer_reference(case, activation, conv_route):
    shape, o, (kh, kw), pads, strides, group, dtype, per_channel = case
    rng = np.random.default_rng(sum(shape) + o)
    lo, hi = RANGES[np.dtype(dtype)]
    x = random_q(rng, shape, dtype)
    zx = int(rng.integers(lo, hi + 1))
    sx = 0.02
    w = rng.integers(-127, 128, (o, shape[1] // group, kh, kw)).astype(np.int8)
    if shape[1] == 512:
        w[:] = 127  # every partial sum large: beyond float32's exact range
    sw = rng.uniform(0.001, 0.01, o) if per_channel else np.array([0.004])
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    so, zo = 0.05, int(rng.integers(lo, hi + 1) // 2)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(sx, zx), False), (w, quant(sw, 0, 0), True), (bias, None, True)],
        quant(so, zo),
        dtype,
        pads=list(pads),
        strides=list(strides),
        group=group,
        activation=activation,
    )
    clo, chi = lo, hi
    if activation == "relu6":
        clo = max(lo, zo)
        chi = min(hi, zo + int(round_away(np.float32(6.0) / np.float32(so))))
    want = conv_reference(
        x, zx, sx, w, np.broadcast_to(sw, (o,)), bias, so, zo, clo, chi, pads, strides, group
    )
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def _conv_kernels(monkeypatch):
    """The QConv2D kernels made from now on (a list that fills as they are built)."""
    made = []
    init = quantized_conv.QConv2D.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(quantized_conv.QConv2D, "__init__", record)
    return made


@pytest.mark.parametrize(
    "dtype, shape, kernel, raw",
    [
        (np.int8, (1, 24, 9, 1), (9, 1), True),
        (np.int8, (1, 64, 1, 1), (1, 1), True),
        (np.uint8, (1, 8, 9, 1), (9, 1), True),
        # Raw uint8 inputs reach 255 where x - z_x stays within 128: sums of 216 such
        # products leave the float route, so this layer keeps shifting its input.
        (np.uint8, (1, 24, 9, 1), (9, 1), False),
    ],
)
def test_conv_reading_its_input_unshifted_is_exact_at_the_extremes(
    dtype, shape, kernel, raw, conv_route, monkeypatch
):
    # The zero point joins the bias (or the folded offset), so the GEMM reads the raw
    # input; the largest weights and inputs at the dtype's ends.
    lo, hi = RANGES[np.dtype(dtype)]
    rng = np.random.default_rng(7)
    o = 16
    x = np.where(rng.random(shape) < 0.5, lo, hi).astype(dtype)
    w = np.where(rng.random((o, shape[1], *kernel)) < 0.8, 127, -127).astype(np.int8)
    zx = (lo + hi + 1) // 2
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    sw, so, zo = rng.uniform(0.001, 0.01, o), 0.5, 3
    made = _conv_kernels(monkeypatch)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(0.02, zx), False), (w, quant(sw, 0, 0), True), (bias, None, True)],
        quant(so, zo),
        dtype,
    )
    planned = made[-1]  # shape inference builds the kernel too
    shift = planned.fold.zero_point if planned.fold is not None else planned.gather_zero
    assert (shift == 0) == raw
    want = conv_reference(x, zx, 0.02, w, sw, bias, so, zo, lo, hi, (0, 0, 0, 0), (1, 1), 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize(
    "out_f, in_f, rows", [(11, 37, 4), (300, 64, 4), (3, 3000, 4), (64, 96, 1)]
)
def test_fully_connected_matches_integer_reference(
    dtype, per_channel, out_f, in_f, rows, conv_route
):
    # (300, 64): weights converted per call; (3, 3000): a reduction split in chunks;
    # (64, 96) on one row: a matrix-vector product, folded beyond FOLD_WEIGHT_BYTES.
    rng = np.random.default_rng(3)
    lo, hi = RANGES[np.dtype(dtype)]
    x = random_q(rng, (rows, in_f), dtype)
    w = rng.integers(-127, 128, (out_f, in_f)).astype(np.int8)
    sw = rng.uniform(0.001, 0.02, out_f) if per_channel else np.array([0.01])
    bias = rng.integers(-3000, 3000, out_f).astype(np.int32)
    zx, sx, so, zo = int(rng.integers(lo, hi)), 0.03, 0.2, (lo + hi) // 2 + 3
    got = run_one_op(
        OpCode.FULLY_CONNECTED,
        [(x, quant(sx, zx), False), (w, quant(sw, 0, 0), True), (bias, None, True)],
        quant(so, zo),
        dtype,
        activation="relu",
    )
    acc = (x.astype(np.int64) - zx) @ w.T.astype(np.int64) + bias
    want = requantize(
        acc, sx * np.broadcast_to(sw, (out_f,)) / so, zo, max(lo, zo), hi, channel_axis=1
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_fully_connected_with_one_output_rounds_negative_values_exactly(dtype):
    # One score (a wake word's head): the output stage's one-element route, without an
    # activation, so negative accumulators take the tie correction. A multiplier of 0.3
    # (a right shift of 1) and small accumulators of both signs: about half of the
    # negative ones round differently without it.
    rng = np.random.default_rng(5)
    lo, hi = RANGES[np.dtype(dtype)]
    w = rng.integers(-2, 3, (1, 64)).astype(np.int8)
    zx, zo = (lo + hi) // 2, (lo + hi) // 2 + 3
    for seed in range(40):
        noise = np.random.default_rng(seed).integers(-4, 5, (1, 64))
        x = np.clip(zx + noise, lo, hi).astype(dtype)
        got = run_one_op(
            OpCode.FULLY_CONNECTED,
            [(x, quant(0.03, zx), False), (w, quant([0.5], 0, 0), True)],
            quant(0.05, zo),
            dtype,
        )
        acc = (x.astype(np.int64) - zx) @ w.T.astype(np.int64)
        want = requantize(acc, np.array([0.03 * 0.5 / 0.05]), zo, lo, hi, channel_axis=1)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_streaming_conv_with_large_weights_folds_and_stays_exact(dtype, monkeypatch):
    # One output position (a streaming step) over 64 x 40 x 5 weights: float64 folded
    # weights of about 100 KiB, past twice the kept float32 size, within FOLD_VECTOR_BYTES.
    rng = np.random.default_rng(12)
    lo, hi = RANGES[np.dtype(dtype)]
    o, c, k = 64, 40, 5
    x = random_q(rng, (1, c, k, 1), dtype)
    # Weights of a trained layer's magnitudes: the folded sums stay exact in float64.
    w = rng.integers(-40, 41, (o, c, k, 1)).astype(np.int8)
    sw, bias = rng.uniform(0.001, 0.01, o), rng.integers(-5000, 5000, o).astype(np.int32)
    zx, so, zo = int(rng.integers(lo, hi)), 0.4, (lo + hi) // 2 - 5
    assert o * (c * k + 1) * 8 > 2 * quantized_conv.KEEP_FLOAT_BYTES
    assert o * (c * k + 1) * 8 <= quantized_conv.FOLD_VECTOR_BYTES
    made = _conv_kernels(monkeypatch)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(0.02, zx), False), (w, quant(sw, 0, 0), True), (bias, None, True)],
        quant(so, zo),
        dtype,
        strides=[3, 1],
    )
    assert made[-1].fold is not None
    want = conv_reference(x, zx, 0.02, w, sw, bias, so, zo, lo, hi, (0, 0, 0, 0), (3, 1), 1)
    np.testing.assert_array_equal(got, want)


def test_reduction_split_keeps_every_float32_partial_sum_exact():
    rng = np.random.default_rng(8)
    for o, k in [(5, 1000), (64, 4608), (3, 7)]:
        w = rng.integers(-127, 128, (o, k)).astype(np.int8)
        ranges = split_reduction(255, w)
        terms = np.abs(w.astype(np.int64)) * 255
        assert ranges[0][0] == 0 and ranges[-1][1] == k
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        for start, end in ranges:
            assert terms[:, start:end].sum(axis=1).max() < 2**24
            if end < k:  # greedy: one more column would break the bound
                assert terms[:, start : end + 1].sum(axis=1).max() >= 2**24


def test_matmul_matches_integer_reference():
    rng = np.random.default_rng(4)
    a = random_q(rng, (2, 5, 33), np.int8)
    b = random_q(rng, (2, 33, 7), np.int8)
    got = run_one_op(
        OpCode.MATMUL,
        [(a, quant(0.05, -3), False), (b, quant(0.04, 7), False)],
        quant(0.5, 2),
        np.int8,
    )
    acc = (a.astype(np.int64) + 3) @ (b.astype(np.int64) - 7)
    np.testing.assert_array_equal(got, requantize(acc, 0.05 * 0.04 / 0.5, 2, -128, 127))


def add_reference(a, sa, za, b, sb, zb, so, zo, lo, hi, subtract=False):
    twice_max = 2 * max(sa, sb)
    a1 = mbqm((a.astype(np.int64) - za) * (1 << 20), sa / twice_max)
    b1 = mbqm((b.astype(np.int64) - zb) * (1 << 20), sb / twice_max)
    raw = a1 - b1 if subtract else a1 + b1
    return requantize(raw, twice_max / ((1 << 20) * so), zo, lo, hi)


@pytest.mark.parametrize("op", [OpCode.ADD, OpCode.SUB])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_add_sub_match_integer_reference_with_broadcasting(op, dtype):
    rng = np.random.default_rng(5)
    lo, hi = RANGES[np.dtype(dtype)]
    a = random_q(rng, (2, 3, 4, 5), dtype)
    b = random_q(rng, (3, 1, 5), dtype)
    za, zb, zo = lo + 100, lo + 27, lo + 128
    got = run_one_op(
        op, [(a, quant(0.07, za), False), (b, quant(0.013, zb), False)], quant(0.1, zo), dtype
    )
    want = add_reference(
        a,
        np.float32(0.07).item(),
        za,
        b,
        np.float32(0.013).item(),
        zb,
        np.float32(0.1).item(),
        zo,
        lo,
        hi,
        op == OpCode.SUB,
    )
    np.testing.assert_array_equal(got, want)


def test_add_saturates_at_the_dtype_range():
    big = np.full((8,), 127, np.int8)
    got = run_one_op(
        OpCode.ADD,
        [(big, quant(1.0, 0), False), (big, quant(1.0, 0), False)],
        quant(0.5, 0),
        np.int8,
    )
    assert (got == 127).all()
    got = run_one_op(
        OpCode.ADD,
        [(-big, quant(1.0, 0), False), (-big, quant(1.0, 0), False)],
        quant(0.5, 0),
        np.int8,
    )
    assert (got == -128).all()


def test_mul_matches_integer_reference():
    rng = np.random.default_rng(6)
    a, b = random_q(rng, (4, 6), np.int8), random_q(rng, (6,), np.int8)
    got = run_one_op(
        OpCode.MUL,
        [(a, quant(0.1, 5), False), (b, quant(0.05, -9), False)],
        quant(0.3, -1),
        np.int8,
    )
    s = np.float32(0.1).item() * np.float32(0.05).item() / np.float32(0.3).item()
    want = requantize((a.astype(np.int64) - 5) * (b.astype(np.int64) + 9), s, -1, -128, 127)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_rounds_half_away_from_zero_and_saturates(dtype):
    lo, hi = RANGES[np.dtype(dtype)]
    zp = 3 if dtype == np.int8 else 128
    scale = np.float32(0.5)
    x = np.array(
        [0.25, -0.25, 0.75, -0.75, 1.0, 1e9, -1e9, 0.0, 0.2499999, np.float32(33.3)], np.float32
    )
    # The output tensor's declared dtype chooses int8 or uint8 (no attribute needed).
    got = run_one_op(OpCode.QUANTIZE, [(x, None, False)], quant(scale, zp), dtype)
    want = np.clip(round_away(x / scale) + zp, lo, hi)
    np.testing.assert_array_equal(got, want)
    assert got[0] == zp + 1 and got[1] == zp - 1  # ties away from zero, not to even


def test_dequantize_and_requantize_match_reference():
    rng = np.random.default_rng(7)
    x = random_q(rng, (3, 50), np.int8)
    got = run_one_op(OpCode.DEQUANTIZE, [(x, quant(0.037, -11), False)], None)
    want = (np.float64(np.float32(0.037)) * (x.astype(np.int64) + 11)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    got = run_one_op(
        OpCode.REQUANTIZE,
        [(x, quant(0.037, -11), False)],
        quant(0.011, 200),
        np.uint8,
        dtype="uint8",
    )
    real = np.float32(0.037).item() / np.float32(0.011).item()
    np.testing.assert_array_equal(got, requantize(x.astype(np.int64) + 11, real, 200, 0, 255))


@pytest.mark.parametrize("group", [1, 6])
def test_dilated_conv_matches_integer_reference(group, conv_route):
    rng = np.random.default_rng(21)
    x = random_q(rng, (1, 6, 11, 10), np.int8)
    w = rng.integers(-127, 128, (6, 6 // group, 3, 3)).astype(np.int8)
    sw = rng.uniform(0.002, 0.01, 6)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(0.02, 4), False), (w, quant(sw), True)],
        quant(0.04, -3),
        np.int8,
        pads=[2, 1, 2, 1],
        dilations=[2, 2],
        group=group,
    )
    want = conv_reference(
        x,
        4,
        np.float32(0.02).item(),
        w,
        sw.astype(np.float32),
        None,
        np.float32(0.04).item(),
        -3,
        -128,
        127,
        (2, 1, 2, 1),
        (1, 1),
        group,
        dilation=2,
    )
    np.testing.assert_array_equal(got, want)


def test_matmul_with_a_per_column_constant():
    rng = np.random.default_rng(22)
    a = random_q(rng, (5, 24), np.int8)
    b = rng.integers(-127, 128, (24, 4)).astype(np.int8)
    sb = np.array([0.01, 0.02, 0.005, 0.03], np.float32)
    got = run_one_op(
        OpCode.MATMUL,
        [(a, quant(0.05, 2), False), (b, quant(sb, 0, axis=1), True)],
        quant(0.2, -1),
        np.int8,
    )
    acc = (a.astype(np.int64) - 2) @ b.astype(np.int64)
    want = requantize(
        acc,
        np.float32(0.05).item() * sb.astype(np.float64) / np.float32(0.2).item(),
        -1,
        -128,
        127,
        channel_axis=1,
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("from_input", [False, True])
def test_transpose_into_a_folded_conv_is_a_strided_view(from_input):
    # A streaming step: a window (N, T, 1, C) built by a concat, transposed to NCHW and
    # read by a depthwise conv over T. The conv gathers through a transposing view (no
    # transpose step), of the graph input itself too.
    rng = np.random.default_rng(31)
    c, t = 24, 9
    x = random_q(rng, (1, t if from_input else t - 1, 1, c), np.int8)
    w = rng.integers(-127, 128, (c, 1, t, 1)).astype(np.int8)
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    sw, zx, so, zo = rng.uniform(0.001, 0.01, c), 5, 0.05, -3
    b = ModelBuilder()
    i = b.quantize(b.input("x", x.shape, x.dtype), 0.02, zx)
    if from_input:
        window = i
    else:
        one = b.constant("one", np.full((1, 1, 1, c), 7, np.int8), quantization=quant(0.02, zx))
        window = b.quantize(b.op(OpCode.CONCAT, [i, one], axis=1), 0.02, zx, dtype=np.int8)
    nchw = b.quantize(b.op(OpCode.TRANSPOSE, [window], perm=[0, 3, 1, 2]), 0.02, zx, dtype=np.int8)
    wi = b.constant("w", w, quantization=quant(sw, 0, 0))
    y = b.op(OpCode.CONV2D, [nchw, wi, b.constant("b", bias)], group=c)
    b.output(b.quantize(y, so, zo, dtype=np.int8), "y")
    it = Interpreter(model=parse(serialize(b.build())))
    got = it.run({"x": x})["y"]
    steps = [type(k).__name__ for k in it._plan.step_kernels]
    assert "QTranspose" not in steps
    window_q = x if from_input else np.concatenate([x, np.full((1, 1, 1, c), 7, np.int8)], 1)
    want = conv_reference(
        window_q.transpose(0, 3, 1, 2),
        zx,
        0.02,
        w,
        sw,
        bias,
        so,
        zo,
        -128,
        127,
        (0, 0, 0, 0),
        (1, 1),
        c,
    )
    np.testing.assert_array_equal(got, want)
