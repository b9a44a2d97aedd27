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
from sporenet.lite.autodiff.rules import GRADIENT_RULES, SECOND_ORDER
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


def _fq_reference(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, **attrs: Any) -> np.ndarray:
    """FAKE_QUANT's value at x (the straight-through reference adds only its gradient)."""
    with cloud.using_mode("eager"):
        fq = cloud.function(lambda x, lo, hi: ops.apply(O.FAKE_QUANT, x, lo, hi, **attrs))
        return np.asarray(fq(x, lo, hi))


def _ste(x: Any, lo: Any, hi: Any, **attrs: Any) -> Any:
    # The straight-through estimator: the rounded value, the clamp's derivative.
    shape = [1] * x.dim()
    if "axis" in attrs:
        shape[attrs["axis"]] = -1
    clamp = torch.minimum(torch.maximum(x, lo.reshape(shape)), hi.reshape(shape))
    values = (a.detach().numpy() for a in (x, lo, hi))
    return torch.tensor(_fq_reference(*values, **attrs)) + clamp - clamp.detach()


def _ints(like: Any, values: np.ndarray) -> Any:
    """An integer constant on like's tape (numbers and arrays otherwise become floats)."""
    return like.tape.constant("indices", values, keep_dtype=True)


BN = [rng.normal(size=(2,)) + 1.5, rng.normal(size=(2,)), rng.normal(size=(2,)) * 0.1]
RUNNING_VAR = np.abs(rng.normal(size=(2,))) + 0.5
LN_SCALE = rng.normal(size=(4,)) + 1.0
FQ_X = np.linspace(-2.0, 2.0, 12).reshape(3, 4) + 0.013  # away from the grid's edges
FQ_RANGE = [np.array(-1.21), np.array(1.37)]
FQ_W = np.random.default_rng(6).normal(size=(2, 3, 2))
INDICES = np.array([[2, 0], [1, 2]], np.int64)

CASES |= {
    "MAX_POOL2D": (
        [IMG],
        lambda x: ops.sum(
            ops.square(
                ops.tanh(
                    ops.apply(O.MAX_POOL2D, x, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
                )
            )
        ),
        lambda x: torch.sum(torch.tanh(F.max_pool2d(x, 3, 2, padding=1)) ** 2),
    ),
    "MAX_POOL2D:tiled": (  # windows that tile the input: MAX_POOL2D_GRAD's other path
        [IMG[..., :4, :4].copy()],
        lambda x: ops.sum(
            ops.square(ops.tanh(ops.apply(O.MAX_POOL2D, x, kernel_shape=[2, 2], strides=[2, 2])))
        ),
        lambda x: torch.sum(torch.tanh(F.max_pool2d(x, 2, 2)) ** 2),
    ),
    # routing=1 (a training graph's pool): MAX_POOL2D_GRAD reads the routing mask, and its
    # own gradient must still select through x and y.
    "MAX_POOL2D:routing": (
        [IMG],
        lambda x: ops.sum(
            ops.square(
                ops.tanh(
                    ops.apply(
                        O.MAX_POOL2D,
                        x,
                        num_outputs=2,
                        routing=1,
                        kernel_shape=[3, 3],
                        strides=[2, 2],
                        pads=[1] * 4,
                    )[0]
                )
            )
        ),
        lambda x: torch.sum(torch.tanh(F.max_pool2d(x, 3, 2, padding=1)) ** 2),
    ),
    "MAX_POOL2D:tiled_routing": (
        [IMG[..., :4, :4].copy()],
        lambda x: ops.sum(
            ops.square(
                ops.tanh(
                    ops.apply(
                        O.MAX_POOL2D,
                        x,
                        num_outputs=2,
                        routing=1,
                        kernel_shape=[2, 2],
                        strides=[2, 2],
                    )[0]
                )
            )
        ),
        lambda x: torch.sum(torch.tanh(F.max_pool2d(x, 2, 2)) ** 2),
    ),
    "GLOBAL_MAX_POOL": (
        [IMG],
        lambda x: ops.sum(ops.tanh(ops.apply(O.GLOBAL_MAX_POOL, x) * 2.0)),
        lambda x: torch.sum(torch.tanh(torch.amax(x, (2, 3)) * 2)),
    ),
    "BATCH_NORM": (
        [IMG, BN[0], BN[1]],
        lambda x, s, b: ops.sum(
            ops.tanh(ops.apply(O.BATCH_NORM, x, s, b, BN[2], RUNNING_VAR, epsilon=1e-5))
        ),
        lambda x, s, b: torch.sum(
            torch.tanh(
                F.batch_norm(
                    x, torch.tensor(BN[2]), torch.tensor(RUNNING_VAR), s, b, False, eps=1e-5
                )
            )
        ),
    ),
    "BATCH_NORM_TRAINING": (
        [IMG, BN[0], BN[1]],
        lambda x, s, b: ops.sum(
            ops.tanh(
                ops.apply(
                    O.BATCH_NORM_TRAINING,
                    x,
                    s,
                    b,
                    BN[2].copy(),
                    RUNNING_VAR.copy(),
                    epsilon=1e-5,
                    num_outputs=3,
                )[0]
            )
            * IMG_WEIGHTS
        ),
        lambda x, s, b: torch.sum(
            torch.tanh(F.batch_norm(x, None, None, s, b, True, eps=1e-5))
            * torch.tensor(IMG_WEIGHTS)
        ),
    ),
    "LAYER_NORM": (
        [X, LN_SCALE, BIAS[:1].repeat(4)],
        lambda x, s, b: ops.sum(
            ops.tanh(ops.apply(O.LAYER_NORM, x, s, b, axis=-1, epsilon=1e-5, num_outputs=1)) * C
        ),
        lambda x, s, b: torch.sum(torch.tanh(F.layer_norm(x, (4,), s, b, 1e-5)) * torch.tensor(C)),
    ),
    "LAYER_NORM:broadcast": (  # over two axes with a scale broadcast along the first
        [IMG, LN_SCALE[:1].repeat(5) + 0.5],
        lambda x, s: ops.sum(
            ops.tanh(ops.apply(O.LAYER_NORM, x, s, axis=2, epsilon=1e-3, num_outputs=1))
            * IMG_WEIGHTS
        ),
        lambda x, s: torch.sum(
            torch.tanh(F.layer_norm(x, (5, 5), s.expand(5, 5), None, 1e-3))
            * torch.tensor(IMG_WEIGHTS)
        ),
    ),
    "SLICE": (
        [X],
        lambda x: ops.sum(
            ops.square(ops.tanh(ops.apply(O.SLICE, x, starts=[1], ends=[4], axes=[1]) * 2.0))
        ),
        lambda x: torch.sum(torch.tanh(x[:, 1:4] * 2) ** 2),
    ),
    "PAD": (
        [X],
        lambda x: ops.sum(
            ops.tanh(ops.apply(O.PAD, x, pads=[1, 0, 0, 2], mode="constant") + 0.5) * PAD_WEIGHTS
        ),
        lambda x: torch.sum(torch.tanh(F.pad(x, (0, 2, 1, 0)) + 0.5) * torch.tensor(PAD_WEIGHTS)),
    ),
    "GATHER": (
        [X],
        lambda x: ops.sum(ops.square(ops.tanh(ops.apply(O.GATHER, x, _ints(x, INDICES), axis=1)))),
        lambda x: torch.sum(torch.tanh(x[:, torch.tensor(INDICES)]) ** 2),
    ),
    "FAKE_QUANT": (  # straight-through: compared with PyTorch only (see STRAIGHT_THROUGH)
        [FQ_X, *FQ_RANGE],
        lambda x, lo, hi: ops.sum(ops.tanh(ops.apply(O.FAKE_QUANT, x, lo, hi)) * C),
        lambda x, lo, hi: torch.sum(torch.tanh(_ste(x, lo, hi)) * torch.tensor(C)),
    ),
    "FAKE_QUANT:per_channel": (
        [FQ_X.reshape(2, 3, 2), np.array([-1.21, -0.83, -1.55]), np.array([1.37, 0.91, 1.12])],
        lambda x, lo, hi: ops.sum(ops.tanh(ops.apply(O.FAKE_QUANT, x, lo, hi, axis=1)) * FQ_W),
        lambda x, lo, hi: torch.sum(torch.tanh(_ste(x, lo, hi, axis=1)) * torch.tensor(FQ_W)),
    ),
    "PRELU": (
        [X, BIAS.copy()[:1].repeat(4) * 0.3],
        lambda x, a: ops.sum(ops.square(ops.apply(O.PRELU, x, a)) * C),
        lambda x, a: torch.sum(torch.where(x < 0, a * x, x) ** 2 * torch.tensor(C)),
    ),
}
IMG_WEIGHTS = np.random.default_rng(4).normal(size=IMG.shape)
PAD_WEIGHTS = np.random.default_rng(5).normal(size=(4, 6))
# The straight-through estimator is not the derivative of the rounded forward, whose
# finite differences are zero: these cases are checked against PyTorch only.
STRAIGHT_THROUGH = {"FAKE_QUANT", "FAKE_QUANT:per_channel"}


def _sigmoid_bprop(x: Any, out: Any, dout: Any) -> Any:
    return dout * out * (1.0 - out)


@cloud.custom_gradient(_sigmoid_bprop)
def _custom_sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + ops.exp(-x))


def _dropped(x: Any) -> Any:
    # y = x * mask with the mask drawn in the run: f = sum(y^2 C) - sum((x mask)^2 C) is
    # zero, and so is its HVP when the rule multiplies by the mask the forward drew.
    y, mask = ops.apply(O.DROPOUT, x, num_outputs=2, ratio=0.5, training=1, seed=3)
    return ops.sum(ops.square(y) * C) - ops.sum(ops.square(x * mask) * C)


def _selected(u: Any) -> Any:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}
    pooled = u.tape.constant("pooled", POOLED, keep_dtype=True)
    image = u.tape.constant("image", IMG, keep_dtype=True)
    return ops.sum(ops.square(ops.tanh(ops.apply(O.MAX_POOL2D_SELECT, u, image, pooled, **attrs))))


def _torch_selected(u: Any) -> Any:
    _, where = F.max_pool2d(torch.tensor(IMG), 3, 2, padding=1, return_indices=True)
    picked = u.flatten(2).gather(2, where.flatten(2)).view_as(where)
    return torch.sum(torch.tanh(picked) ** 2)


POOLED = F.max_pool2d(torch.tensor(IMG), 3, 2, padding=1).numpy()
POSITIVE = X * X + 0.5
WHERE_MASK = X > 0.2

CASES |= {
    "SUB": (
        [X, C],
        lambda a, b: ops.sum(ops.tanh(a - b * a)),
        lambda a, b: torch.sum(torch.tanh(a - b * a)),
    ),
    "MUL": (
        [X, C],
        lambda a, b: ops.sum(ops.tanh(a * b)),
        lambda a, b: torch.sum(torch.tanh(a * b)),
    ),
    "DIV": (
        [X, POSITIVE],
        lambda a, b: ops.sum(ops.tanh(a / b)),
        lambda a, b: torch.sum(torch.tanh(a / b)),
    ),
    "MINIMUM": (
        [X, C],
        lambda a, b: ops.sum(ops.square(ops.minimum(a, b * 0.5))),
        lambda a, b: torch.sum(torch.minimum(a, b * 0.5) ** 2),
    ),
    "NEG": ([X], lambda x: ops.sum(ops.tanh(-x) * C), _t(lambda x: torch.tanh(-x))),
    "EXP": ([X], _act(O.EXP), _t(torch.exp)),
    "LOG": ([POSITIVE], _act(O.LOG), _t(torch.log)),
    "SQRT": ([POSITIVE], _act(O.SQRT), _t(torch.sqrt)),
    "SQUARE": (
        [X],
        lambda x: ops.sum(ops.square(ops.tanh(x)) * C),
        _t(lambda x: torch.tanh(x) ** 2),
    ),
    "RECIPROCAL": ([POSITIVE], _act(O.RECIPROCAL), _t(torch.reciprocal)),
    "RELU6": (
        [X * 4],
        lambda x: ops.sum(ops.square(ops.apply(O.RELU6, x)) * C),
        _t(lambda x: F.relu6(x) ** 2),
    ),
    "CLIP": (
        [X],
        lambda x: ops.sum(ops.square(ops.apply(O.CLIP, x, min=-0.5, max=0.7)) * C),
        _t(lambda x: torch.clamp(x, -0.5, 0.7) ** 2),
    ),
    "HARD_SIGMOID": (
        [X * 3],
        lambda x: ops.sum(ops.square(ops.apply(O.HARD_SIGMOID, x, alpha=0.2, beta=0.5)) * C),
        _t(lambda x: torch.clamp(0.2 * x + 0.5, 0, 1) ** 2),
    ),
    "REDUCE_SUM": (
        [X],
        lambda x: ops.sum(ops.square(ops.sum(ops.tanh(x), axis=0))),
        lambda x: torch.sum(torch.sum(torch.tanh(x), 0) ** 2),
    ),
    "IDENTITY": ([X], lambda x: ops.sum(ops.tanh(ops.apply(O.IDENTITY, x)) * C), _t(torch.tanh)),
    "RESHAPE": (
        [X],
        lambda x: ops.sum(ops.tanh(ops.apply(O.RESHAPE, x, shape=[4, 3])) * C.reshape(4, 3)),
        lambda x: torch.sum(torch.tanh(x.reshape(4, 3)) * torch.tensor(C.reshape(4, 3))),
    ),
    "FLATTEN": (
        [IMG],
        lambda x: ops.sum(ops.square(ops.tanh(ops.apply(O.FLATTEN, x, axis=1)))),
        lambda x: torch.sum(torch.tanh(x.reshape(2, -1)) ** 2),
    ),
    "SQUEEZE": (
        [X[:, None, :].copy()],
        lambda x: ops.sum(ops.tanh(ops.apply(O.SQUEEZE, x, axes=[1])) * C),
        _t(lambda x: torch.tanh(x[:, 0, :])),
    ),
    "UNSQUEEZE": (
        [X],
        lambda x: ops.sum(ops.tanh(ops.apply(O.UNSQUEEZE, x, axes=[0])) * C),
        _t(lambda x: torch.tanh(x[None])),
    ),
    "TRANSPOSE": (
        [X],
        lambda x: ops.sum(ops.tanh(ops.transpose(x, [1, 0])) * C.T),
        lambda x: torch.sum(torch.tanh(x.T) * torch.tensor(C.T)),
    ),
    "CONCAT": (
        [X, C],
        lambda a, b: ops.sum(ops.square(ops.tanh(ops.concat([a, b * a], axis=1)))),
        lambda a, b: torch.sum(torch.tanh(torch.cat([a, b * a], 1)) ** 2),
    ),
    "SPLIT": (
        [X],
        lambda x: ops.sum(
            ops.square(ops.tanh(ops.apply(O.SPLIT, x, axis=1, split=[1, 3], num_outputs=2)[1]))
        ),
        lambda x: torch.sum(torch.tanh(x[:, 1:]) ** 2),
    ),
    "EXPAND": (
        [X[:1].copy()],
        lambda x: ops.sum(ops.tanh(ops.apply(O.EXPAND, x, shape=[3, 4])) * C),
        lambda x: torch.sum(torch.tanh(x.expand(3, 4)) * torch.tensor(C)),
    ),
    "WHERE": (
        [X, C],
        lambda a, b: ops.sum(ops.square(ops.where(ops.greater(a, 0.2), a * b, b))),
        lambda a, b: torch.sum(torch.where(torch.tensor(WHERE_MASK), a * b, b) ** 2),
    ),
    "DROPOUT": ([X], _dropped, lambda x: torch.sum(x * 0.0)),
    "IF": (
        [X],
        lambda x: ops.sum(
            cloud.cond(ops.greater(ops.sum(x), -1.0), lambda v: ops.tanh(v) * v, ops.neg, x) * C
        ),
        _t(lambda x: torch.tanh(x) * x if float(x.detach().sum()) > -1 else -x),
    ),
    "LOOP": (
        [X],
        lambda x: ops.sum(cloud.fori_loop(3, lambda i, h: ops.tanh(h * 1.5), x) * C),
        _t(lambda x: torch.tanh(1.5 * torch.tanh(1.5 * torch.tanh(1.5 * x)))),
    ),
    "CALL": (
        [X],
        lambda x: ops.sum(ops.square(_custom_sigmoid(x)) * C),
        _t(lambda x: torch.sigmoid(x) ** 2),
    ),
    "MAX_POOL2D_SELECT": ([IMG], _selected, _torch_selected),
}

# Recurrent layers: their backward ops' rule differentiates the layer rebuilt from
# differentiable ops (lite/autodiff/rules/recurrent_graph.py). PyTorch's torch.nn.LSTM,
# GRU and RNN take ONNX's weights with the gate blocks reordered.
SEQ_X = rng.normal(size=(3, 2, 2))  # (sequence, batch, input)
HID = 3
# ONNX's gate order -> PyTorch's: LSTM i, o, f, c -> i, f, g, o; GRU z, r, h -> r, z, n
TORCH_ORDER = {O.LSTM: [0, 2, 3, 1], O.LSTM_TRAINING: [0, 2, 3, 1], O.GRU: [1, 0, 2], O.RNN: [0]}
TORCH_KIND = {O.LSTM: "LSTM", O.LSTM_TRAINING: "LSTM", O.GRU: "GRU", O.RNN: "RNN"}
RECURRENT_OUTPUTS = {O.LSTM: 3, O.LSTM_TRAINING: 4, O.GRU: 2, O.RNN: 2}


def _recurrent_weights(op: OpCode, dirs: int = 1, size: int = 2) -> list[np.ndarray]:
    """W, R, B, initial_h (, initial_c) of a layer of HID units over `size` inputs."""
    r = np.random.default_rng(int(op))
    gates = len(TORCH_ORDER[op]) * HID
    weights = [
        r.normal(size=(dirs, gates, size)) * 0.5,
        r.normal(size=(dirs, gates, HID)) * 0.5,
        r.normal(size=(dirs, 2 * gates)) * 0.5,
        r.normal(size=(dirs, 2, HID)) * 0.5,
    ]
    if op in (O.LSTM, O.LSTM_TRAINING):
        weights.append(r.normal(size=(dirs, 2, HID)) * 0.5)
    return weights


def _recurrent_y(op: OpCode, lens: np.ndarray | None = None, **attrs: Any) -> Callable:
    """Y of one recurrent node on (x, W, R, B, initial_h (, initial_c (, P)))."""

    def y(x: Any, w: Any, rec: Any, b: Any, h0: Any, *rest: Any) -> Any:
        seq_lens = None if lens is None else _ints(x, lens)
        inputs = [x, w, rec, b, seq_lens, h0, *rest]
        outs = x.tape.op(op, inputs, num_outputs=RECURRENT_OUTPUTS[op], hidden_size=HID, **attrs)
        return outs[0]

    return y


def _torch_y(op: OpCode, x: Any, w: Any, rec: Any, b: Any, h0: Any, c0: Any = None) -> Any:
    """torch.nn's layer on ONNX's weights: Y as (seq, 1, batch, H)."""
    order, kind = TORCH_ORDER[op], TORCH_KIND[op]
    gates = len(order) * HID

    def rows(t: Any) -> Any:
        return torch.cat([t[k * HID : (k + 1) * HID] for k in order])

    module = getattr(torch.nn, kind)(x.shape[-1], HID).double()
    weights = {
        "weight_ih_l0": rows(w[0]),
        "weight_hh_l0": rows(rec[0]),
        "bias_ih_l0": rows(b[0, :gates]),
        "bias_hh_l0": rows(b[0, gates:]),
    }
    state = (h0, c0) if kind == "LSTM" else h0
    y, _ = torch.func.functional_call(module, weights, (x, state))
    return y.unsqueeze(1)


def _recurrent_case(op: OpCode, **attrs: Any) -> tuple[list[np.ndarray], Callable, Callable]:
    y = _recurrent_y(op, **attrs)
    return (
        [SEQ_X, *_recurrent_weights(op)],
        lambda *a: ops.sum(ops.square(ops.tanh(y(*a)))),
        lambda *a: torch.sum(torch.tanh(_torch_y(op, *a)) ** 2),
    )


CASES |= {
    "LSTM": _recurrent_case(O.LSTM),
    "LSTM_TRAINING": _recurrent_case(O.LSTM_TRAINING),  # LSTM_GRAD reading its saved steps
    "GRU": _recurrent_case(O.GRU, linear_before_reset=1),  # PyTorch's GRU
    "RNN": _recurrent_case(O.RNN),
}


def _op(name: str) -> OpCode:
    return O[name.split(":")[0]]


def _emitted(cases: dict[str, tuple]) -> set[OpCode]:
    """Ops in the gradient graphs of the cases (their rules run in the cases' HVPs)."""
    emitted: set[OpCode] = set()
    with cloud.using_mode("graph"):
        for args, ours, *_ in cases.values():
            model = cloud.grad(ours, argnums=tuple(range(len(args)))).graph(*args)
            emitted |= {n.op for g in model.graphs for n in g.nodes}
    return emitted


def test_every_gradient_rule_has_a_case() -> None:
    # First order: each op with a rule is a case, or its rule is emitted by a case's
    # gradient (a backward op) and run by that case's HVP.
    cases = {_op(n) for n in CASES}
    missing = set(GRADIENT_RULES) - cases - (_emitted(CASES) & SECOND_ORDER)
    assert not missing, f"gradient rules without a case: {sorted(o.name for o in missing)}"
    first_only = sorted(o.name for o in set(GRADIENT_RULES) - SECOND_ORDER)
    assert not first_only, f"gradient rules that are not differentiable: {first_only}"


def test_every_second_order_rule_is_differentiated_by_a_case() -> None:
    # A declaration saying grad_differentiable is a case whose HVP is checked, or a backward
    # op emitted by some case's gradient, which that case's HVP differentiates.
    covered = {_op(n) for n in CASES} | _emitted(CASES)
    missing = SECOND_ORDER - covered
    assert not missing, f"second-order rules without an HVP case: {sorted(o.name for o in missing)}"
    assert {_op(n) for n in CASES} <= SECOND_ORDER, "a case's op must declare grad_differentiable"


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_order_matches_torch(name: str, mode: str) -> None:
    args, ours, theirs = CASES[name]
    nums = tuple(range(len(args)))
    got = cloud.grad(ours, argnums=nums)(*args)
    tensors = [torch.tensor(a, requires_grad=True) for a in args]
    want = torch.autograd.grad(theirs(*tensors), tensors, allow_unused=True)
    want = [np.zeros_like(a) if w is None else w.numpy() for a, w in zip(args, want, strict=True)]
    _close(list(got), want, rtol=FIRST_ORDER_RTOL.get(name, 1e-9))


# GELU's value and first derivative read erf, which lite computes by Abramowitz & Stegun
# 7.1.26 (absolute error below 1.5e-7); its second derivative needs only exp.
FIRST_ORDER_RTOL = {"GELU": 1e-5}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hvp_matches_torch_and_finite_differences(name: str, mode: str) -> None:
    args, ours, theirs = CASES[name]
    vs = [np.random.default_rng(1).normal(size=a.shape) for a in args]
    got = hvp(ours, args, vs)
    _close(got, torch_hvp(theirs, args, vs), rtol=1e-8)
    if mode == "graph" and name not in STRAIGHT_THROUGH:  # one finite-difference check
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


# ---- The rebuilt recurrent layers' other attributes, where PyTorch has no peer: HVPs
# against central differences of the backward kernels' gradients.
LENS = np.array([3, 1])
RECURRENT_VARIANTS: dict[str, tuple[OpCode, int, dict[str, Any]]] = {
    "LSTM:reverse": (O.LSTM, 1, {"direction": "reverse"}),
    "LSTM:bidirectional": (O.LSTM, 2, {"direction": "bidirectional"}),
    "LSTM:layout": (O.LSTM, 1, {"layout": 1}),
    "LSTM:clip": (O.LSTM, 1, {"clip": 0.7}),
    "LSTM:input_forget": (O.LSTM, 1, {"input_forget": 1}),
    "LSTM:peepholes_lens": (O.LSTM, 1, {"lens": LENS, "peepholes": True}),
    "LSTM_TRAINING:lens": (O.LSTM_TRAINING, 2, {"lens": LENS, "direction": "bidirectional"}),
    "GRU:reset_before": (O.GRU, 1, {}),
    "GRU:activations": (
        O.GRU,
        1,
        {
            "activations": "HardSigmoid,Softsign",
            "activation_alpha": [0.3, 0.0],
            "activation_beta": [0.4, 0.0],
        },
    ),
    "GRU:lens_clip": (O.GRU, 2, {"lens": LENS, "clip": 0.8, "direction": "bidirectional"}),
    "RNN:elu_reverse": (
        O.RNN,
        1,
        {"activations": "Elu", "activation_alpha": [0.7], "direction": "reverse"},
    ),
    "RNN:lens": (O.RNN, 1, {"lens": np.array([0, 2])}),  # an empty sequence
}


@pytest.mark.parametrize("name", sorted(RECURRENT_VARIANTS))
def test_recurrent_hvp_matches_finite_differences(name: str) -> None:
    op, dirs, attrs = RECURRENT_VARIANTS[name]
    attrs = dict(attrs)
    peepholes = attrs.pop("peepholes", False)
    x = SEQ_X.transpose(1, 0, 2).copy() if attrs.get("layout") else SEQ_X
    weights = _recurrent_weights(op, dirs)
    if attrs.get("layout"):  # batch-first states
        weights[3:] = [s.transpose(1, 0, 2).copy() for s in weights[3:]]
    if peepholes:
        weights.append(np.random.default_rng(8).normal(size=(dirs, 3 * HID)) * 0.5)
    y = _recurrent_y(op, **attrs)
    args = [x, *weights]
    f = lambda *a: ops.sum(ops.square(ops.tanh(y(*a))) * Y_WEIGHTS[: a[0].shape[0]])  # noqa: E731
    if attrs.get("layout"):
        f = lambda *a: ops.sum(ops.square(ops.tanh(y(*a))))  # noqa: E731
    vs = [np.random.default_rng(1).normal(size=a.shape) for a in args]
    with cloud.using_mode("graph"):
        got = hvp(f, args, vs)
        _close(got, finite_hvp(f, args, vs), rtol=1e-5, atol=1e-6)


Y_WEIGHTS = np.random.default_rng(9).normal(size=(3, 1, 1, HID))  # breaks the symmetry of sums


# ---- Hessian-vector products of small recurrent networks in their parameters (a layer, a
# dense head, cross-entropy), the target: within 1e-4 relative of PyTorch's.
SEQ_LABELS = np.eye(4)[[2, 0]]


def _recurrent_net(op: OpCode, **attrs: Any) -> Callable:
    y = _recurrent_y(op, **attrs)

    def net(x: Any, w: Any, rec: Any, b: Any, hw: Any, hb: Any, *states: Any) -> Any:
        x = w.tape.constant("x", x, keep_dtype=True)  # data, not a parameter
        last = ops.apply(O.GATHER, y(x, w, rec, b, *states), _ints(x, np.array(2)), axis=0)
        z = ops.apply(O.FULLY_CONNECTED, ops.apply(O.SQUEEZE, last, axes=[0]), hw, hb)
        return ops.apply(O.SOFTMAX_CROSS_ENTROPY, z, SEQ_LABELS, num_outputs=2)[0]

    return net


def _torch_recurrent_net(op: OpCode) -> Callable:
    def net(x: Any, w: Any, rec: Any, b: Any, hw: Any, hb: Any, *states: Any) -> Any:
        z = _torch_y(op, x, w, rec, b, *states)[2, 0] @ hw.T + hb
        return F.cross_entropy(z, torch.tensor(SEQ_LABELS.argmax(1)))

    return net


@pytest.mark.parametrize("op", [O.LSTM, O.LSTM_TRAINING, O.GRU, O.RNN], ids=lambda o: o.name)
def test_hvp_of_a_small_recurrent_network_matches_torch(op: OpCode, mode: str) -> None:
    r = np.random.default_rng(10)
    x = r.normal(size=(3, 2, 2))
    w, rec, b, *states = _recurrent_weights(op)
    params = [w, rec, b, r.normal(size=(4, HID)) * 0.5, r.normal(size=(4,)) * 0.5, *states]
    attrs = {"linear_before_reset": 1} if op == O.GRU else {}
    vs = [r.normal(size=p.shape) for p in params]
    ours, theirs = _recurrent_net(op, **attrs), _torch_recurrent_net(op)
    got = hvp(lambda *p: ours(x, *p), params, vs)
    want = torch_hvp(lambda *p: theirs(torch.tensor(x), *p), params, vs)
    for g, want_k in zip(got, want, strict=True):
        assert np.linalg.norm(g - want_k) <= 1e-4 * np.linalg.norm(want_k), (op.name, g, want_k)
