"""Loss kernels and their gradients vs NumPy, finite differences and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from tests.unit.autodiff.gradcheck import check_op, rand


def _F():
    import torch.nn.functional as F

    return F


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy_class_ids(smoothing):
    logits = rand(6, 4, seed=1, scale=2)
    labels = np.array([0, 3, 1, 1, 2, 0], np.int64)
    loss, probs = run_op(
        OpCode.SOFTMAX_CROSS_ENTROPY, [logits, labels], num_outputs=2, label_smoothing=smoothing
    )
    logp = log_softmax(logits)
    target = np.eye(4)[labels] * (1 - smoothing) + smoothing / 4
    np.testing.assert_allclose(loss, -(target * logp).sum(1).mean(), rtol=1e-12)
    np.testing.assert_allclose(probs, np.exp(logp), rtol=1e-12)
    check_op(
        lambda b, logits, labels: b.op(
            OpCode.SOFTMAX_CROSS_ENTROPY, [logits, labels], label_smoothing=smoothing
        ),
        {"logits": logits, "labels": labels},
        wrt=["logits"],
        torch_fn=lambda logits, labels: _F().cross_entropy(
            logits, labels, label_smoothing=smoothing
        ),
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_softmax_cross_entropy_one_hot_and_soft_labels(smoothing):
    logits = rand(5, 3, seed=2)
    soft = np.random.default_rng(3).dirichlet(np.ones(3), size=5)  # rows sum to 1
    check_op(
        lambda b, logits, labels: b.op(
            OpCode.SOFTMAX_CROSS_ENTROPY, [logits, labels], label_smoothing=smoothing
        ),
        {"logits": logits, "labels": soft},
        wrt=["logits"],
        torch_fn=lambda logits, labels: _F().cross_entropy(
            logits, labels, label_smoothing=smoothing
        ),
    )
    # One-hot rows give the same loss as class ids.
    ids = np.array([2, 0, 1, 1, 0])
    one_hot = run_op(OpCode.SOFTMAX_CROSS_ENTROPY, [logits, np.eye(3)[ids]])[0]
    by_id = run_op(OpCode.SOFTMAX_CROSS_ENTROPY, [logits, ids.astype(np.int64)])[0]
    np.testing.assert_allclose(one_hot, by_id, rtol=1e-12)


def test_softmax_cross_entropy_is_stable_for_large_logits():
    logits = np.array([[1000.0, 0.0], [0.0, -1000.0]], np.float32)
    loss = run_op(OpCode.SOFTMAX_CROSS_ENTROPY, [logits, np.array([0, 0], np.int64)])[0]
    assert np.isfinite(loss) and abs(float(loss)) < 1e-3


def test_mse_loss():
    pred, target = rand(4, 3, seed=1), rand(4, 3, seed=2)
    np.testing.assert_allclose(
        run_op(OpCode.MSE_LOSS, [pred, target])[0], ((pred - target) ** 2).mean(), rtol=1e-12
    )
    check_op(
        lambda b, pred, target: b.op(OpCode.MSE_LOSS, [pred, target]),
        {"pred": pred, "target": target},
        torch_fn=lambda pred, target: _F().mse_loss(pred, target),
    )


def test_bce_with_logits():
    x = rand(4, 3, seed=1, scale=3)
    t = (rand(4, 3, seed=2) > 0).astype(np.float64)
    p = 1 / (1 + np.exp(-x))
    expected = -(t * np.log(p) + (1 - t) * np.log(1 - p)).mean()
    np.testing.assert_allclose(run_op(OpCode.BCE_WITH_LOGITS, [x, t])[0], expected, rtol=1e-10)
    check_op(
        lambda b, x, t: b.op(OpCode.BCE_WITH_LOGITS, [x, t]),
        {"x": x, "t": t},
        wrt=["x"],
        torch_fn=lambda x, t: _F().binary_cross_entropy_with_logits(x, t),
    )
    big = np.array([[500.0, -500.0]], np.float32)
    assert np.isfinite(run_op(OpCode.BCE_WITH_LOGITS, [big, np.ones_like(big)])[0])
