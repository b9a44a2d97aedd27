"""Shared gradient check: an op's IR gradient vs central finite differences (and PyTorch).

`check_op` builds a tiny graph with ModelBuilder around the op (inputs as graph inputs,
params as constants), reduces its output to a scalar with an MSE against a fixed random
target, appends the backward graph with append_gradients, and compares every gradient
with central differences of the planned loss in float64. With a `torch_fn`, the same
loss is differentiated by PyTorch autograd and compared too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.autodiff import append_gradients
from sporenet.lite.planner import plan

# Central differences in float64: truncation error ~h^2 * f''' and rounding ~eps / h are
# both far below the 1e-4 target (issue 4) for h = 1e-6 and O(1) inputs.
STEP = 1e-6
RTOL = 1e-4


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(np.linalg.norm(a), np.linalg.norm(b))
    return 0.0 if scale == 0 else float(np.linalg.norm(a - b) / scale)


class GradientCase:
    """A planned graph computing loss(op(inputs, params)) and all its gradients."""

    def __init__(
        self,
        build: Callable[..., int],
        inputs: dict[str, np.ndarray],
        params: dict[str, np.ndarray],
        *,
        seed: int = 0,
        wrt: list[str] | None = None,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.builder = b = ModelBuilder()
        ids = {name: b.input(name, a.shape, a.dtype) for name, a in inputs.items()}
        ids.update(
            {name: b.constant(name, a, a.dtype, trainable=True) for name, a in params.items()}
        )
        y = build(b, **ids)
        probe = b.build()
        t = probe.tensors[y]
        self.target = np.asarray(rng.normal(size=t.shape), dtype=t.dtype)
        # b.tensor, not b.constant: np.ascontiguousarray would turn a 0-d target into 1-d.
        target = b.tensor("target", t.shape, t.dtype, data=np.asarray(self.target))
        loss = b.op(OpCode.MSE_LOSS, [y, target])
        b.output(loss, "loss")
        b.output(y, "y")
        model = b.build()
        names = (
            wrt
            if wrt is not None
            else [
                n
                for n in ids
                if ids[n] is not None and np.asarray({**inputs, **params}[n]).dtype.kind == "f"
            ]
        )
        grads = append_gradients(model, 0, loss, [ids[n] for n in names])
        for n in names:
            model.graphs[0].outputs.append(grads[ids[n]])
            model.signatures["infer"].outputs[f"grad:{n}"] = grads[ids[n]]
        self.model, self.loss, self.y, self.ids, self.names = model, loss, y, ids, names
        self.variables = {ids[n]: np.array(a, copy=True) for n, a in params.items()}
        self.plan = plan(model, "infer", variables=self.variables)
        for name, a in inputs.items():
            np.copyto(self.plan.arrays[ids[name]], a)
        self.grads_ids = grads

    def run(self) -> float:
        self.plan.run()
        return float(self.plan.arrays[self.loss])

    def output(self) -> np.ndarray:
        return np.array(self.plan.arrays[self.y])

    def gradients(self) -> dict[str, np.ndarray]:
        self.run()
        return {n: np.array(self.plan.arrays[self.grads_ids[self.ids[n]]]) for n in self.names}

    def finite_differences(
        self, name: str, max_elements: int = 48, seed: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat indices, central-difference derivatives) for up to max_elements entries."""
        array = self.plan.arrays[self.ids[name]]
        flat = array.reshape(-1)
        rng = np.random.default_rng(seed)
        idx = np.arange(flat.size)
        if flat.size > max_elements:
            idx = np.sort(rng.choice(flat.size, max_elements, replace=False))
        fd = np.empty(idx.size)
        for k, i in enumerate(idx):
            orig = flat[i]
            flat[i] = orig + STEP
            plus = self.run()
            flat[i] = orig - STEP
            minus = self.run()
            flat[i] = orig
            fd[k] = (plus - minus) / (2 * STEP)
        self.run()
        return idx, fd


def check_op(
    build: Callable[..., int],
    inputs: dict[str, np.ndarray],
    params: dict[str, np.ndarray] | None = None,
    *,
    torch_fn: Callable[..., Any] | None = None,
    seed: int = 0,
    wrt: list[str] | None = None,
    max_elements: int = 48,
    torch_atol: float = 1e-12,
) -> GradientCase:
    """Assert every gradient of the op's graph matches finite differences (and PyTorch)."""
    params = params or {}
    case = GradientCase(build, inputs, params, seed=seed, wrt=wrt)
    grads = case.gradients()
    for name in case.names:
        idx, fd = case.finite_differences(name, max_elements)
        analytic = grads[name].reshape(-1)[idx]
        err = relative_error(analytic, fd)
        assert err < RTOL, f"d loss / d {name}: relative error {err:.2e} vs finite differences"
    if torch_fn is not None:
        compare_torch(case, torch_fn, inputs, params, atol=torch_atol)
    return case


def compare_torch(
    case: GradientCase,
    torch_fn: Callable[..., Any],
    inputs: dict[str, np.ndarray],
    params: dict[str, np.ndarray],
    *,
    atol: float = 1e-12,
) -> None:
    """Forward output and every gradient equal PyTorch's (both analytic, float64)."""
    import pytest

    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    tensors = {
        n: torch.tensor(a, requires_grad=n in case.names) for n, a in {**inputs, **params}.items()
    }
    y = torch_fn(**tensors)
    loss = torch.mean((y - torch.tensor(case.target)) ** 2)
    loss.backward()
    # Both sides are exact float64 computations of the same formulas in different orders.
    np.testing.assert_allclose(case.output(), y.detach().numpy(), rtol=1e-9, atol=atol)
    grads = case.gradients()
    for name in case.names:
        expected = tensors[name].grad
        assert expected is not None, f"PyTorch computed no gradient for {name}"
        np.testing.assert_allclose(
            grads[name],
            expected.numpy(),
            rtol=1e-7,
            atol=atol,
            err_msg=f"d loss / d {name} vs PyTorch",
        )


def away_from(x: np.ndarray, points: tuple[float, ...], margin: float = 0.05) -> np.ndarray:
    """x with entries within `margin` of a kink (e.g. 0 for Relu) pushed away from it, so
    finite differences never straddle a point where the derivative jumps."""
    x = np.array(x, copy=True)
    for p in points:
        near = np.abs(x - p) < margin
        x[near] = p + np.where(x[near] >= p, margin, -margin) * 2
    return x


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape) * scale
