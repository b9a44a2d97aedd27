"""Layer normalization recognition: the written-out Mean / Sub / Mul / Mean / Add / Rsqrt /
Mul chain TFLite files carry becomes one LAYER_NORM, gamma and beta included; near
misses keep their nodes; outputs match a float64 reference."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes.layer_norm import fuse_layer_norms
from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.graph import Model
from tests.unit.converter.test_passes import run

RNG = np.random.default_rng(26)
EPS = 1e-3


def _written_out(
    shape: tuple[int, ...] = (2, 3, 16),
    axes: tuple[int, ...] = (-1,),
    *,
    square: str = "mul",
    gamma: bool = True,
    beta: bool = True,
    beta_activation: str | None = None,
    swap: bool = False,
    extra_reader: bool = False,
    eps: float = EPS,
    gamma_shape: tuple[int, ...] | None = None,
) -> Model:
    """y = LayerNorm(x) over `axes` written out as the TFLite converter lowers Keras's."""
    b = ModelBuilder()
    x = b.input("x", shape)
    rank = len(shape)
    first = min(a % rank for a in axes)
    normalized = shape[first:]
    m = b.op(OpCode.REDUCE_MEAN, [x], axes=list(axes), keepdims=1)
    d = b.op(OpCode.SUB, [x, m])
    sq = b.op(OpCode.MUL, [d, d]) if square == "mul" else b.op(OpCode.SQUARE, [d])
    v = b.op(OpCode.REDUCE_MEAN, [sq], axes=list(axes), keepdims=1)
    k = b.constant("eps", np.full((1,) * rank, eps, np.float32))
    ve = b.op(OpCode.ADD, [k, v] if swap else [v, k])
    r = b.op(OpCode.RSQRT, [ve])
    y = b.op(OpCode.MUL, [r, d] if swap else [d, r])
    if gamma:
        g = b.constant("gamma", RNG.normal(size=gamma_shape or (1, *normalized)).astype("f4"))
        y = b.op(OpCode.MUL, [g, y] if swap else [y, g])
    if beta:
        c = b.constant("beta", RNG.normal(size=normalized).astype(np.float32))
        attrs = {"activation": beta_activation} if beta_activation else {}
        y = b.op(OpCode.ADD, [y, c], **attrs)
    b.output(y, name="y")
    if extra_reader:
        b.output(b.op(OpCode.RELU, [v]), name="var")
    return b.build()


def _reference(model: Model, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The written-out chain in float64 from the model's own constants."""
    tensors = {t.name: t.data for t in model.tensors if t.data is not None}
    x64 = x.astype(np.float64)
    axes = tuple(a % x.ndim for a in axes)
    d = x64 - x64.mean(axis=axes, keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + float(tensors["eps"].flat[0]))
    if "gamma" in tensors:
        y = y * tensors["gamma"]
    if "beta" in tensors:
        y = y + tensors["beta"]
    return y


def _fused(model: Model) -> tuple[Model, int]:
    fused = copy.deepcopy(model)
    return fused, fuse_layer_norms(fused)


CASES = {
    "keras": {},
    "square-op": {"square": "square"},
    "swapped-operands": {"swap": True},
    "no-gamma-no-beta": {"gamma": False, "beta": False},
    "no-beta": {"beta": False},
    "two-axes": {"shape": (2, 4, 8), "axes": (1, 2)},
    "per-tensor-gamma": {"gamma_shape": (1,)},
    "one-row": {"shape": (1, 32)},
}


@pytest.mark.parametrize("kwargs", CASES.values(), ids=CASES.keys())
def test_the_chain_becomes_one_layer_norm(kwargs):
    model = _written_out(**kwargs)
    fused, count = _fused(model)
    assert count == 1
    assert [n.op for n in fused.graphs[0].nodes] == [OpCode.LAYER_NORM]
    shape = kwargs.get("shape", (2, 3, 16))
    x = (RNG.normal(size=shape) * 3 + 1).astype(np.float32)
    want = _reference(model, x, kwargs.get("axes", (-1,)))
    got = run(fused, {"x": x})["y"]
    # float32 statistics over at most 48 elements: a few float32 ulps.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, run(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_beta_add_with_an_activation_stays_a_node():
    model = _written_out(beta_activation="relu")
    fused, count = _fused(model)
    assert count == 1
    assert [n.op for n in fused.graphs[0].nodes] == [OpCode.LAYER_NORM, OpCode.ADD]
    x = RNG.normal(size=(2, 3, 16)).astype(np.float32)
    want = np.maximum(_reference(model, x, (-1,)), 0)
    np.testing.assert_allclose(run(fused, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


NEAR_MISSES = {
    "leading-axis": {"shape": (4, 3, 16), "axes": (0,)},
    "non-trailing-axes": {"shape": (2, 4, 8), "axes": (1,)},
    "variance-read-elsewhere": {"extra_reader": True},
}


@pytest.mark.parametrize("kwargs", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_keep_their_nodes(kwargs):
    model = _written_out(**kwargs)
    fused, count = _fused(model)
    assert count == 0
    assert [n.op for n in fused.graphs[0].nodes] == [n.op for n in model.graphs[0].nodes]


def test_gamma_that_broadcasts_over_rows_is_not_folded():
    # A gamma varying along a non-normalized axis is not LAYER_NORM's scale: the Mul
    # stays, the normalization itself is still fused.
    model = _written_out(shape=(2, 3, 16), gamma_shape=(3, 1), beta=False)
    fused, count = _fused(model)
    assert count == 1
    assert [n.op for n in fused.graphs[0].nodes] == [OpCode.LAYER_NORM, OpCode.MUL]
    x = RNG.normal(size=(2, 3, 16)).astype(np.float32)
    np.testing.assert_allclose(
        run(fused, {"x": x})["y"], _reference(model, x, (-1,)), rtol=1e-5, atol=1e-5
    )
