"""MAX_POOL2D's positive_only routing mask (a ReLU's derivative folded in): the mask of
routing=1 restricted to windows whose maximum is positive, on the tiled and the general
paths; misuse raises; and the pool's own gradient ignores such a mask."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from tests.unit.autodiff.gradcheck import check_op

rng = np.random.default_rng(31)

POOLS = {
    "tiled": {"kernel_shape": [2, 2], "strides": [2, 2]},
    "overlapping, padded": {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1]},
}


@pytest.mark.parametrize("name", list(POOLS))
def test_positive_only_mask_is_the_mask_of_positive_maxima(name):
    attrs = POOLS[name]
    x = rng.integers(-3, 3, size=(3, 2, 6, 8)).astype(np.float32)  # ties, maxima <= 0
    y, mask = run_op(OpCode.MAX_POOL2D, [x], num_outputs=2, routing=1, **attrs)
    y2, positive = run_op(
        OpCode.MAX_POOL2D, [x], num_outputs=2, routing=1, positive_only=1, **attrs
    )
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(positive, mask & (y > 0))
    assert (y <= 0).any() and (y > 0).any()
    # Routed by the positive-only mask alone, the gradient is the relu=1 one.
    g = rng.normal(size=y.shape).astype(np.float32)
    (ours,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y, positive], relu=0, **attrs)
    (ref,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], relu=1, **attrs)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"positive_only": 1}, "needs routing=1"), ({"routing": 1, "positive_only": 2}, "0 or 1")],
)
def test_positive_only_misuse_is_reported(extra, message):
    x = np.zeros((1, 1, 4, 4), np.float32)
    outputs = 2 if extra.get("routing") else 1
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.MAX_POOL2D, [x], num_outputs=outputs, kernel_shape=[2, 2], **extra)


def test_gradient_of_a_positive_only_pool_finds_every_maximum():
    # y itself (before any ReLU) has a gradient in every window, also where its maximum
    # is negative: the rule must not route through the positive-only mask.
    def build(b, x):
        y = b.op(
            OpCode.MAX_POOL2D,
            [x],
            num_outputs=2,
            kernel_shape=[2, 2],
            strides=[2, 2],
            routing=1,
            positive_only=1,
        )
        return y

    x = np.random.default_rng(2).normal(size=(2, 2, 4, 4)) - 1.0  # mostly negative maxima
    check_op(build, {"x": x})
