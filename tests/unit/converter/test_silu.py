"""SiLU recognition: x * Sigmoid(x) in ONNX (and ONNX Swish, TFLite LOGISTIC + MUL) becomes
one SILU op, fused into the Conv before it where it can be; outputs match onnxruntime."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

from sporenet.converter.passes import fuse_silu
from sporenet.lite import Interpreter, ModelBuilder, OpCode, serialize
from tests.unit.converter.helpers import (
    assert_matches_ort,
    convert,
    helper,
    make_model,
    op_names,
    ort,
    run_ort,
    run_spore,
)

RNG = np.random.default_rng(4)


def _conv_silu(gate_first: bool, *, extra_reader: bool = False, gate_output: bool = False):
    """x -> Conv -> c; y = c * Sigmoid(c) (operands in either order)."""
    w = (RNG.normal(size=(6, 3, 3, 3)) * 0.5).astype(np.float32)
    b = RNG.normal(size=6).astype(np.float32)
    mul_inputs = ["s", "c"] if gate_first else ["c", "s"]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", mul_inputs, ["y"]),
    ]
    outputs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Add", ["s", "y"], ["z"]))
        outputs = ["z"]
    if gate_output:
        outputs.append("s")
    return make_model(nodes, {"x": [1, 3, 8, 10]}, outputs, initializers={"w": w, "b": b})


def _feeds(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": (RNG.normal(size=(1, 3, 8, 10)) * scale).astype(np.float32)}


@pytest.mark.parametrize("gate_first", [False, True], ids=["x*s", "s*x"])
def test_conv_sigmoid_mul_becomes_a_conv_with_fused_silu(gate_first: bool) -> None:
    model = _conv_silu(gate_first)
    ir = convert(model)
    assert op_names(ir) == ["CONV2D"]
    assert ir.graphs[0].nodes[0].attrs["activation"] == "silu"
    assert_matches_ort(model, _feeds(), rtol=1e-5, atol=1e-6)


def test_fused_silu_on_large_conv_outputs_matches_float64() -> None:
    """|c| in the hundreds: exp(-c) saturates without a warning. onnxruntime's Sigmoid is a
    float32 approximation whose tail (below about -16) is flushed, so the reference here is
    x * sigmoid(x) in float64 of onnxruntime's own Conv output."""
    model = _conv_silu(False)
    conv_only = copy.deepcopy(model)
    del conv_only.graph.node[1:]
    conv_only.graph.output[0].name = "c"
    feeds = _feeds(100.0)
    (c,) = run_ort(conv_only, feeds)
    c64 = c.astype(np.float64)
    with np.errstate(over="ignore"):
        want = c64 / (1 + np.exp(-c64))
    assert c.min() < -100 and c.max() > 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = run_spore(model, feeds)
    # The two Convs' float32 sums differ by a few ulp of |c| (hundreds): that absolute
    # error moves SiLU's tail values (|y| < 1e-5 where c < -14) by about as much relatively.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mul_of_an_input_and_its_sigmoid_becomes_one_silu_op() -> None:
    model = make_model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])],
        {"x": [2, 5, 7]},
        ["y"],
    )
    assert op_names(convert(model)) == ["SILU"]
    assert_matches_ort(model, {"x": (RNG.normal(size=(2, 5, 7)) * 4).astype(np.float32)})
    # Far tails against float64 (onnxruntime's float32 Sigmoid flushes below about -16).
    x = np.linspace(-120, 120, 70).astype(np.float32).reshape(2, 5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = run_spore(model, {"x": x})
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, x64 / (1 + np.exp(-x64)), rtol=2e-7, atol=1e-36)


def test_sigmoid_with_another_reader_is_left_alone() -> None:
    model = _conv_silu(False, extra_reader=True)
    names = op_names(convert(model))
    assert "SILU" not in names and "SIGMOID" in names and "MUL" in names
    assert "silu" not in [n.attrs.get("activation") for n in convert(model).graphs[0].nodes]
    assert_matches_ort(model, _feeds())


def test_sigmoid_that_is_a_graph_output_is_left_alone() -> None:
    model = _conv_silu(True, gate_output=True)
    names = op_names(convert(model))
    assert "SILU" not in names and "SIGMOID" in names
    assert_matches_ort(model, _feeds())


def test_sigmoid_of_another_tensor_is_not_silu() -> None:
    model = make_model(
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["b", "s"], ["y"])],
        {"a": [4, 6], "b": [4, 6]},
        ["y"],
    )
    assert sorted(op_names(convert(model))) == ["MUL", "SIGMOID"]


def _swish_model(alpha: float | None):
    attrs = {} if alpha is None else {"alpha": alpha}
    w = (RNG.normal(size=(4, 3, 1, 1))).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Swish", ["c"], ["y"], **attrs),
    ]
    model = make_model(nodes, {"x": [1, 3, 8, 10]}, ["y"], initializers={"w": w}, opset=24)
    model.ir_version = 10  # opset 24 (where Swish appears) belongs to IR version 10
    return model


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5])
def test_onnx_swish(alpha: float | None) -> None:
    model = _swish_model(alpha)
    ir = convert(model)
    if alpha == 0.5:
        # x * sigmoid(0.5 x) is not SiLU: the Sigmoid fuses into the scaling Mul instead.
        assert "SILU" not in op_names(ir)
        assert [n.attrs.get("activation") for n in ir.graphs[0].nodes].count("sigmoid") == 1
    else:
        assert op_names(ir) == ["CONV2D"]
        assert ir.graphs[0].nodes[0].attrs["activation"] == "silu"
    try:
        run_ort(model, _feeds())
    except Exception as exc:  # an onnxruntime without opset 24 refuses to load the model
        pytest.skip(f"this onnxruntime ({ort.__version__}) does not run Swish: {exc}")
    assert_matches_ort(model, _feeds())


def test_the_pass_on_an_ir_graph_keeps_its_outputs() -> None:
    b = ModelBuilder()
    x = b.input("x", (3, 8))
    h = b.op(OpCode.ADD, [x, b.constant("k", RNG.normal(size=8).astype(np.float32))])
    y = b.op(OpCode.MUL, [b.op(OpCode.SIGMOID, [h]), h])
    b.output(y, "y")
    model = b.build()
    rewritten = copy.deepcopy(model)
    assert fuse_silu(rewritten) == 1
    assert [n.op for n in rewritten.graphs[0].nodes] == [OpCode.ADD, OpCode.SILU]
    feeds = {"x": (RNG.normal(size=(3, 8)) * 30).astype(np.float32)}
    want = Interpreter(model_content=serialize(model)).run(feeds)["y"]
    got = Interpreter(model_content=serialize(rewritten)).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30)
    assert fuse_silu(rewritten) == 0


def test_integer_sigmoid_mul_is_not_rewritten() -> None:
    """SILU is a float op: int8 LOGISTIC + MUL pairs of quantized models stay as they are."""
    b = ModelBuilder()
    x = b.input("x", (4,))
    s = b.op(OpCode.SIGMOID, [x])
    b.output(b.op(OpCode.MUL, [x, s]), "y")
    model = b.build()
    model.tensors[x].dtype = np.dtype(np.int8)
    assert fuse_silu(model) == 0


def test_tflite_logistic_times_x_becomes_a_fused_silu() -> None:
    """TFLite has no SiLU builtin: exporters write LOGISTIC + MUL, which the same pass fuses."""
    pytest.importorskip("ai_edge_litert.interpreter", reason="test extra")
    from sporenet.converter import convert_tflite
    from tests.unit.converter.tflite_builder import TfliteBuilder, conv, run_litert

    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    c = conv(b, x, 2, 3, (6, 6))
    s = b.tensor("s", [1, 6, 6, 3])
    b.op("LOGISTIC", [c], [s])
    y = b.output(b.tensor("y", [1, 6, 6, 3]))
    b.op("MUL", [c, s], [y], "MulOptions", FusedActivationFunction=0)
    data = b.build()
    feeds = {"x": RNG.normal(size=(1, 6, 6, 2)).astype(np.float32)}
    want = run_litert(data, feeds)["y"]
    from sporenet.lite import parse

    spore = convert_tflite(data)
    convs = [n for n in parse(spore).graphs[0].nodes if n.op == OpCode.CONV2D]
    assert [n.attrs.get("activation") for n in convs] == ["silu"]
    assert "SIGMOID" not in [n.op.name for n in parse(spore).graphs[0].nodes]
    got = Interpreter(model_content=spore).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_add_sigmoid_mul_fuses_into_the_add() -> None:
    """As in dynamically quantized ddddocr models: the SiLU follows an elementwise op."""
    bias = RNG.normal(size=(1, 4, 1, 1)).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Add", ["x", "bias"], ["h"]),
            helper.make_node("Sigmoid", ["h"], ["s"]),
            helper.make_node("Mul", ["h", "s"], ["y"]),
        ],
        {"x": [2, 4, 3, 5]},
        ["y"],
        initializers={"bias": bias},
    )
    nodes = convert(model).graphs[0].nodes
    assert [(n.op.name, n.attrs.get("activation")) for n in nodes] == [("ADD", "silu")]
    assert_matches_ort(model, {"x": (RNG.normal(size=(2, 4, 3, 5)) * 3).astype(np.float32)})
