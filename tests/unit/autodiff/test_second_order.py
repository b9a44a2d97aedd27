"""Second derivatives through the backward kernels' own rules (lite/autodiff/rules/
backward.py): Hessian-vector products of every op whose rule is declared differentiable
against PyTorch (float64, analytic on both sides) and central finite differences of the
gradient, and HVPs of a small MLP and CNN in their parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import ops
from sporenet.lite.autodiff.rules import SECOND_ORDER
from sporenet.lite.ops import OpCode

torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
F = torch.nn.functional
O = OpCode  # noqa: E741 - as in the declarations


@pytest.fixture(params=["eager", "graph"])
def mode(request):
    with cloud.using_mode(request.param):
        yield request.param


def hvp(f: Callable[..., Any], args: list[np.ndarray], vs: list[np.ndarray]) -> list[np.ndarray]:
    """H v of scalar f in all its arguments: the gradient of <grad f, v>."""
    nums = tuple(range(len(args)))

    def dot(*a: Any) -> Any:
        grads = cloud.grad(f, argnums=nums)(*a)
        return sum(ops.sum(g * v) for g, v in zip(grads, vs, strict=True))

    return list(cloud.grad(dot, argnums=nums)(*args))


def torch_hvp(f: Callable[..., Any], args: list[np.ndarray], vs: list[np.ndarray]) -> list:
    _, out = torch.autograd.functional.hvp(
        f, tuple(torch.tensor(a) for a in args), tuple(torch.tensor(v) for v in vs)
    )
    return [o.numpy() for o in out]


def finite_hvp(f: Callable[..., Any], args: list[np.ndarray], vs: list[np.ndarray], eps=1e-5):
    """(grad f(x + eps v) - grad f(x - eps v)) / 2 eps, the gradient taken by sporenet."""
    nums = tuple(range(len(args)))
    g = cloud.grad(f, argnums=nums)
    plus = g(*[a + eps * v for a, v in zip(args, vs, strict=True)])
    minus = g(*[a - eps * v for a, v in zip(args, vs, strict=True)])
    return [(p - m) / (2 * eps) for p, m in zip(plus, minus, strict=True)]


def _close(got: list, want: list, rtol: float, atol: float = 1e-12) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, np.abs(w).max()))


rng = np.random.default_rng(0)
X = rng.normal(size=(3, 4))
C = rng.normal(size=(3, 4))  # weights that break symmetry in sums
IMG = rng.normal(size=(2, 2, 5, 5))
K = rng.normal(size=(3, 2, 3, 3)) * 0.5
BIAS = rng.normal(size=(3,))
LABELS = np.array([1, 0, 3])
ONEHOT = np.eye(4)[LABELS]
TARGET = rng.uniform(size=(3, 4))


def _act(op: OpCode, **attrs: Any) -> Callable[[Any], Any]:
    return lambda x: ops.sum(ops.apply(op, x, **attrs) * C)


def _t(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda x: torch.sum(fn(x) * torch.tensor(C))


# op -> (inputs, sporenet f, PyTorch f): each exercises the op's rule and the second-order
# rules of the backward ops it emits.
CASES: dict[str, tuple[list[np.ndarray], Callable, Callable]] = {
    "TANH": ([X], _act(O.TANH), _t(torch.tanh)),
    "SIGMOID": ([X], _act(O.SIGMOID), _t(torch.sigmoid)),
    "SILU": ([X], _act(O.SILU), _t(F.silu)),
    "GELU": ([X], _act(O.GELU), _t(F.gelu)),
    "ELU": ([X], _act(O.ELU, alpha=1.3), _t(lambda x: F.elu(x, alpha=1.3))),
    "SOFTPLUS": ([X], _act(O.SOFTPLUS), _t(F.softplus)),
    "HARD_SWISH": ([X * 2], _act(O.HARD_SWISH), _t(F.hardswish)),
    "RELU": (
        [X],
        lambda x: ops.sum(ops.relu(x) * ops.relu(x)),
        lambda x: torch.sum(F.relu(x) ** 2),
    ),
    "LEAKY_RELU": (
        [X],
        lambda x: ops.sum(ops.square(ops.apply(O.LEAKY_RELU, x, alpha=0.2))),
        lambda x: torch.sum(F.leaky_relu(x, 0.2) ** 2),
    ),
    "ABS": ([X], lambda x: ops.sum(ops.abs(x) * x), lambda x: torch.sum(torch.abs(x) * x)),
    "SOFTMAX": (
        [X],
        lambda x: ops.sum(ops.softmax(x) * ops.softmax(x * 2.0) * C),
        lambda x: torch.sum(torch.softmax(x, -1) * torch.softmax(x * 2, -1) * torch.tensor(C)),
    ),
    "LOG_SOFTMAX": (
        [X],
        lambda x: ops.sum(ops.square(ops.log_softmax(x)) * C),
        lambda x: torch.sum(torch.log_softmax(x, -1) ** 2 * torch.tensor(C)),
    ),
    "REDUCE_MEAN": (
        [X],
        lambda x: ops.sum(ops.square(ops.mean(x * x, axis=1))),
        lambda x: torch.sum(torch.mean(x * x, 1) ** 2),
    ),
    "ADD": (
        [X, BIAS[:1].repeat(4)],
        lambda x, b: ops.sum(ops.tanh(x + b) * C),
        lambda x, b: torch.sum(torch.tanh(x + b) * torch.tensor(C)),
    ),
    "MAXIMUM": (
        [X, C],
        lambda a, b: ops.sum(ops.square(ops.maximum(a, b * 0.5))),
        lambda a, b: torch.sum(torch.maximum(a, b * 0.5) ** 2),
    ),
    "MATMUL": (
        [X, C.T.copy()],
        lambda a, b: ops.sum(ops.tanh(ops.matmul(a, b))),
        lambda a, b: torch.sum(torch.tanh(a @ b)),
    ),
    "FULLY_CONNECTED": (
        [X, C, BIAS],
        lambda x, w, b: ops.sum(ops.tanh(ops.apply(O.FULLY_CONNECTED, x, w, b))),
        lambda x, w, b: torch.sum(torch.tanh(x @ w.T + b)),
    ),
    "CONV2D": (
        [IMG, K, BIAS],
        lambda x, w, b: ops.sum(
            ops.tanh(ops.apply(O.CONV2D, x, w, b, strides=[2, 2], pads=[1, 1, 1, 1]))
        ),
        lambda x, w, b: torch.sum(torch.tanh(F.conv2d(x, w, b, stride=2, padding=1))),
    ),
    "AVG_POOL2D": (
        [IMG],
        lambda x: ops.sum(
            ops.tanh(ops.apply(O.AVG_POOL2D, x, kernel_shape=[2, 2], strides=[1, 1]))
        ),
        lambda x: torch.sum(torch.tanh(F.avg_pool2d(x, 2, 1))),
    ),
    "GLOBAL_AVG_POOL": (
        [IMG],
        lambda x: ops.sum(ops.tanh(ops.apply(O.GLOBAL_AVG_POOL, x) * 3.0)),
        lambda x: torch.sum(torch.tanh(torch.mean(x, (2, 3)) * 3)),
    ),
    "MSE_LOSS": (
        [X],
        lambda x: ops.apply(O.MSE_LOSS, ops.tanh(x), TARGET),
        lambda x: torch.mean((torch.tanh(x) - torch.tensor(TARGET)) ** 2),
    ),
    "BCE_WITH_LOGITS": (
        [X],
        lambda x: ops.apply(O.BCE_WITH_LOGITS, x * x, TARGET),
        lambda x: F.binary_cross_entropy_with_logits(x * x, torch.tensor(TARGET)),
    ),
    "SOFTMAX_CROSS_ENTROPY": (
        [X],
        lambda x: ops.apply(O.SOFTMAX_CROSS_ENTROPY, ops.tanh(x) * 2.0, ONEHOT, num_outputs=2)[0],
        lambda x: F.cross_entropy(torch.tanh(x) * 2, torch.tensor(LABELS)),
    ),
}


def test_the_cases_cover_the_second_order_rules() -> None:
    backward = ("_GRAD", "_TRANSPOSED", "_TO", "_BACKPROP_INPUT", "_BACKPROP_FILTER")
    forward = {o for o in SECOND_ORDER if not o.name.endswith(backward)}
    structural = {O.IDENTITY, O.RESHAPE, O.FLATTEN, O.SQUEEZE, O.UNSQUEEZE, O.TRANSPOSE}
    structural |= {O.CONCAT, O.SPLIT, O.IF, O.LOOP, O.CALL, O.EXPAND, O.WHERE, O.DROPOUT}
    # checked in test_transforms.py (scalar second and third derivatives) or by the ops
    # whose rules emit them
    elsewhere = {O.SUB, O.MUL, O.DIV, O.NEG, O.EXP, O.LOG, O.SQRT, O.SQUARE, O.RECIPROCAL}
    elsewhere |= {O.MINIMUM, O.REDUCE_SUM, O.RELU6, O.CLIP, O.HARD_SIGMOID}
    missing = forward - structural - elsewhere - {O[name] for name in CASES}
    assert not missing, sorted(o.name for o in missing)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hvp_matches_torch_and_finite_differences(name: str, mode: str) -> None:
    args, ours, theirs = CASES[name]
    vs = [np.random.default_rng(1).normal(size=a.shape) for a in args]
    got = hvp(ours, args, vs)
    _close(got, torch_hvp(theirs, args, vs), rtol=1e-8)
    if mode == "graph":  # the same gradient graph: one finite-difference check suffices
        _close(got, finite_hvp(ours, args, vs), rtol=1e-5, atol=1e-6)


def test_hessian_of_an_activation_matches_torch(mode: str) -> None:
    x = np.array([0.3, -1.2, 2.0])
    h = cloud.hessian(lambda x: ops.sum(ops.silu(x) * ops.tanh(x)))(x)
    want = torch.autograd.functional.hessian(
        lambda t: torch.sum(F.silu(t) * torch.tanh(t)), torch.tensor(x)
    )
    np.testing.assert_allclose(h, want.numpy(), rtol=1e-9, atol=1e-12)


def test_grad_of_grad_is_differentiable_again(mode: str) -> None:
    x = np.array(0.4)
    f = lambda x: ops.sum(ops.sigmoid(x * 3.0) * ops.tanh(x))  # noqa: E731
    third = cloud.grad(cloud.grad(cloud.grad(f)))(x)
    t = lambda x: torch.sigmoid(x * 3) * torch.tanh(x)  # noqa: E731
    want = torch.func.grad(torch.func.grad(torch.func.grad(t)))(
        torch.tensor(0.4, dtype=torch.float64)
    )
    np.testing.assert_allclose(third, want.numpy(), rtol=1e-9)


# ---- Hessian-vector products of small networks in their parameters, the target:
# within 1e-4 relative of PyTorch's.


def _mlp(x, w1, b1, w2, b2):
    h = ops.tanh(ops.apply(O.FULLY_CONNECTED, x, w1, b1))
    z = ops.apply(O.FULLY_CONNECTED, h, w2, b2)
    return ops.apply(O.SOFTMAX_CROSS_ENTROPY, z, MLP_LABELS, num_outputs=2)[0]


def _torch_mlp(x, w1, b1, w2, b2):
    z = torch.tanh(x @ w1.T + b1) @ w2.T + b2
    return F.cross_entropy(z, torch.tensor(MLP_LABELS))


def _cnn(x, k, kb, w, b):
    y = ops.relu(ops.apply(O.CONV2D, x, k, kb, pads=[1, 1, 1, 1]))
    y = ops.apply(O.AVG_POOL2D, y, kernel_shape=[2, 2], strides=[2, 2])
    z = ops.apply(O.FULLY_CONNECTED, y.reshape(2, -1), w, b)
    return ops.mean(ops.square(ops.tanh(z))) - ops.mean(ops.log_softmax(z) * CNN_TARGET)


def _torch_cnn(x, k, kb, w, b):
    y = F.avg_pool2d(F.relu(F.conv2d(x, k, kb, padding=1)), 2, 2)
    z = y.reshape(2, -1) @ w.T + b
    target = torch.tensor(CNN_TARGET)
    return torch.mean(torch.tanh(z) ** 2) - torch.mean(torch.log_softmax(z, -1) * target)


MLP_LABELS = np.eye(3)[[0, 2, 1, 1, 0]]
CNN_TARGET = np.random.default_rng(3).uniform(size=(2, 4))


@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_hvp_of_a_small_network_matches_torch(net: str, mode: str) -> None:
    r = np.random.default_rng(2)
    if net == "mlp":
        x = r.normal(size=(5, 4))
        params = [r.normal(size=s) * 0.5 for s in ((6, 4), (6,), (3, 6), (3,))]
        ours, theirs = _mlp, _torch_mlp
    else:
        x = r.normal(size=(2, 1, 6, 6))
        params = [r.normal(size=s) * 0.5 for s in ((3, 1, 3, 3), (3,), (4, 27), (4,))]
        ours, theirs = _cnn, _torch_cnn
    vs = [r.normal(size=p.shape) for p in params]
    got = hvp(lambda *p: ours(x, *p), params, vs)
    want = torch_hvp(lambda *p: theirs(torch.tensor(x), *p), params, vs)
    for g, w in zip(got, want, strict=True):
        assert np.linalg.norm(g - w) <= 1e-4 * np.linalg.norm(w), (net, g, w)


# Backward ops with a rule of their own: each is emitted by some case's first derivative,
# so the Hessian-vector products above differentiate it.
BACKWARD_OPS = [
    OpCode.ACTIVATION_GRAD,
    OpCode.MATMUL_TRANSPOSED,
    OpCode.REDUCE_SUM_TO,
    OpCode.REDUCE_GRAD,
    OpCode.SOFTMAX_GRAD,
    OpCode.CONV2D_BACKPROP_INPUT,
    OpCode.CONV2D_BACKPROP_FILTER,
    OpCode.AVG_POOL2D_GRAD,
    OpCode.MSE_LOSS_GRAD,
    OpCode.BCE_WITH_LOGITS_GRAD,
    OpCode.SOFTMAX_CROSS_ENTROPY_GRAD,
    OpCode.WHERE,
]


def test_the_cases_differentiate_every_backward_op_with_a_rule() -> None:
    emitted = set()
    with cloud.using_mode("graph"):
        for args, ours, _ in CASES.values():
            model = cloud.grad(ours, argnums=tuple(range(len(args)))).graph(*args)
            emitted |= {n.op for g in model.graphs for n in g.nodes}
    assert set(BACKWARD_OPS) <= emitted, sorted(o.name for o in set(BACKWARD_OPS) - emitted)
    with_rules = {o for o in SECOND_ORDER if o.name.endswith(("_GRAD", "_TRANSPOSED", "_TO"))}
    with_rules |= {OpCode.CONV2D_BACKPROP_INPUT, OpCode.CONV2D_BACKPROP_FILTER, OpCode.WHERE}
    assert with_rules == set(BACKWARD_OPS)
