"""grad, value_and_grad, vjp, jvp, jacobian and hessian in both modes, against PyTorch's
torch.func (float64, analytic on both sides) and central finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import ops
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.ops import OpCode

torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")

MODES = ["eager", "graph"]


@pytest.fixture(params=MODES)
def mode(request):
    with cloud.using_mode(request.param):
        yield request.param


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(5, 4)), rng.normal(size=(4, 3)) * 0.5, rng.normal(size=(3,))


def mlp(x, w, b):
    """A small network: every first-order rule on the way (matmul, broadcast add, tanh,
    softmax, log, mean)."""
    h = ops.tanh(ops.matmul(x, w) + b)
    return ops.mean(ops.log(ops.softmax(h, axis=-1)) * -1.0)


def torch_mlp(x, w, b):
    h = torch.tanh(x @ w + b)
    return torch.mean(-torch.log(torch.softmax(h, dim=-1)))


def _central(f, args, k, step=1e-6):
    """Central differences of scalar f in argument k."""
    base = [np.array(a, copy=True) for a in args]
    out = np.empty(base[k].size)
    flat = base[k].reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + step
        plus = float(f(*base))
        flat[i] = keep - step
        minus = float(f(*base))
        flat[i] = keep
        out[i] = (plus - minus) / (2 * step)
    return out.reshape(base[k].shape)


def test_grad_matches_torch_func_and_finite_differences(mode):
    x, w, b = _data()
    grads = cloud.grad(mlp, argnums=(0, 1, 2))(x, w, b)
    expected = torch.func.grad(torch_mlp, argnums=(0, 1, 2))(*map(torch.tensor, (x, w, b)))
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads[1], _central(numpy_mlp, (x, w, b), 1), rtol=1e-6, atol=1e-9)


def numpy_mlp(x, w, b):
    h = np.tanh(x @ w + b)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return np.mean(-np.log(e / e.sum(axis=-1, keepdims=True)))


def test_value_and_grad_single_argnum(mode):
    x, w, b = _data(1)
    value, gw = cloud.value_and_grad(mlp, argnums=1)(x, w, b)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    loss = torch_mlp(tx, tw, tb)
    loss.backward()
    assert np.isclose(value, loss.item(), rtol=1e-12)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_vjp_and_jacobian_match_torch(mode):
    x, w, _ = _data(2)

    def f(x):
        return ops.sigmoid(ops.matmul(x, w))

    out, pull = cloud.vjp(f, x)
    ct = np.random.default_rng(3).normal(size=out.shape)
    (dx,) = pull(ct)
    t_out, t_pull = torch.func.vjp(lambda t: torch.sigmoid(t @ torch.tensor(w)), torch.tensor(x))
    np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-12)
    np.testing.assert_allclose(dx, t_pull(torch.tensor(ct))[0].numpy(), rtol=1e-9, atol=1e-12)
    jac = cloud.jacobian(f)(x[:2])
    t_jac = torch.autograd.functional.jacobian(
        lambda t: torch.sigmoid(t @ torch.tensor(w)), torch.tensor(x[:2])
    )
    assert jac.shape == (2, 3, 2, 4)
    np.testing.assert_allclose(jac, t_jac.numpy(), rtol=1e-9, atol=1e-12)


def test_jvp_is_the_vjp_of_the_vjp(mode):
    # Every backward op of f has a rule of its own (MUL, DIV, EXP's MUL), so J t exists.
    x, _, _ = _data(4)
    t = np.random.default_rng(5).normal(size=x.shape)

    def f(x):
        return ops.exp(x) * x / (x * x + 2.0)

    value, tangent = cloud.jvp(f, (x,), (t,))
    t_value, t_tangent = torch.func.jvp(
        lambda a: torch.exp(a) * a / (a * a + 2.0), (torch.tensor(x),), (torch.tensor(t),)
    )
    np.testing.assert_allclose(value, t_value.numpy(), rtol=1e-12)
    np.testing.assert_allclose(tangent, t_tangent.numpy(), rtol=1e-9, atol=1e-12)


# Scalar functions whose first backward uses only ops that have rules themselves (the
# elementwise ops; tests/unit/autodiff/test_second_order.py covers the backward kernels)

SECOND_ORDER = {
    "ADD": (lambda x: x + x * x, lambda x: x + x * x),
    "SUB": (lambda x: x * 3.0 - x * x * x, lambda x: x * 3.0 - x * x * x),
    "MUL": (lambda x: x * x * x, lambda x: x * x * x),
    "DIV": (lambda x: 1.0 / (x * x + 1.0), lambda x: 1.0 / (x * x + 1.0)),
    "NEG": (lambda x: -(x * x * x), lambda x: -(x * x * x)),
    "EXP": (lambda x: ops.exp(x * x), lambda x: torch.exp(x * x)),
    "LOG": (lambda x: ops.log(x * x + 1.0), lambda x: torch.log(x * x + 1.0)),
    "SQRT": (lambda x: ops.sqrt(x * x + 1.0), lambda x: torch.sqrt(x * x + 1.0)),
    "SQUARE": (lambda x: ops.square(ops.exp(x)), lambda x: torch.exp(x) ** 2),
    "RECIPROCAL": (lambda x: ops.reciprocal(x + 2.0), lambda x: 1.0 / (x + 2.0)),
    "RESHAPE": (
        lambda x: ops.apply(OpCode.RESHAPE, ops.exp(x).reshape(1, 1), shape=[]),
        lambda x: torch.exp(x),
    ),
}


@pytest.mark.parametrize("op", sorted(SECOND_ORDER))
def test_second_derivative_where_backward_ops_have_rules(op, mode):
    ours, theirs = SECOND_ORDER[op]
    x = np.array(0.7)
    second = cloud.grad(cloud.grad(ours))(x)
    expected = torch.func.grad(torch.func.grad(theirs))(torch.tensor(0.7, dtype=torch.float64))
    assert np.shape(second) == ()
    np.testing.assert_allclose(second, expected.numpy(), rtol=1e-9)
    third = cloud.grad(cloud.grad(cloud.grad(ours)))(x)
    expected = torch.func.grad(torch.func.grad(torch.func.grad(theirs)))(
        torch.tensor(0.7, dtype=torch.float64)
    )
    np.testing.assert_allclose(third, expected.numpy(), rtol=1e-9, atol=1e-12)


def test_hessian_of_a_scalar_function(mode):
    def f(x):
        return ops.exp(x) * x * x

    h = cloud.hessian(f)(np.array(0.3))
    expected = torch.autograd.functional.hessian(
        lambda t: torch.exp(t) * t * t, torch.tensor(0.3, dtype=torch.float64)
    )
    np.testing.assert_allclose(h, expected.numpy(), rtol=1e-9)


def _rnn(x):
    t = x.tape
    weights = [t.constant(n, np.full(s, 0.5)) for n, s in (("w", (1, 1, 1)), ("r", (1, 1, 1)))]
    b, h0 = t.constant("b", np.zeros((1, 2))), t.constant("h0", np.zeros((1, 1, 1)))
    y = t.op(OpCode.RNN, [x.reshape(3, 1, 1), *weights, b, None, h0], num_outputs=2, hidden_size=1)
    return y[0]


@pytest.mark.parametrize(("f", "missing"), [(_rnn, "RNN_GRAD: .* the input's shape known")])
def test_second_derivative_names_the_backward_op_it_cannot_rebuild(f, missing):
    """A recurrent layer traced without its input's shape cannot be rebuilt as a loop for
    the second derivative: the error names the backward op and what it needs."""
    with cloud.using_mode("graph"), pytest.raises(UnsupportedOpError, match=missing):
        inner = cloud.grad(lambda y: ops.sum(f(y)))
        cloud.grad(lambda x: ops.sum(inner(x)))(np.ones(3))


def test_the_gradient_is_an_ir_graph():
    x, w, b = _data()
    model = cloud.grad(mlp, argnums=1).graph(x, w, b)
    ops_used = {n.op for n in model.graphs[0].nodes}
    assert OpCode.MATMUL_TRANSPOSED in ops_used or OpCode.MATMUL in ops_used
    assert OpCode.ACTIVATION_GRAD in ops_used  # tanh's backward, built by the engine
    assert [model.tensors[i].shape for i in model.graphs[0].outputs] == [(4, 3)]


def test_a_model_is_differentiable_in_its_inputs(mode):
    cloud.manual_seed(0)
    net = cloud.Sequential(cloud.layers.Dense(4, 8), cloud.layers.Tanh(), cloud.layers.Dense(8, 2))
    x = np.random.default_rng(6).normal(size=(3, 4)).astype(np.float32)
    dx = cloud.grad(lambda x: ops.sum(net(x)))(x)
    w1, b1 = net[0].weight.value, net[0].bias.value
    w2 = net[2].weight.value
    h = np.tanh(x @ w1.T + b1)
    expected = ((1 - h * h) * w2.sum(axis=0)) @ w1
    np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-6)


def test_gradients_with_respect_to_a_models_parameters(mode):
    # functional_call feeds Vars as parameters: the gradient equals PyTorch's on the same
    # network and the fit engine's.
    cloud.manual_seed(1)
    net = cloud.Sequential(cloud.layers.Dense(4, 6), cloud.layers.Tanh(), cloud.layers.Dense(6, 3))
    names = [n for n, _ in net.named_parameters()]
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = rng.integers(0, 3, 5)

    def loss(x, *ws):
        logits = cloud.functional_call(net, dict(zip(names, ws, strict=True)), x)
        return ops.mean(ops.log_softmax(logits) * x.tape.constant("targets", -np.eye(3)[y]))

    values = [p.value for _, p in net.named_parameters()]
    grads = cloud.grad(loss, argnums=tuple(range(1, 1 + len(names))))(x, *values)
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    with torch.no_grad():
        for tp, v in zip(tnet.parameters(), values, strict=True):
            tp.copy_(torch.from_numpy(v))
    out = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
    (out / 3).backward()  # ops.mean averages over the 5 x 3 entries, cross_entropy over 5
    for got, tp in zip(grads, tnet.parameters(), strict=True):
        np.testing.assert_allclose(got, tp.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert net(x).shape == (5, 3)  # the module's own parameters are back in place
