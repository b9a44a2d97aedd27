"""GELU recognition: x * 0.5 * (1 + Erf(x / sqrt 2)) written out as exporters do becomes
one GELU op in each grouping real models use; near misses keep their nodes; outputs match
onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit.converter.helpers import (
    assert_matches_ort,
    convert,
    helper,
    make_model,
    op_names,
    run_spore,
)

RNG = np.random.default_rng(11)
SHAPE = [2, 3, 40]
SQRT2 = np.float32(math.sqrt(2))


def _k(value: float, shape: tuple[int, ...] = ()) -> np.ndarray:
    return np.full(shape, value, np.float32)


def _written_out(
    grouping: str,
    *,
    scale: str = "div",
    root: np.ndarray | None = None,
    one: float = 1.0,
    half: np.ndarray | None = None,
    extra_reader: str | None = None,
) -> object:
    """y = GELU(x) as Div|Mul -> Erf -> Add -> two Muls; `grouping` orders the products:
    "x*a*h" ((x * a) * 0.5, PyTorch), "h*a*x" (x * (0.5 * a), torch.onnx dynamo) or
    "xh*a" ((x * 0.5) * a)."""
    inits = {
        "r": root if root is not None else (SQRT2 if scale == "div" else 1 / SQRT2),
        "one": _k(one),
        "h": half if half is not None else _k(0.5),
    }
    first = (
        helper.make_node("Div", ["x", "r"], ["z"])
        if scale == "div"
        else helper.make_node("Mul", ["r", "x"], ["z"])
    )
    nodes = [
        first,
        helper.make_node("Erf", ["z"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["a"]),
    ]
    if grouping == "x*a*h":
        nodes += [
            helper.make_node("Mul", ["x", "a"], ["m"]),
            helper.make_node("Mul", ["m", "h"], ["y"]),
        ]
    elif grouping == "h*a*x":
        nodes += [
            helper.make_node("Mul", ["h", "a"], ["m"]),
            helper.make_node("Mul", ["x", "m"], ["y"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["x", "h"], ["m"]),
            helper.make_node("Mul", ["a", "m"], ["y"]),
        ]
    outputs = ["y"]
    if extra_reader is not None:
        nodes.append(helper.make_node("Neg", [extra_reader], ["n"]))
        outputs.append("n")
    return make_model(nodes, {"x": SHAPE}, outputs, initializers=inits)


def _feeds() -> dict[str, np.ndarray]:
    return {"x": (RNG.normal(size=SHAPE) * 3).astype(np.float32)}


@pytest.mark.parametrize("grouping", ["x*a*h", "h*a*x", "xh*a"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_written_out_gelu_becomes_one_op(grouping: str, scale: str) -> None:
    model = _written_out(grouping, scale=scale)
    ir = convert(model)
    assert op_names(ir) == ["GELU"]
    assert ir.graphs[0].nodes[0].attrs.get("approximate", "none") == "none"
    assert_matches_ort(model, _feeds(), rtol=1e-5, atol=2e-6)


def test_gelu_matches_float64_over_its_range() -> None:
    model = _written_out("x*a*h")
    x = np.linspace(-12, 12, 2 * 3 * 40).astype(np.float32).reshape(SHAPE)
    x64 = x.astype(np.float64).ravel()
    want = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x64]).reshape(SHAPE)
    assert_matches_ort(model, {"x": x}, rtol=1e-5, atol=2e-6)
    (ours,) = run_spore(model, {"x": x})
    np.testing.assert_allclose(ours, want, rtol=2e-6, atol=6e-7)


@pytest.mark.parametrize(
    "variant",
    ["root", "one", "half", "broadcasting-half", "erf-reader", "sum-reader", "product-reader"],
)
def test_near_misses_keep_their_nodes(variant: str) -> None:
    options: dict = {
        "root": {"root": _k(1.5)},
        "one": {"one": 2.0},
        "half": {"half": _k(0.25)},
        "broadcasting-half": {"half": _k(0.5, (1, 1, 1, 1))},
        "erf-reader": {"extra_reader": "e"},
        "sum-reader": {"extra_reader": "a"},
        "product-reader": {"extra_reader": "m"},
    }[variant]
    model = _written_out("x*a*h", **options)
    names = op_names(convert(model))
    assert "GELU" not in names and "ERF" in names
    assert_matches_ort(model, _feeds(), rtol=1e-5, atol=2e-6)
