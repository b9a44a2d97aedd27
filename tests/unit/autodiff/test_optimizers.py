"""SGD_UPDATE and ADAM_UPDATE vs a direct NumPy computation and torch.optim."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, ShapeError
from sporenet.lite.eager import run_op
from tests.unit.autodiff.gradcheck import rand

STEPS = 4


def grads(shape, seed=5):
    return [rand(*shape, seed=seed + k).astype(np.float32) for k in range(STEPS)]


def sgd_reference(p, gs, lr, momentum, nesterov, wd):
    p, buf = p.astype(np.float64), None
    for g in gs:
        d = g + wd * p
        if momentum:
            buf = d if buf is None else momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


SGD_CASES = [
    (0.0, False, 0.0),
    (0.9, False, 0.0),
    (0.9, True, 0.0),
    (0.5, False, 0.01),
    (0.9, True, 0.05),
]


@pytest.mark.parametrize(("momentum", "nesterov", "wd"), SGD_CASES)
def test_sgd_update(momentum, nesterov, wd):
    p = rand(3, 4, seed=1).astype(np.float32)
    start = p.copy()
    buf = np.zeros_like(p)
    lr = np.float32(0.1)
    for g in grads(p.shape):
        inputs = [p, g, lr] + ([buf] if momentum else [])
        assert (
            run_op(
                OpCode.SGD_UPDATE,
                inputs,
                num_outputs=0,
                momentum=momentum,
                nesterov=int(nesterov),
                weight_decay=wd,
            )
            == []
        )
    # float32 arithmetic vs a float64 reference over a few steps.
    np.testing.assert_allclose(
        p, sgd_reference(start, grads(p.shape), 0.1, momentum, nesterov, wd), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(("momentum", "nesterov", "wd"), SGD_CASES)
def test_sgd_update_matches_torch(momentum, nesterov, wd):
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    p = rand(3, 4, seed=1).astype(np.float32)
    tp = torch.nn.Parameter(torch.tensor(p))
    opt = torch.optim.SGD([tp], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    buf = np.zeros_like(p)
    for g in grads(p.shape):
        run_op(
            OpCode.SGD_UPDATE,
            [p, g, np.float32(0.1)] + ([buf] if momentum else []),
            num_outputs=0,
            momentum=momentum,
            nesterov=int(nesterov),
            weight_decay=wd,
        )
        tp.grad = torch.tensor(g)
        opt.step()
    # Same float32 formulas; only the order of a few float32 operations may differ.
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-6, atol=1e-7)


def adam_reference(p, gs, lr, b1, b2, eps, wd, decoupled):
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(gs, start=1):
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * mhat / (np.sqrt(vhat) + eps)
    return p


@pytest.mark.parametrize(("wd", "decoupled"), [(0.0, 0), (0.1, 0), (0.1, 1)])
def test_adam_update(wd, decoupled):
    p = rand(3, 4, seed=1).astype(np.float32)
    start = p.copy()
    m, v, step = np.zeros_like(p), np.zeros_like(p), np.zeros((), np.int64)
    for g in grads(p.shape):
        run_op(
            OpCode.ADAM_UPDATE,
            [p, g, np.float32(0.01), m, v, step],
            num_outputs=0,
            beta1=0.8,
            beta2=0.99,
            eps=1e-6,
            weight_decay=wd,
            decoupled=decoupled,
        )
    assert int(step) == STEPS
    # float32 state vs the float64 reference.
    np.testing.assert_allclose(
        p,
        adam_reference(start, grads(p.shape), 0.01, 0.8, 0.99, 1e-6, wd, decoupled),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize(("wd", "decoupled"), [(0.0, 0), (0.1, 0), (0.1, 1)])
def test_adam_update_matches_torch(wd, decoupled):
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    p = rand(3, 4, seed=1).astype(np.float32)
    tp = torch.nn.Parameter(torch.tensor(p))
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls([tp], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd)
    m, v, step = np.zeros_like(p), np.zeros_like(p), np.zeros((), np.int64)
    for g in grads(p.shape):
        run_op(
            OpCode.ADAM_UPDATE,
            [p, g, np.float32(0.01), m, v, step],
            num_outputs=0,
            beta1=0.8,
            beta2=0.99,
            eps=1e-6,
            weight_decay=wd,
            decoupled=decoupled,
        )
        tp.grad = torch.tensor(g)
        opt.step()
    # float32 on both sides; torch computes the bias corrections in a different order.
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_update_kernels_reject_bad_configuration():
    p = np.zeros(3, np.float32)
    with pytest.raises(ShapeError, match="nesterov"):
        run_op(OpCode.SGD_UPDATE, [p, p, np.float32(0.1)], num_outputs=0, nesterov=1)
    with pytest.raises(ShapeError, match="gradient"):
        run_op(OpCode.SGD_UPDATE, [p, np.zeros(4, np.float32), np.float32(0.1)], num_outputs=0)
    with pytest.raises(ShapeError, match="betas"):
        run_op(
            OpCode.ADAM_UPDATE,
            [p, p, np.float32(0.1), p.copy(), p.copy(), np.zeros((), np.int64)],
            num_outputs=0,
            beta1=1.0,
        )
