"""TFLite shape arithmetic, comparisons, logic and selection, one op per model, compared
with LiteRT; the SHAPE of a dynamic batch is evaluated when the model is planned."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import Interpreter
from tests.unit.converter.tflite_builder import TfliteBuilder, rand, run_litert
from tests.unit.converter.tflite_ops_check import assert_matches_litert

pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

A = rand(2, 3, 4, seed=1)
B = rand(3, 4, seed=2)
A[0, 0, :2] = B[0, :2]  # some equal pairs for the comparisons


def binary_model(op: str, a: np.ndarray, b: np.ndarray, out_dtype, options=None, **fields):
    builder = TfliteBuilder()
    x = builder.input("a", a.shape, a.dtype)
    y = builder.input("b", b.shape, b.dtype)
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = builder.output(builder.tensor("out", shape, out_dtype))
    builder.op(op, [x, y], [out], options, **fields)
    return builder.build()


@pytest.mark.parametrize(
    "op", ["EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL"]
)
def test_comparisons_broadcast(op):
    a = A.copy()
    a[1, 1, 1] = np.nan  # a >= b and a <= b are false on NaN, as are their halves
    assert_matches_litert(binary_model(op, a, B, np.bool_), {"a": a, "b": B})


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_logical_binary(op):
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 4)) > 0.5, rng.random((4,)) > 0.5
    assert_matches_litert(binary_model(op, a, b, np.bool_), {"a": a, "b": b})


def test_logical_not():
    builder = TfliteBuilder()
    x = builder.input("x", [5], np.bool_)
    out = builder.output(builder.tensor("out", [5], np.bool_))
    builder.op("LOGICAL_NOT", [x], [out])
    assert_matches_litert(builder.build(), {"x": np.array([1, 0, 0, 1, 1], np.bool_)})


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        ("FLOOR_DIV", np.float32),
        ("FLOOR_DIV", np.int32),
        ("FLOOR_MOD", np.float32),
        ("FLOOR_MOD", np.int32),
    ],
)
def test_floor_div_and_mod_take_the_divisors_sign(op, dtype):
    if dtype == np.int32:
        a = np.array([[7, -7, 7, -7, 0, 9]], np.int32)
        b = np.array([2, 2, -2, -2, 3, -4], np.int32)
    else:
        a, b = A[0] * 5, B + np.sign(B) * 0.5
    assert_matches_litert(binary_model(op, a, b, dtype), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
def test_select(op):
    builder = TfliteBuilder()
    c = builder.input("c", [2, 3, 4], np.bool_)
    x, y = builder.input("x", [2, 3, 4]), builder.input("y", [2, 3, 4])
    out = builder.output(builder.tensor("out", [2, 3, 4]))
    builder.op(op, [c, x, y], [out])
    feeds = {"c": rand(2, 3, 4, seed=5) > 0, "x": A, "y": rand(2, 3, 4, seed=6)}
    assert_matches_litert(builder.build(), feeds)


def test_select_with_a_row_condition():
    builder = TfliteBuilder()
    c = builder.input("c", [2], np.bool_)
    x, y = builder.input("x", [2, 3]), builder.input("y", [2, 3])
    out = builder.output(builder.tensor("out", [2, 3]))
    builder.op("SELECT", [c, x, y], [out])
    feeds = {"c": np.array([True, False]), "x": B[:2, :3], "y": A[0, :2, :3]}
    assert_matches_litert(builder.build(), feeds)


def test_select_v2_broadcasts_a_scalar_branch():
    builder = TfliteBuilder()
    c = builder.input("c", [3, 4], np.bool_)
    x = builder.input("x", [3, 4])
    out = builder.output(builder.tensor("out", [3, 4]))
    builder.op("SELECT_V2", [c, x, builder.const("zero", 0.0)], [out])
    assert_matches_litert(builder.build(), {"c": B > 0, "x": B})


def test_slice_with_a_size_to_the_end():
    builder = TfliteBuilder()
    x = builder.input("x", [2, 3, 4])
    out = builder.output(builder.tensor("out", [1, 2, 3]))
    begin = builder.const("begin", [1, 0, 1], np.int32)
    size = builder.const("size", [-1, 2, 3], np.int32)
    builder.op("SLICE", [x, begin, size], [out])
    assert_matches_litert(builder.build(), {"x": A})


def test_range_fill_and_zeros_like():
    builder = TfliteBuilder()
    x = builder.input("x", [3, 4])
    r = builder.output(builder.tensor("range", [4], np.int32))
    consts = [builder.const(n, v, np.int32) for n, v in (("start", 2), ("limit", 10), ("d", 2))]
    builder.op("RANGE", consts, [r])
    f = builder.output(builder.tensor("fill", [2, 3]))
    builder.op("FILL", [builder.const("dims", [2, 3], np.int32), builder.const("v", 1.5)], [f])
    z = builder.output(builder.tensor("zeros", [3, 4]))
    builder.op("ZEROS_LIKE", [x], [z])
    assert_matches_litert(builder.build(), {"x": B})


def _flatten_with_dynamic_batch() -> bytes:
    # What Keras writes for Flatten on a dynamic batch: SHAPE -> STRIDED_SLICE -> PACK
    # -> RESHAPE, plus a FILL of the batch's shape and a FLOOR_DIV of the batch.
    b = TfliteBuilder()
    x = b.input("x", [1, 2, 3], signature=[-1, 2, 3])
    shape = b.tensor("shape", [3], np.int32)
    b.op("SHAPE", [x], [shape], "ShapeOptions", OutType=2)
    batch = b.tensor("batch", [], np.int32)
    one = b.const("one", [1], np.int32)
    b.op(
        "STRIDED_SLICE",
        [shape, b.const("zero", [0], np.int32), one, one],
        [batch],
        "StridedSliceOptions",
        ShrinkAxisMask=1,
    )
    packed = b.tensor("packed", [2], np.int32)
    b.op(
        "PACK",
        [batch, b.const("minus_one", -1, np.int32)],
        [packed],
        "PackOptions",
        ValuesCount=2,
        Axis=0,
    )
    flat = b.output(b.tensor("flat", [1, 6], signature=[-1, 6]))
    b.op("RESHAPE", [x, packed], [flat])
    half = b.output(b.tensor("half", [], np.int32))
    b.op("FLOOR_DIV", [batch, b.const("two", 2, np.int32)], [half])
    dims = b.tensor("dims", [2], np.int32)
    b.op(
        "PACK", [batch, b.const("four", 4, np.int32)], [dims], "PackOptions", ValuesCount=2, Axis=0
    )
    filled = b.output(b.tensor("filled", [1, 4], signature=[-1, 4]))
    b.op("FILL", [dims, b.const("value", 0.5)], [filled])
    return b.build()


@pytest.mark.parametrize("batch", [1, 3])
def test_shape_arithmetic_on_a_dynamic_batch_runs_when_planned(batch):
    data = _flatten_with_dynamic_batch()
    spore = convert_tflite(data)
    feeds = {"x": rand(batch, 2, 3, seed=batch)}
    want = run_litert(data, feeds)
    ours = Interpreter(model_content=spore)
    ours.resize_tensor_input(ours.get_input_details()[0]["index"], [batch, 2, 3])
    ours.allocate_tensors()
    got = ours.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)
    assert_matches_litert(data, {"x": rand(1, 2, 3)})


def _framing_with_dynamic_batch() -> bytes:
    # What an in-graph STFT framing writes on a dynamic batch: a STRIDED_SLICE whose end
    # is SHAPE(x), a RESHAPE to a computed shape with two open dimensions, EXPAND_DIMS and
    # SQUEEZE of the results.
    b = TfliteBuilder()
    x = b.input("x", [1, 12], signature=[-1, 12])
    shape = b.tensor("shape", [2], np.int32)
    b.op("SHAPE", [x], [shape], "ShapeOptions", OutType=2)
    cut = b.tensor("cut", [1, 12], signature=[-1, 12])
    b.op(
        "STRIDED_SLICE",
        [x, b.const("begin", [0, 0], np.int32), shape, b.const("strides", [1, 1], np.int32)],
        [cut],
        "StridedSliceOptions",
    )
    batch = b.tensor("batch", [1], np.int32)
    b.op("SLICE", [shape, b.const("b0", [0], np.int32), b.const("s1", [1], np.int32)], [batch])
    target = b.tensor("target", [3], np.int32)
    b.op(
        "CONCATENATION",
        [batch, b.const("frames", [-1, 4], np.int32)],
        [target],
        "ConcatenationOptions",
        Axis=0,
    )
    frames = b.tensor("frames_out", [1, 3, 4], signature=[-1, -1, 4])
    b.op("RESHAPE", [cut, target], [frames])
    expanded = b.tensor("expanded", [1, 3, 1, 4], signature=[-1, -1, 1, 4])
    b.op("EXPAND_DIMS", [frames, b.const("axis", -2, np.int32)], [expanded])
    back = b.output(b.tensor("back", [1, 3, 4], signature=[-1, -1, 4]))
    b.op("SQUEEZE", [expanded], [back], "SqueezeOptions", SqueezeDims=[2])
    return b.build()


@pytest.mark.parametrize("batch", [1, 2])
def test_slices_and_reshapes_computed_from_a_dynamic_batch(batch):
    data = _framing_with_dynamic_batch()
    feeds = {"x": rand(batch, 12, seed=batch)}
    want = run_litert(data, feeds)
    ours = Interpreter(model_content=convert_tflite(data))
    ours.resize_tensor_input(ours.get_input_details()[0]["index"], [batch, 12])
    ours.allocate_tensors()
    np.testing.assert_array_equal(ours.run(feeds)["back"], want["back"])
