"""MaxPool2D, AvgPool2D and the global pools against loop references and onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels.base import TensorSpec
from tests.unit.lite.onnx_reference import run_onnx_op


def pool_reference(
    x,
    kind,
    kernel,
    strides=(1, 1),
    pads=(0, 0, 0, 0),
    dilations=(1, 1),
    ceil_mode=False,
    count_include_pad=False,
):
    """Window by window over output positions, in input coordinates (no padded copy)."""
    n, c, h, w = x.shape
    sizes = (h, w)
    out_size = []
    for a in range(2):
        span = sizes[a] + pads[a] + pads[a + 2] - (kernel[a] - 1) * dilations[a] - 1
        o = (math.ceil(span / strides[a]) if ceil_mode else span // strides[a]) + 1
        if ceil_mode and (o - 1) * strides[a] >= sizes[a] + pads[a]:
            o -= 1  # the last window would start inside the end padding
        out_size.append(o)
    out = np.zeros((n, c, *out_size))
    for oy in range(out_size[0]):
        for ox in range(out_size[1]):
            ys = [oy * strides[0] + i * dilations[0] - pads[0] for i in range(kernel[0])]
            xs = [ox * strides[1] + j * dilations[1] - pads[1] for j in range(kernel[1])]
            vy = [y for y in ys if 0 <= y < h]
            vx = [x_ for x_ in xs if 0 <= x_ < w]
            block = x[:, :, vy][:, :, :, vx].astype(np.float64)
            if kind == "max":
                out[:, :, oy, ox] = block.max(axis=(2, 3))
                continue
            if count_include_pad:
                # Padding counts, the ceil-mode overhang past the end padding does not.
                cy = sum(-pads[0] <= y < h + pads[2] for y in ys)
                cx = sum(-pads[1] <= x_ < w + pads[3] for x_ in xs)
            else:
                cy, cx = len(vy), len(vx)
            out[:, :, oy, ox] = block.sum(axis=(2, 3)) / (cy * cx)
    return out


# (shape, kernel, strides, pads, ceil_mode)
CASES = [
    ((1, 3, 8, 8), (2, 2), (2, 2), (0, 0, 0, 0), 0),
    ((2, 2, 9, 9), (3, 3), (2, 2), (1, 1, 1, 1), 0),
    ((1, 4, 7, 10), (3, 2), (1, 3), (1, 0, 0, 1), 0),
    ((1, 2, 7, 7), (3, 3), (2, 2), (0, 0, 0, 0), 1),  # ceil_mode overhang
    ((1, 2, 8, 9), (3, 3), (2, 2), (1, 1, 1, 1), 1),  # ceil_mode with padding
    ((1, 2, 6, 6), (1, 1), (2, 2), (0, 0, 0, 0), 0),  # 1x1 subsample
    ((1, 2, 5, 6), (5, 1), (1, 1), (2, 0, 2, 0), 0),  # a column window
    ((2, 3, 6, 5), (6, 5), (1, 1), (0, 0, 0, 0), 0),  # the whole plane
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_max_pool_matches_reference_and_onnxruntime(case):
    shape, kernel, strides, pads, ceil_mode = case
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    attrs = dict(
        kernel_shape=list(kernel), strides=list(strides), pads=list(pads), ceil_mode=ceil_mode
    )
    (ours,) = run_op(OpCode.MAX_POOL2D, [x], **attrs)
    ref = pool_reference(x, "max", kernel, strides, pads, ceil_mode=ceil_mode)
    np.testing.assert_array_equal(ours, ref.astype(np.float32))  # max is exact
    (ort,) = run_onnx_op("MaxPool", [x], **attrs)
    np.testing.assert_array_equal(ours, ort)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("include", [0, 1])
def test_avg_pool_matches_reference_and_onnxruntime(case, include):
    shape, kernel, strides, pads, ceil_mode = case
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    attrs = dict(
        kernel_shape=list(kernel),
        strides=list(strides),
        pads=list(pads),
        ceil_mode=ceil_mode,
        count_include_pad=include,
    )
    (ours,) = run_op(OpCode.AVG_POOL2D, [x], **attrs)
    ref = pool_reference(
        x, "avg", kernel, strides, pads, ceil_mode=ceil_mode, count_include_pad=include
    )
    # float32 sums of up to 30 terms against a float64 reference.
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    (ort,) = run_onnx_op("AveragePool", [x], **attrs)
    np.testing.assert_allclose(ours, ort, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op,onnx_op,kind",
    [(OpCode.MAX_POOL2D, "MaxPool", "max"), (OpCode.AVG_POOL2D, "AveragePool", "avg")],
)
@pytest.mark.parametrize("dilations", [(2, 1), (2, 2)])
def test_dilated_pools(op, onnx_op, kind, dilations):
    x = np.random.default_rng(2).normal(size=(1, 2, 9, 8)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 1, 2, 0], dilations=list(dilations))
    (ours,) = run_op(op, [x], **attrs)
    ref = pool_reference(x, kind, (3, 2), (1, 2), (1, 1, 2, 0), dilations)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    # AvgPool's dilations arrived in opset 19.
    (ort,) = run_onnx_op(onnx_op, [x], opset=19, **attrs)
    np.testing.assert_allclose(ours, ort, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(
    "op,onnx_op", [(OpCode.MAX_POOL2D, "MaxPool"), (OpCode.AVG_POOL2D, "AveragePool")]
)
def test_pool_auto_pad_matches_onnxruntime(auto_pad, op, onnx_op):
    x = np.random.default_rng(3).normal(size=(1, 3, 7, 8)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad=auto_pad)
    (ours,) = run_op(op, [x], **attrs)
    (ort,) = run_onnx_op(onnx_op, [x], **attrs)
    assert ours.shape == ort.shape
    np.testing.assert_allclose(ours, ort, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 4, 1, 1), (2, 3, 6), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize(
    "op,onnx_op,fn",
    [
        (OpCode.GLOBAL_AVG_POOL, "GlobalAveragePool", np.mean),
        (OpCode.GLOBAL_MAX_POOL, "GlobalMaxPool", np.max),
    ],
)
def test_global_pools(shape, op, onnx_op, fn):
    x = np.random.default_rng(4).normal(size=shape).astype(np.float32)
    (ours,) = run_op(op, [x])
    axes = tuple(range(2, len(shape)))
    np.testing.assert_allclose(
        ours, fn(x.astype(np.float64), axis=axes, keepdims=True), rtol=1e-5, atol=1e-6
    )
    (ort,) = run_onnx_op(onnx_op, [x])
    np.testing.assert_allclose(ours, ort, rtol=1e-5, atol=1e-6)


def test_max_pool_reuses_its_scratch_across_calls():
    """The -inf border of the padded scratch survives calls with all-negative inputs."""
    from sporenet.lite.kernels.base import Attrs, TensorSpec
    from sporenet.lite.kernels.pooling import MaxPool2D

    x = np.empty((1, 2, 5, 5), np.float32)
    out = np.empty((1, 2, 3, 3), np.float32)
    kernel = MaxPool2D(
        Attrs("MAX_POOL2D", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        [TensorSpec(x.shape, x.dtype)],
    )
    step = kernel.bind([x], [out])
    rng = np.random.default_rng(5)
    for _ in range(3):
        x[...] = -np.abs(rng.normal(size=x.shape)) - 1
        step()
        np.testing.assert_array_equal(
            out, pool_reference(x, "max", (3, 3), (2, 2), (1, 1, 1, 1)).astype(np.float32)
        )


@pytest.mark.parametrize(
    "op,shape,attrs,message",
    [
        (OpCode.MAX_POOL2D, (1, 2, 4, 4), {}, "'kernel_shape'.*required"),
        (OpCode.MAX_POOL2D, (1, 2, 4, 4), {"kernel_shape": [2]}, "kernel_shape must hold 2"),
        (OpCode.MAX_POOL2D, (2, 4, 4), {"kernel_shape": [2, 2]}, "must be 4-D"),
        (OpCode.AVG_POOL2D, (1, 2, 4, 4), {"kernel_shape": [5, 5]}, "larger than the padded"),
        (
            OpCode.AVG_POOL2D,
            (1, 2, 4, 4),
            {"kernel_shape": [2, 2], "pads": [0, 0, 1]},
            "pads must hold 4",
        ),
        (
            OpCode.AVG_POOL2D,
            (1, 2, 4, 4),
            {"kernel_shape": [2, 2], "ceil_mode": 2},
            "ceil_mode must be 0 or 1",
        ),
        (OpCode.GLOBAL_AVG_POOL, (2, 3), {}, "input must be"),
    ],
)
def test_pool_shape_errors(op, shape, attrs, message):
    with pytest.raises(ShapeError, match=message):
        run_op(op, [np.zeros(shape, np.float32)], **attrs)


@pytest.mark.parametrize("channels_last", [False, True])
def test_avg_pool_over_the_whole_plane_is_the_global_mean(channels_last):
    # TFLite stores Keras's GlobalAveragePooling2D as an AVERAGE_POOL_2D whose window is
    # the whole input: it runs as the global mean's product.
    rng = np.random.default_rng(8)
    shape = (2, 5, 6, 7)
    x = rng.normal(size=shape).astype(np.float32)
    attrs = {"kernel_shape": [6, 7], "strides": [6, 7]}
    (ours,) = run_op(OpCode.AVG_POOL2D, [x], **attrs)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-7)
    if channels_last:
        stored = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        kernel = prepare_kernel(OpCode.AVG_POOL2D, attrs, [TensorSpec(shape, x.dtype)], 1)
        out = np.empty((2, 5, 1, 1), np.float32)
        kernel.bind([stored], [out])()
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
