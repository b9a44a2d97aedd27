"""int8/uint8 pooling, activations, softmax and data movement against int64 references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_with_padding_never_picks_the_pad(dtype):
    rng = np.random.default_rng(1)
    lo, _ = RANGES[np.dtype(dtype)]
    x = random_q(rng, (2, 3, 7, 6), dtype)
    x[0, 0] = lo  # a plane of minimum values: padding must not be mistaken for them
    got = run_one_op(
        OpCode.MAX_POOL2D,
        [(x, quant(0.1, 4), False)],
        quant(0.1, 4),
        dtype,
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    xp = np.full((2, 3, 9, 8), np.iinfo(np.int64).min, np.int64)
    xp[:, :, 1:8, 1:7] = x
    want = np.stack(
        [
            [xp[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(2, 3)) for j in range(3)]
            for i in range(4)
        ]
    ).transpose(2, 3, 0, 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("include_pad", [0, 1])
def test_avg_pool_divides_like_tflite(include_pad):
    rng = np.random.default_rng(2)
    x = random_q(rng, (1, 4, 6, 6), np.int8)
    zp = -7
    got = run_one_op(
        OpCode.AVG_POOL2D,
        [(x, quant(0.2, zp), False)],
        quant(0.2, zp),
        np.int8,
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        count_include_pad=include_pad,
    )
    want = np.empty(got.shape, np.int64)
    for i in range(3):
        for j in range(3):
            rows = [r for r in range(2 * i - 1, 2 * i + 2)]
            cols = [c for c in range(2 * j - 1, 2 * j + 2)]
            acc = np.zeros((1, 4), np.int64)
            count = 0
            for r in rows:
                for c in cols:
                    if 0 <= r < 6 and 0 <= c < 6:
                        acc += x[:, :, r, c]
                        count += 1
                    elif include_pad:
                        acc += zp
                        count += 1
            # TFLite: (acc +- count/2) / count with C's truncating division.
            want[:, :, i, j] = np.sign(acc) * ((np.abs(acc) + count // 2) // count)
    np.testing.assert_array_equal(got, want)


def test_global_average_pool_requantizes_the_sum():
    rng = np.random.default_rng(3)
    x = random_q(rng, (2, 5, 4, 3), np.uint8)
    got = run_one_op(
        OpCode.GLOBAL_AVG_POOL, [(x, quant(0.05, 100), False)], quant(0.02, 10), np.uint8
    )
    acc = (x.astype(np.int64) - 100).sum(axis=(2, 3), keepdims=True)
    real = np.float32(0.05).item() / (np.float32(0.02).item() * 12)
    np.testing.assert_array_equal(got, requantize(acc, real, 10, 0, 255))


@pytest.mark.parametrize("op, bounds", [(OpCode.RELU, (0.0, None)), (OpCode.RELU6, (0.0, 6.0))])
@pytest.mark.parametrize("same_params", [True, False])
def test_relu_family_are_clamps(op, bounds, same_params):
    rng = np.random.default_rng(4)
    x = random_q(rng, (3, 40), np.int8)
    sx, zx = 0.05, -20
    so, zo = (sx, zx) if same_params else (0.03, -128)
    got = run_one_op(op, [(x, quant(sx, zx), False)], quant(so, zo), np.int8)
    lo = max(-128, zo + int(round_away(np.float32(bounds[0]) / np.float32(so))))
    hi = (
        127
        if bounds[1] is None
        else min(127, zo + int(round_away(np.float32(bounds[1]) / np.float32(so))))
    )
    if same_params:
        want = np.clip(x, lo, hi)
    else:
        real = np.float32(sx).item() / np.float32(so).item()
        want = np.clip(mbqm(x.astype(np.int64) - zx, real) + zo, lo, hi)
    np.testing.assert_array_equal(got, want)


def test_clip_with_attribute_bounds():
    x = np.arange(-128, 128, dtype=np.int8)
    got = run_one_op(
        OpCode.CLIP, [(x, quant(0.1, 0), False)], quant(0.1, 0), np.int8, min=-1.0, max=2.5
    )
    np.testing.assert_array_equal(got, np.clip(x, -10, 25))


LUT_FUNCTIONS = {
    OpCode.SIGMOID: lambda v: 1 / (1 + np.exp(-v)),
    OpCode.TANH: np.tanh,
    OpCode.HARD_SWISH: lambda v: v * np.minimum(np.maximum(v + 3, 0), 6) / 6,
    OpCode.SILU: lambda v: v / (1 + np.exp(-v)),
}


@pytest.mark.parametrize("op", list(LUT_FUNCTIONS))
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_lookup_table_activations_cover_every_input(op, dtype):
    lo, hi = RANGES[np.dtype(dtype)]
    x = np.arange(lo, hi + 1).astype(dtype)
    sx, zx, so, zo = 0.06, lo + 120, 1 / 256, lo
    if op == OpCode.TANH:
        so, zo = 1 / 128, (lo + hi + 1) // 2
    elif op in (OpCode.HARD_SWISH, OpCode.SILU):
        so, zo = 0.04, lo + 20
    got = run_one_op(op, [(x, quant(sx, zx), False)], quant(so, zo), dtype)
    real = LUT_FUNCTIONS[op](np.float32(sx).item() * (x.astype(np.int64) - zx))
    want = np.clip(zo + round_away(real / np.float32(so).item()), lo, hi)
    np.testing.assert_array_equal(got, want)


def softmax_reference(x, sx, zo, ratio):
    d = x.max(axis=-1, keepdims=True).astype(np.int64) - x
    table = np.floor(np.exp(-np.float32(sx).item() * np.arange(256)) * 2**24 + 0.5)
    t = table.astype(np.int64)[d]
    total = t.sum(axis=-1, keepdims=True)
    return np.clip(zo + (2 * ratio * t + total) // (2 * total), -128, 127)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 300), st.floats(0.001, 0.5), st.integers(0, 2**31))
def test_softmax_is_exact_in_integers(rows, cols, sx, seed):
    rng = np.random.default_rng(seed)
    x = random_q(rng, (rows, cols), np.int8)
    got = run_one_op(OpCode.SOFTMAX, [(x, quant(sx, 3), False)], quant(1 / 256, -128), np.int8)
    np.testing.assert_array_equal(got, softmax_reference(x, sx, -128, 256))
    xi = x.astype(np.int64)
    probs = np.exp(sx * (xi - xi.max(axis=-1, keepdims=True)))
    probs /= probs.sum(axis=-1, keepdims=True)
    # One step of 1/256, plus the table's 2^-24 resolution.
    assert np.abs((got.astype(np.int64) + 128) / 256 - probs).max() <= 1 / 256 + 1e-6


def test_concat_requantizes_inputs_with_other_params():
    rng = np.random.default_rng(5)
    a, b = random_q(rng, (1, 3, 4), np.int8), random_q(rng, (1, 2, 4), np.int8)
    got = run_one_op(
        OpCode.CONCAT,
        [(a, quant(0.1, 2), False), (b, quant(0.3, -4), False)],
        quant(0.1, 2),
        np.int8,
        axis=1,
    )
    real = np.float32(0.3).item() / np.float32(0.1).item()
    want_b = np.clip(mbqm(b.astype(np.int64) + 4, real) + 2, -128, 127)
    np.testing.assert_array_equal(got, np.concatenate([a, want_b], axis=1))


def test_pad_fills_with_the_zero_point():
    x = np.full((1, 1, 2, 2), 50, np.uint8)
    got = run_one_op(OpCode.PAD, [(x, quant(0.5, 77), False)], None, pads=[0, 0, 1, 1, 0, 0, 1, 1])
    assert got.dtype == np.uint8 and got.shape == (1, 1, 4, 4)
    assert got[0, 0, 0, 0] == 77 and got[0, 0, 1, 1] == 50 and (got == 77).sum() == 12


@pytest.mark.parametrize(
    "op, attrs, fn",
    [
        (OpCode.RESHAPE, {"shape": [3, 8]}, lambda v: v.reshape(3, 8)),
        (OpCode.TRANSPOSE, {"perm": [2, 0, 1]}, lambda v: v.transpose(2, 0, 1)),
        (OpCode.FLATTEN, {"axis": 1}, lambda v: v.reshape(2, 12)),
        (OpCode.UNSQUEEZE, {"axes": [0]}, lambda v: v[None]),
    ],
)
def test_data_movement_keeps_values_and_params(op, attrs, fn):
    rng = np.random.default_rng(6)
    x = random_q(rng, (2, 3, 4), np.int8)
    got = run_one_op(op, [(x, quant(0.25, -3), False)], None, **attrs)
    np.testing.assert_array_equal(got, fn(x))
