"""Data-movement kernels against NumPy and onnxruntime (ONNX semantics: negative axes,
Slice clamping and steps, Gather with negative indices, Split sizes, ...)."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode, ShapeError
from sporenet.lite.eager import run_op
from sporenet.lite.kernels.transform import contiguous_slice
from sporenet.lite.planner import plan
from tests.unit.lite.onnx_reference import run_onnx_op

I64 = np.int64


def _x(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


# --------------------------------------------------------------------------- Concat, Split


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, s in enumerate(shapes):
        s[axis] += k  # different sizes along the concatenation axis
    xs = [_x(s, k) for k, s in enumerate(shapes)]
    (ours,) = run_op(OpCode.CONCAT, xs, axis=axis)
    np.testing.assert_array_equal(ours, np.concatenate(xs, axis=axis))
    np.testing.assert_array_equal(ours, run_onnx_op("Concat", xs, axis=axis)[0])


def test_concat_single_input_and_int64():
    a = np.arange(6, dtype=I64).reshape(2, 3)
    np.testing.assert_array_equal(run_op(OpCode.CONCAT, [a], axis=1)[0], a)
    np.testing.assert_array_equal(run_op(OpCode.CONCAT, [a, a], axis=0)[0], np.vstack([a, a]))


def test_concat_errors():
    a, b = np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"input 1 has shape \[3, 3\], which does not match "
        r"input 0 \[2, 3\] outside axis 1",
    ):
        run_op(OpCode.CONCAT, [a, b], axis=1)
    with pytest.raises(ShapeError, match="input 1 is int32, input 0 is float32"):
        run_op(OpCode.CONCAT, [a, a.astype(np.int32)], axis=0)
    with pytest.raises(ShapeError, match=r"attribute 'axis' .* is required"):
        run_op(OpCode.CONCAT, [a, a])
    with pytest.raises(ShapeError, match="axis 2 is out of range for rank 2"):
        run_op(OpCode.CONCAT, [a, a], axis=2)


@pytest.mark.parametrize(
    ("shape", "axis", "split"),
    [
        ((6, 4), 0, [1, 2, 3]),
        ((2, 7, 3), 1, [7]),
        ((2, 7, 3), -2, [0, 3, 4]),
        ((4, 5), -1, [2, 3]),
    ],
)
@pytest.mark.parametrize("as_input", [False, True], ids=["attr", "input"])
def test_split_with_sizes(shape, axis, split, as_input):
    x = _x(shape)
    inputs = [x, np.array(split, I64)] if as_input else [x]
    attrs = {} if as_input else {"split": split}
    ours = run_op(OpCode.SPLIT, inputs, num_outputs=len(split), axis=axis, **attrs)
    expected = np.split(x, np.cumsum(split)[:-1], axis=axis)
    assert len(ours) == len(split)
    for a, b in zip(ours, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    theirs = run_onnx_op(
        "Split", [x, np.array(split, I64)], num_outputs=len(split), initializers=[1], axis=axis
    )
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("dim", "parts", "sizes"),
    [(6, 3, [2, 2, 2]), (7, 3, [3, 3, 1]), (5, 1, [5]), (8, 3, [3, 3, 2])],
)
def test_split_equal_parts_last_smaller(dim, parts, sizes):
    x = _x((2, dim))
    ours = run_op(OpCode.SPLIT, [x], num_outputs=parts, axis=1)
    assert [o.shape[1] for o in ours] == sizes
    np.testing.assert_array_equal(np.concatenate(ours, axis=1), x)
    theirs = _onnx_split_num_outputs(x, parts, axis=1)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def _onnx_split_num_outputs(x, parts, axis):
    """Opset-18 Split with its `num_outputs` attribute, whose name run_onnx_op reserves."""
    from onnx import TensorProto, helper

    from tests.references import run_ort_reference

    outs = [f"o{k}" for k in range(parts)]
    node = helper.make_node("Split", ["x"], outs, axis=axis, num_outputs=parts)
    graph = helper.make_graph(
        [node],
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_empty_tensor_value_info(o) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = min(model.ir_version, 10)
    return run_ort_reference(model, {"x": x}, outs)


def test_split_errors():
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"split \[1, 2\] must be non-negative and sum to "
        r"axis 1's size 6",
    ):
        run_op(OpCode.SPLIT, [x], num_outputs=2, axis=1, split=[1, 2])
    with pytest.raises(ShapeError, match=r"split \[3, 3\] has 2 parts but the node lists 3"):
        run_op(OpCode.SPLIT, [x], num_outputs=3, axis=1, split=[3, 3])
    with pytest.raises(ShapeError, match="cannot split axis 0 of size 4 into 3 parts"):
        # ceil(4 / 3) = 2 leaves nothing for the third part.
        run_op(OpCode.SPLIT, [x], num_outputs=3)


# --------------------------------------------------------------------------- Slice

SLICES = [
    # starts, ends, axes, steps
    ([1], [3], None, None),
    ([0, 1], [2, 100], [0, -1], None),  # end clamped to the dim
    ([-3], [-1], [1], None),  # negative bounds
    ([-100], [100], [2], [2]),  # clamped both sides, step 2
    ([4], [0], [2], [-1]),  # reversed, excluding index 0
    ([-1], [-1000], [2], [-2]),  # reversed through index 0
    ([100], [-100], [0], [-1]),  # start clamped to dim-1
    ([3], [1], [1], [1]),  # empty
    ([0, 0, 5], [2, 4, 0], [0, 1, 2], [1, 3, -2]),
    ([np.iinfo(I64).min], [np.iinfo(I64).max], [1], None),  # INT64 extremes as in exports
]


def _numpy_slice(x, starts, ends, axes, steps):
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        dim = x.shape[a]
        # Python slicing clamps like ONNX once the sentinels are mapped into range.
        s, e = max(min(s, 2 * dim), -2 * dim), max(min(e, 2 * dim), -2 * dim)
        index[a] = slice(s, None if (st < 0 and e < -dim) else e, st)
    return x[tuple(index)]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES, ids=str)
def test_slice_inputs_and_attributes(starts, ends, axes, steps):
    x = _x((3, 5, 6))
    expected = _numpy_slice(x, starts, ends, axes, steps)
    consts = [np.array(v, I64) if v is not None else None for v in (starts, ends, axes, steps)]
    while consts[-1] is None:
        consts.pop()
    (ours,) = run_op(OpCode.SLICE, [x, *consts])
    np.testing.assert_array_equal(ours, expected)
    assert ours.shape == expected.shape
    theirs = run_onnx_op("Slice", [x, *consts], initializers=range(1, 5))[0]
    np.testing.assert_array_equal(ours, theirs)
    if steps is None:  # opset-1 Slice had attributes and no steps
        attrs = {"starts": starts, "ends": ends}
        if axes is not None:
            attrs["axes"] = axes
        (from_attrs,) = run_op(OpCode.SLICE, [x], **attrs)
        np.testing.assert_array_equal(from_attrs, expected)


def test_slice_reads_the_input_at_run_time():
    b = ModelBuilder()
    x = b.input("x", (4, 4))
    y = b.op(OpCode.SLICE, [x], starts=[1, 0], ends=[3, 4], axes=[0, 1])
    b.output(y)
    p = plan(b.build())
    for seed in range(2):
        value = _x((4, 4), seed)
        p.arrays[x][...] = value
        p.run()
        np.testing.assert_array_equal(p.arrays[y], value[1:3])


def test_slice_errors():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError, match="step for axis 1 must not be 0"):
        run_op(
            OpCode.SLICE,
            [x, np.array([0], I64), np.array([2], I64), np.array([1], I64), np.array([0], I64)],
        )
    with pytest.raises(ShapeError, match=r"axes \[0, -2\] name the same axis twice"):
        run_op(OpCode.SLICE, [x], starts=[0, 0], ends=[1, 1], axes=[0, -2])
    with pytest.raises(ShapeError, match="must have the same length"):
        run_op(OpCode.SLICE, [x], starts=[0, 0], ends=[1])
    with pytest.raises(ShapeError, match="needs starts and ends"):
        run_op(OpCode.SLICE, [x], starts=[0])
    with pytest.raises(ShapeError, match=r"input 1 \(starts\) must be a constant"):
        run_op(OpCode.SLICE, [x, np.array([0], I64), np.array([1], I64)], constant_inputs=[0, 2])
    with pytest.raises(ShapeError, match=r"input 1 \(starts\) must hold integers, got float32"):
        run_op(OpCode.SLICE, [x, np.array([0], np.float32), np.array([1], I64)])


# --------------------------------------------------------------------------- Gather


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("indices", [[0, -1, 2, 2], [[1, 0], [-2, 3]], 2, -3], ids=str)
@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
def test_gather(axis, indices, constant):
    x = _x((4, 5, 6))
    idx = np.array(indices, I64)
    (ours,) = run_op(OpCode.GATHER, [x, idx], axis=axis, constant_inputs=None if constant else [0])
    np.testing.assert_array_equal(ours, np.take(x, idx, axis=axis))
    (theirs,) = run_onnx_op("Gather", [x, idx], axis=axis)
    np.testing.assert_array_equal(ours, theirs)


def test_gather_int32_indices_into_embedding_table():
    table = _x((10, 3))
    idx = np.array([[3, 9], [0, -10]], np.int32)
    (ours,) = run_op(OpCode.GATHER, [table, idx], constant_inputs=[0])
    np.testing.assert_array_equal(ours, table[idx])


def test_gather_errors():
    x = np.zeros((4, 5), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"index 5 is out of range for axis 1 of size 5 "
        r"\(expected -5..4\)",
    ):
        run_op(OpCode.GATHER, [x, np.array([0, 5], I64)], axis=1)
    with pytest.raises(ShapeError, match="index -5 is out of range for axis 0 of size 4"):
        run_op(OpCode.GATHER, [x, np.array(-5, I64)])
    with pytest.raises(ShapeError, match="indices must be int32 or int64, got float32"):
        run_op(OpCode.GATHER, [x, np.array([0], np.float32)])


# --------------------------------------------------------------------------- layout ops


@pytest.mark.parametrize("perm", [None, [0, 2, 1, 3], [3, 0, 1, 2], [0, 1, 2, 3]], ids=str)
def test_transpose(perm):
    x = _x((2, 3, 4, 5))
    attrs = {} if perm is None else {"perm": perm}
    (ours,) = run_op(OpCode.TRANSPOSE, [x], **attrs)
    np.testing.assert_array_equal(ours, np.transpose(x, perm))
    np.testing.assert_array_equal(ours, run_onnx_op("Transpose", [x], **attrs)[0])


def test_transpose_rejects_bad_perm():
    with pytest.raises(ShapeError, match=r"perm \[0, 0, 1\] is not a permutation of 0..2"):
        run_op(OpCode.TRANSPOSE, [np.zeros((1, 2, 3), np.float32)], perm=[0, 0, 1])


@pytest.mark.parametrize(
    ("shape", "axes"),
    [((1, 3, 1, 5), None), ((1, 3, 1, 5), [0]), ((1, 3, 1, 5), [-2, 0]), ((1,), [0])],
    ids=str,
)
def test_squeeze(shape, axes):
    x = _x(shape)
    expected = np.squeeze(x, axis=None if axes is None else tuple(axes))
    inputs = [x] if axes is None else [x, np.array(axes, I64)]
    (ours,) = run_op(OpCode.SQUEEZE, inputs)
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(ours, run_onnx_op("Squeeze", inputs, initializers=[1])[0])
    if axes is not None:
        np.testing.assert_array_equal(run_op(OpCode.SQUEEZE, [x], axes=axes)[0], expected)


@pytest.mark.parametrize(
    ("shape", "axes"),
    [((3, 5), [0]), ((3, 5), [-1]), ((3, 5), [0, 3]), ((3, 5), [1, -1]), ((), [0, 1])],
    ids=str,
)
def test_unsqueeze(shape, axes):
    x = _x(shape)
    expected = np.expand_dims(x, tuple(axes))
    (ours,) = run_op(OpCode.UNSQUEEZE, [x, np.array(axes, I64)])
    np.testing.assert_array_equal(ours, expected)
    (theirs,) = run_onnx_op("Unsqueeze", [x, np.array(axes, I64)], initializers=[1])
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(run_op(OpCode.UNSQUEEZE, [x], axes=axes)[0], expected)


def test_squeeze_unsqueeze_are_views_in_a_plan():
    b = ModelBuilder()
    x = b.input("x", (1, 3, 1))
    s = b.op(OpCode.SQUEEZE, [x], axes=[0, 2])
    u = b.op(OpCode.UNSQUEEZE, [s], axes=[0])
    y = b.op(OpCode.RELU, [u])
    b.output(y)
    p = plan(b.build())
    assert len(p.steps) == 1  # only Relu computes
    assert np.shares_memory(p.arrays[u], p.arrays[x])
    p.arrays[x][...] = [[[-1.0], [2.0], [-3.0]]]
    p.run()
    np.testing.assert_array_equal(p.arrays[y], [[0.0, 2.0, 0.0]])


def test_squeeze_unsqueeze_errors():
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"cannot squeeze axis 1 of size 3 \(input shape "
        r"\[1, 3\]\)",
    ):
        run_op(OpCode.SQUEEZE, [x], axes=[1])
    with pytest.raises(ShapeError, match="axes entry 3 is out of range for rank 3"):
        run_op(OpCode.UNSQUEEZE, [x], axes=[3])
    with pytest.raises(ShapeError, match="needs `axes`"):
        run_op(OpCode.UNSQUEEZE, [x])
    with pytest.raises(ShapeError, match=r"axes \[0, -4\] name the same axis twice"):
        run_op(OpCode.UNSQUEEZE, [x], axes=[0, -4])  # output rank 4: -4 is axis 0


@pytest.mark.parametrize(
    ("shape", "target"),
    [((3, 1), [2, 3, 4]), ((1,), [5]), ((2, 1, 4), [3, 1]), ((), [2, 2])],
    ids=str,
)
def test_expand(shape, target):
    x = _x(shape)
    (ours,) = run_op(OpCode.EXPAND, [x, np.array(target, I64)])
    np.testing.assert_array_equal(ours, x * np.ones(target, np.float32))
    (theirs,) = run_onnx_op("Expand", [x, np.array(target, I64)], initializers=[1])
    np.testing.assert_array_equal(ours, theirs)


def test_expand_error():
    with pytest.raises(ShapeError, match=r"input shape \[3\] does not broadcast to \[4\]"):
        run_op(OpCode.EXPAND, [np.zeros(3, np.float32)], shape=[4])


@pytest.mark.parametrize(
    ("shape", "repeats"),
    [((2, 3), [1, 1]), ((2, 3), [3, 2]), ((2, 1, 3), [2, 4, 1]), ((3,), [0])],
    ids=str,
)
def test_tile(shape, repeats):
    x = _x(shape)
    (ours,) = run_op(OpCode.TILE, [x, np.array(repeats, I64)])
    np.testing.assert_array_equal(ours, np.tile(x, repeats))
    (theirs,) = run_onnx_op("Tile", [x, np.array(repeats, I64)], initializers=[1])
    np.testing.assert_array_equal(ours, theirs)


def test_tile_error():
    with pytest.raises(ShapeError, match=r"repeats \[2\] must hold 2 non-negative values"):
        run_op(OpCode.TILE, [np.zeros((2, 2), np.float32)], repeats=[2])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode):
    x = _x((2, 8, 3, 4))
    (ours,) = run_op(OpCode.DEPTH_TO_SPACE, [x], blocksize=2, mode=mode)
    assert ours.shape == (2, 2, 6, 8)
    np.testing.assert_array_equal(ours, run_onnx_op("DepthToSpace", [x], blocksize=2, mode=mode)[0])
    (back,) = run_op(OpCode.SPACE_TO_DEPTH, [ours], blocksize=2)
    np.testing.assert_array_equal(back, run_onnx_op("SpaceToDepth", [ours], blocksize=2)[0])
    if mode == "DCR":  # SpaceToDepth inverts the DCR arrangement
        np.testing.assert_array_equal(back, x)


def test_depth_to_space_errors():
    with pytest.raises(ShapeError, match="channels divide by blocksize"):
        run_op(OpCode.DEPTH_TO_SPACE, [np.zeros((1, 6, 2, 2), np.float32)], blocksize=2)
    with pytest.raises(ShapeError, match="height and width divide by blocksize 3"):
        run_op(OpCode.SPACE_TO_DEPTH, [np.zeros((1, 1, 6, 4), np.float32)], blocksize=3)
    with pytest.raises(ShapeError, match="mode must be 'DCR' or 'CRD'"):
        run_op(OpCode.DEPTH_TO_SPACE, [np.zeros((1, 4, 2, 2), np.float32)], blocksize=2, mode="XYZ")


# --------------------------------------------------------------------------- Cast, Where, Shape


@pytest.mark.parametrize(
    ("to", "dtype"),
    [
        (1, np.float32),
        (7, np.int64),
        (6, np.int32),
        (9, np.bool_),
        (11, np.float64),
        ("int8", np.int8),
        (10, np.float16),
    ],
)
def test_cast(to, dtype):
    x = np.array([-2.7, -0.5, 0.0, 0.5, 1.5, 100.9], np.float32)
    (ours,) = run_op(OpCode.CAST, [x], to=to)
    assert ours.dtype == dtype
    if isinstance(to, int):
        np.testing.assert_array_equal(ours, run_onnx_op("Cast", [x], to=to)[0])
    np.testing.assert_array_equal(ours, x.astype(dtype))


def test_cast_float_to_int_truncates_and_int_to_float():
    (ours,) = run_op(OpCode.CAST, [np.array([-2.7, 2.7], np.float32)], to=7)
    assert ours.tolist() == [-2, 2]
    (back,) = run_op(OpCode.CAST, [np.array([3, -4], I64)], to=1)
    assert back.dtype == np.float32 and back.tolist() == [3.0, -4.0]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("to", [6, 7])  # int32, int64
def test_cast_of_nan_and_out_of_range_values_follows_onnxruntime_without_warnings(to):
    """onnxruntime casts with C's conversion (a T5 position bucket casts log(0)); so does
    NumPy on the same CPU, and the kernel keeps NumPy's warning about it quiet."""
    x = np.array([np.nan, -np.inf, np.inf, 1e20, -1e20, 2.5], np.float32)
    (ours,) = run_op(OpCode.CAST, [x], to=to)
    np.testing.assert_array_equal(ours, run_onnx_op("Cast", [x], to=to)[0])


def test_cast_rejects_unknown_dtype():
    with pytest.raises(ShapeError, match="attribute 'to' must be one of the ONNX dtype codes"):
        run_op(OpCode.CAST, [np.zeros(2, np.float32)], to=8)  # 8 is STRING in ONNX


@pytest.mark.parametrize(
    ("c", "x", "y"),
    [((2, 3), (2, 3), (2, 3)), ((3,), (2, 3), ()), ((2, 1), (1, 3), (2, 3))],
    ids=str,
)
def test_where(c, x, y):
    rng = np.random.default_rng(5)
    cond = rng.random(c) > 0.5
    a, b = _x(x, 1), _x(y, 2)
    (ours,) = run_op(OpCode.WHERE, [cond, a, b])
    np.testing.assert_array_equal(ours, np.where(cond, a, b))
    np.testing.assert_array_equal(ours, run_onnx_op("Where", [cond, a, b])[0])


def test_where_errors():
    x = np.zeros(3, np.float32)
    with pytest.raises(ShapeError, match="condition must be bool, got float32"):
        run_op(OpCode.WHERE, [x, x, x])
    with pytest.raises(ShapeError, match="x and y must share a dtype, got float32 and int64"):
        run_op(OpCode.WHERE, [x > 0, x, x.astype(I64)])
    with pytest.raises(ShapeError, match=r"shapes \[3\], \[3\] and \[4\] do not broadcast"):
        run_op(OpCode.WHERE, [x > 0, x, np.zeros(4, np.float32)])


@pytest.mark.parametrize(
    ("start", "end"), [(None, None), (1, None), (-2, None), (0, -1), (-100, 100), (3, 1)], ids=str
)
def test_shape(start, end):
    x = _x((2, 3, 4, 5))
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    (ours,) = run_op(OpCode.SHAPE, [x], **attrs)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, run_onnx_op("Shape", [x], opset=15, **attrs)[0])


def test_shape_follows_a_resized_batch():
    b = ModelBuilder()
    x = b.input("x", (-1, 3))
    b.output(b.op(OpCode.SHAPE, [x]), name="shape")
    model = b.build()
    from sporenet.lite import Interpreter

    interp = Interpreter(model=model)
    out = interp.run({"x": np.zeros((5, 3), np.float32)})
    assert out["shape"].tolist() == [5, 3]


def test_transform_ops_in_a_planned_graph():
    # Split's several outputs, a runtime-index Gather, Transpose and Concat through the
    # planner's arena (buffers reused by lifetime) rather than one op at a time.
    from sporenet.lite import Interpreter

    b = ModelBuilder()
    x = b.input("x", (-1, 6))
    idx = b.input("idx", (2,), np.int64)
    left, right = b.op_multi(OpCode.SPLIT, [x], 2, axis=1)
    swapped = b.op(OpCode.CONCAT, [right, left], axis=1)
    t = b.op(OpCode.TRANSPOSE, [swapped])
    rows = b.op(OpCode.GATHER, [t, idx], axis=0)
    b.output(b.op(OpCode.UNSQUEEZE, [rows], axes=[0]), name="y")
    interp = Interpreter(model=b.build())
    for batch in (3, 5):
        xv = _x((batch, 6), batch)
        iv = np.array([-1, 2], I64)
        y = interp.run({"x": xv, "idx": iv})["y"]
        expected = np.concatenate([xv[:, 3:], xv[:, :3]], axis=1).T[iv][None]
        np.testing.assert_array_equal(y, expected)


# --------------------------------------------------------------------------- views


@pytest.mark.parametrize(
    "shape, out, steps, expected",
    [
        ((1, 5, 1, 4), (1, 2, 1, 4), (1, 1, 1, 1), True),  # a window of whole rows
        ((4, 5), (1, 5), (1, 1), True),  # one row
        ((4, 5), (4, 1), (1, 1), False),  # one column: strided
        ((1, 9, 1, 64), (1, 9, 1, 32), (1, 1, 1, 1), False),  # half the channels
        ((6, 5), (3, 5), (2, 1), False),  # every other row
        ((6, 5), (6, 5), (1, 1), True),
        ((3, 6, 5), (1, 2, 5), (1, 1, 1), True),
        ((3, 6, 5), (2, 2, 5), (1, 1, 1), False),
    ],
)
def test_contiguous_slice(shape, out, steps, expected):
    assert contiguous_slice(shape, out, steps) is expected


def test_slices_and_transposes_of_whole_blocks_run_as_views():
    # A streaming state window (the last rows) and a transpose that moves only 1-long axes
    # alias their inputs in the plan: no step of their own, same values as copies.
    b = ModelBuilder()
    x = b.input("x", (1, 5, 1, 4))
    y = b.op(OpCode.ADD, [x, b.constant("one", np.ones(4, np.float32))])
    window = b.op(OpCode.SLICE, [y], starts=[-2], ends=[1 << 30], axes=[1])
    column = b.op(OpCode.SLICE, [y], starts=[1], ends=[2], axes=[3])  # strided: a copy
    moved = b.op(
        OpCode.TRANSPOSE, [b.op(OpCode.RESHAPE, [y], shape=[1, 20, 1, 1])], perm=[0, 2, 3, 1]
    )
    b.output(b.op(OpCode.MUL, [window, window]), "w")
    b.output(b.op(OpCode.NEG, [column]), "c")
    b.output(b.op(OpCode.NEG, [moved]), "m")
    p = plan(b.build())
    kinds = sorted(k.op.name for k in p.step_kernels)
    assert kinds == ["ADD", "MUL", "NEG", "NEG", "SLICE"]
    for seed in range(2):
        value = _x((1, 5, 1, 4), seed)
        p.arrays[p.inputs[0]][...] = value
        p.run()
        w, c, m = (p.arrays[i] for i in p.outputs)
        plus = value + 1
        np.testing.assert_array_equal(w, plus[:, -2:] ** 2)
        np.testing.assert_array_equal(c, -plus[..., 1:2])
        np.testing.assert_array_equal(m, -plus.reshape(1, 1, 1, 20))
