"""More TFLite builtins, one op per model, compared with LiteRT: ADD_N, ROUND, SIGN,
RELU_0_TO_1, RANK, REDUCE_ANY/ALL, EMBEDDING_LOOKUP, L2_POOL_2D, SPACE_TO_BATCH_ND,
BATCH_TO_SPACE_ND, MIRROR_PAD SYMMETRIC, TOPK_V2 and SCATTER_ND."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.proto import tflite_schema_generated as tfl
from tests.unit.converter.tflite_builder import TfliteBuilder, conv, rand
from tests.unit.converter.tflite_ops_check import assert_matches_litert

pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)


def test_add_n_round_sign_and_relu_0_to_1():
    b = TfliteBuilder()
    x = b.input("x", [2, 5])
    s = b.output(b.tensor("sum", [2, 5]))
    b.op("ADD_N", [x, x, x], [s])
    for op in ("ROUND", "SIGN", "RELU_0_TO_1"):
        b.op(op, [x], [b.output(b.tensor(op.lower(), [2, 5]))])
    r = b.output(b.tensor("rank", [], np.int32))
    b.op("RANK", [x], [r])
    value = rand(2, 5, seed=1) * 3
    value[0, :4] = [0.5, 1.5, -2.5, 0.0]  # ties round to even, sign of 0 is 0
    assert_matches_litert(b.build(), {"x": value})


@pytest.mark.parametrize("op", ["REDUCE_ANY", "REDUCE_ALL"])
def test_reduce_any_and_all(op):
    b = TfliteBuilder()
    x = b.input("x", [3, 4], np.bool_)
    y = b.output(b.tensor("y", [3], np.bool_))
    b.op(op, [x, b.const("axes", [1], np.int32)], [y], "ReducerOptions", KeepDims=False)
    value = np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], np.bool_)
    assert_matches_litert(b.build(), {"x": value})


def test_embedding_lookup_topk_and_scatter_nd():
    b = TfliteBuilder()
    ids = b.input("ids", [3], np.int32)
    e = b.output(b.tensor("embedded", [3, 4]))
    b.op("EMBEDDING_LOOKUP", [ids, b.const("table", rand(6, 4, seed=3))], [e])
    x = b.input("x", [2, 6])
    v, i = b.output(b.tensor("values", [2, 3])), b.output(b.tensor("indices", [2, 3], np.int32))
    b.op("TOPK_V2", [x, b.const("k", 3, np.int32)], [v, i])
    updates = b.input("updates", [3, 2])
    s = b.output(b.tensor("scattered", [4, 2]))
    where = b.const("where", [[1], [3], [1]], np.int32)  # row 1 twice: the updates add up
    b.op("SCATTER_ND", [where, updates, b.const("shape", [4, 2], np.int32)], [s])
    value = rand(2, 6, seed=4)
    value[0, 4] = value[0, 1]  # a tie: the lower index first
    feeds = {"ids": np.array([5, 0, 2], np.int32), "x": value, "updates": rand(3, 2, seed=5)}
    assert_matches_litert(b.build(), feeds)


@pytest.mark.parametrize("padding", [tfl.Padding.SAME, tfl.Padding.VALID])
def test_l2_pool_2d(padding):
    b = TfliteBuilder()
    x = b.input("x", [1, 7, 6, 3])
    size = (4, 3) if padding == tfl.Padding.SAME else (3, 2)
    y = b.output(b.tensor("y", [1, *size, 3]))
    b.op(
        "L2_POOL_2D",
        [x],
        [y],
        "Pool2DOptions",
        Padding=padding,
        StrideW=2,
        StrideH=2,
        FilterWidth=3,
        FilterHeight=3,
    )
    assert_matches_litert(b.build(), {"x": rand(1, 7, 6, 3, seed=6)})


def test_space_to_batch_conv_batch_to_space_is_a_dilated_convolution():
    # What older converters write for an atrous convolution.
    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    spaced = b.tensor("spaced", [4, 4, 4, 2])
    b.op(
        "SPACE_TO_BATCH_ND",
        [x, b.const("block", [2, 2], np.int32), b.const("pads", [[1, 1], [1, 1]], np.int32)],
        [spaced],
    )
    w = b.const("w", rand(3, 3, 3, 2, seed=7))
    c = b.tensor("c", [4, 2, 2, 3])
    b.op(
        "CONV_2D",
        [spaced, w, b.const("bias", rand(3, seed=8))],
        [c],
        "Conv2DOptions",
        Padding=tfl.Padding.VALID,
        StrideW=1,
        StrideH=1,
        DilationWFactor=1,
        DilationHFactor=1,
    )
    y = b.output(b.tensor("y", [1, 4, 4, 3]))
    b.op(
        "BATCH_TO_SPACE_ND",
        [c, b.const("block2", [2, 2], np.int32), b.const("crops", [[0, 0], [0, 0]], np.int32)],
        [y],
    )
    cropped = b.output(b.tensor("cropped", [1, 3, 2, 3]))
    b.op(
        "BATCH_TO_SPACE_ND",
        [c, b.const("block3", [2, 2], np.int32), b.const("crops3", [[1, 0], [1, 1]], np.int32)],
        [cropped],
    )
    assert_matches_litert(b.build(), {"x": rand(1, 6, 6, 2, seed=9)})


def test_mirror_pad_symmetric_after_a_convolution():
    b = TfliteBuilder()
    x = b.input("x", [1, 4, 5, 2])
    c = conv(b, x, 2, 3, (4, 5))
    y = b.output(b.tensor("y", [1, 7, 7, 3]))
    pads = b.const("pads", [[0, 0], [2, 1], [1, 1], [0, 0]], np.int32)
    b.op("MIRROR_PAD", [c, pads], [y], "MirrorPadOptions", Mode=tfl.MirrorPadMode.SYMMETRIC)
    assert_matches_litert(b.build(), {"x": rand(1, 4, 5, 2, seed=10)})
