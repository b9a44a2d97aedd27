"""MaxPool, AvgPool and GlobalAveragePool gradients vs finite differences and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import check_op


def distinct(*shape, seed=0):
    # A random permutation of well-separated values: no ties for max, and every finite
    # difference step (1e-6) keeps the same maximum in each window.
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(np.prod(shape)) * 0.1).reshape(shape) - 2.0


def _F():
    import torch.nn.functional as F

    return F


MAX_CASES = {
    "2x2": ({"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_size": 2, "stride": 2}),
    "3x3_overlap_pad": (
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_size": 3, "stride": 2, "padding": 1},
    ),
    "ceil_mode": (
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_size": 2, "stride": 2, "ceil_mode": True},
    ),
}


@pytest.mark.parametrize("name", list(MAX_CASES))
def test_max_pool(name):
    attrs, kw = MAX_CASES[name]
    check_op(
        lambda b, x: b.op(OpCode.MAX_POOL2D, [x], **attrs),
        {"x": distinct(2, 2, 5, 5)},
        torch_fn=lambda x: _F().max_pool2d(x, **kw),
    )


AVG_CASES = {
    "2x2": ({"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_size": 2, "stride": 2}),
    "3x3_pad_exclude": (
        {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
        {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False},
    ),
    "3x3_pad_include": (
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": True},
    ),
}


@pytest.mark.parametrize("name", list(AVG_CASES))
def test_avg_pool(name):
    attrs, kw = AVG_CASES[name]
    check_op(
        lambda b, x: b.op(OpCode.AVG_POOL2D, [x], **attrs),
        {"x": distinct(2, 2, 5, 5)},
        torch_fn=lambda x: _F().avg_pool2d(x, **kw),
    )


def test_global_average_pool():
    check_op(
        lambda b, x: b.op(OpCode.GLOBAL_AVG_POOL, [x]),
        {"x": distinct(2, 3, 4, 4)},
        torch_fn=lambda x: x.mean(dim=(2, 3), keepdim=True),
    )


@pytest.mark.parametrize(
    "attrs",
    [{"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_shape": [3, 3], "strides": [1, 1]}],
    ids=["tiled", "overlapping"],
)
def test_max_pool_ties_route_to_the_first_maximum_like_pytorch(attrs):
    # Relu before a pool makes whole windows of zeros: the gradient must go to one element
    # per window (the first), not to every tied one.
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    from sporenet.lite.eager import run_op

    x = np.maximum(np.random.default_rng(0).normal(size=(2, 3, 6, 6)), 0).astype(np.float32)
    x[0, 0, :2, :2] = 0  # a window of ties
    y = run_op(OpCode.MAX_POOL2D, [x], **attrs)[0]
    g = np.random.default_rng(1).normal(size=y.shape).astype(np.float32)
    dx = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], **attrs)[0]
    tx = torch.tensor(x, requires_grad=True)
    k, s = attrs["kernel_shape"][0], attrs["strides"][0]
    torch.nn.functional.max_pool2d(tx, k, s).backward(torch.tensor(g))
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ],
    ids=["tiled", "overlapping_padded"],
)
def test_max_pool_gradient_with_relu_folded_in_matches_relu_after_the_pool(attrs):
    # relu=1: the gradient of relu(max_pool(x)) (the order the training graph uses) in one
    # node. Integer values make ties, negative windows and zero maxima; PyTorch is the
    # reference for the gradient, and MAX_POOL2D_SELECT with relu=1 must be its adjoint.
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    from sporenet.lite.eager import run_op

    rng = np.random.default_rng(2)
    x = rng.integers(-3, 3, size=(3, 2, 6, 6)).astype(np.float32)
    y = run_op(OpCode.MAX_POOL2D, [x], **attrs)[0]
    g = rng.normal(size=y.shape).astype(np.float32)
    dx = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], relu=1, **attrs)[0]
    tx = torch.tensor(x, requires_grad=True)
    k, s, p = attrs["kernel_shape"][0], attrs["strides"][0], attrs.get("pads", [0])[0]
    torch.relu(torch.nn.functional.max_pool2d(tx, k, s, p)).backward(torch.tensor(g))
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    assert (y <= 0).any() and (y > 0).any()  # both kinds of window are exercised
    u = rng.normal(size=x.shape).astype(np.float32)
    picked = run_op(OpCode.MAX_POOL2D_SELECT, [u, x, y], relu=1, **attrs)[0]
    np.testing.assert_allclose(np.vdot(picked, g), np.vdot(u, dx), rtol=1e-5)


ROUTING_CASES = {  # attributes and the input's side: tiled cases take the split path
    "tiled": ({"kernel_shape": [2, 2], "strides": [2, 2]}, 8),
    "tiled_3x3": ({"kernel_shape": [3, 3], "strides": [3, 3]}, 9),
    "overhang": ({"kernel_shape": [2, 2], "strides": [2, 2]}, 9),
    "overlapping_padded": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 9),
    "ceil_mode": ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 9),
}


@pytest.mark.parametrize("name", list(ROUTING_CASES))
@pytest.mark.parametrize("relu", [0, 1])
def test_max_pool_routing_mask_routes_as_the_gradient_walk(name, relu):
    # MAX_POOL2D routing=1: y unchanged, and output 1 marks each window's first maximum;
    # MAX_POOL2D_GRAD reading that mask gives the same bits as walking x and y itself.
    # Integer values make ties (whole windows of equal values), negative and zero maxima.
    from sporenet.lite.eager import run_op

    attrs, side = ROUTING_CASES[name]
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 3, size=(5, 3, side, side)).astype(np.float32)
    x[0, 0] = 1.0  # a plane of ties
    (y,) = run_op(OpCode.MAX_POOL2D, [x], **attrs)
    y_routed, mask = run_op(OpCode.MAX_POOL2D, [x], num_outputs=2, routing=1, **attrs)
    np.testing.assert_array_equal(y_routed, y)
    kh, kw = attrs["kernel_shape"]
    assert mask.dtype == np.bool_ and mask.shape == (kh * kw, *y.shape)
    assert (mask.sum(axis=0) == 1).all()  # one tap per window, ties included
    g = rng.normal(size=y.shape).astype(np.float32)
    (walked,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], relu=relu, **attrs)
    (routed,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y, mask], relu=relu, **attrs)
    np.testing.assert_array_equal(routed, walked)
    if name == "tiled":  # the first maximum in row-major order, by brute force
        windows = x.reshape(5, 3, 4, 2, 4, 2).transpose(3, 5, 0, 1, 2, 4)
        first = np.argmax(windows.reshape(4, *y.shape) == y, axis=0)
        np.testing.assert_array_equal(mask, np.arange(4)[:, None, None, None, None] == first)


def test_max_pool_gradient_rejects_a_mask_of_the_wrong_shape():
    from sporenet.lite.eager import run_op

    x = np.zeros((1, 1, 4, 4), np.float32)
    y = np.zeros((1, 1, 2, 2), np.float32)
    mask = np.zeros((1, 1, 1, 2, 2), np.bool_)
    with pytest.raises(Exception, match=r"routing mask must be bool \[4, 1, 1, 2, 2\]"):
        run_op(OpCode.MAX_POOL2D_GRAD, [y, x, y, mask], kernel_shape=[2, 2], strides=[2, 2])


def test_max_pool_gradient_rejects_a_relu_flag_other_than_0_or_1():
    from sporenet.lite.eager import run_op

    x = np.zeros((1, 1, 2, 2), np.float32)
    y = np.zeros((1, 1, 1, 1), np.float32)
    with pytest.raises(Exception, match="relu must be 0 or 1, got 2"):
        run_op(OpCode.MAX_POOL2D_GRAD, [y, x, y], kernel_shape=[2, 2], strides=[2, 2], relu=2)


def test_global_max_pool():
    check_op(
        lambda b, x: b.op(OpCode.GLOBAL_MAX_POOL, [x]),
        {"x": distinct(2, 3, 4, 4)},
        torch_fn=lambda x: x.amax(dim=(2, 3), keepdim=True),
    )
