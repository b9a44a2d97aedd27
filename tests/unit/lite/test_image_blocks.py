"""Kernels that run a batch in blocks of images give the whole batch's results.

The block sizes are byte or multiply-add budgets that real layers cross at batch sizes a
unit test does not reach, so each test shrinks the budget to a block of two images (the
last block of five images is then a partial one) and compares with the whole batch.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import im2col, pooling
from sporenet.lite.kernels.training import conv_grad, pool_grad
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, conv_reference

N = 5
rng = np.random.default_rng(7)
X = rng.normal(size=(N, 8, 6, 6)).astype(np.float32)
W = rng.normal(size=(4, 8, 3, 3)).astype(np.float32)
B = rng.normal(size=(4,)).astype(np.float32)
PADS = [1, 1, 1, 1]


@pytest.mark.parametrize("constant", [[], [1, 2]], ids=["run-time", "constant"])
def test_conv2d_in_blocks_of_images(monkeypatch, constant):
    per_image = (8 * 9 + 1) * 36 * 4  # column bytes of one image, the bias row included
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 2 * per_image)
    (ours,) = run_op(OpCode.CONV2D, [X, W, B], constant_inputs=constant, pads=PADS)
    ref = conv_reference(X, W, B, pads=PADS)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", [OpCode.CONV2D_BACKPROP_INPUT, OpCode.CONV2D_BACKPROP_FILTER])
def test_conv_gradients_in_blocks_of_images(monkeypatch, op):
    g = rng.normal(size=(N, 4, 6, 6)).astype(np.float32)
    inputs = [g, W, X] if op == OpCode.CONV2D_BACKPROP_INPUT else [g, X, W]
    (whole,) = run_op(op, inputs, pads=PADS)
    macs = 36 * 8 * 9 * 4  # one image's product, either gradient
    monkeypatch.setattr(conv_grad, "UNPACKED_GEMM", 2 * macs)
    assert conv_grad.images_per_block(N, macs) == 2
    (blocked,) = run_op(op, inputs, pads=PADS)
    # The same products per image, summed over the batch in another order.
    np.testing.assert_allclose(blocked, whole, rtol=1e-5, atol=1e-5)


def test_max_pool_and_its_gradient_in_blocks_of_images(monkeypatch):
    x = rng.normal(size=(N, 3, 8, 8)).astype(np.float32)
    x[:, :, :4] = 0.5  # tied windows: the first maximum takes the gradient
    g = rng.normal(size=(N, 3, 4, 4)).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    (y,) = run_op(OpCode.MAX_POOL2D, [x], **attrs)
    (dx,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], **attrs)
    monkeypatch.setattr(pooling, "_BLOCK_BYTES", 2 * x[0].nbytes)
    monkeypatch.setattr(pool_grad, "_TILED_BLOCK_BYTES", 2 * x[0].nbytes)
    (y_blocked,) = run_op(OpCode.MAX_POOL2D, [x], **attrs)
    (dx_blocked,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], **attrs)
    np.testing.assert_array_equal(y_blocked, y)
    np.testing.assert_array_equal(dx_blocked, dx)
    np.testing.assert_array_equal(y, x.reshape(N, 3, 4, 2, 4, 2).max(axis=(3, 5)))
    # The routing mask's split forward and its gradient, in blocks of 2 images (N = 5:
    # a partial last block), route as the walk over x and y does.
    y_routed, mask = run_op(OpCode.MAX_POOL2D, [x], num_outputs=2, routing=1, **attrs)
    (dx_routed,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y, mask], **attrs)
    np.testing.assert_array_equal(y_routed, y)
    np.testing.assert_array_equal(dx_routed, dx)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_sum_over_the_batch_and_trailing_axes(keepdims):
    (ours,) = run_op(OpCode.REDUCE_SUM, [X], axes=[0, 2, 3], keepdims=keepdims)
    ref = X.astype(np.float64).sum(axis=(0, 2, 3), keepdims=bool(keepdims))
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
