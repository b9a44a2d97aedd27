"""Dynamically quantized ONNX models (onnxruntime's quantize_dynamic, and the int8 OCR
model the ddddocr package ships) imported and run against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime", reason="test extra")
quantization = pytest.importorskip("onnxruntime.quantization", reason="test extra")
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx_model  # noqa: E402
from sporenet.lite import Interpreter  # noqa: E402
from sporenet.lite.format import serialize  # noqa: E402
from sporenet.lite.ops import OpCode  # noqa: E402
from tests.packaged import packaged_file  # noqa: E402
from tests.references import (  # noqa: E402
    EXACT_INT8_WEIGHT,
    ort_reference_session,
    run_ort_reference,
)


def run_sporenet(
    path: Path, feeds: dict[str, np.ndarray], input_shapes: dict | None = None
) -> dict[str, np.ndarray]:
    model, _ = convert_onnx_model(path, input_shapes=input_shapes)
    return Interpreter(model_content=serialize(model)).run(feeds)


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs with graph optimizations off. Its u8s8 kernels (int8 weights,
    uint8 activations) are exact on every CPU only for 7-bit weights (tests/references.py):
    the tests quantize int8 weights with reduce_range."""
    return run_ort_reference(path, feeds)


def _save(nodes: list, inputs: dict, output: str, inits: dict, path: Path) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_conv_integer_is_exact_where_fast_convolutions_are_not(tmp_path: Path) -> None:
    """A 3x3 conv wide enough for Winograd: the int32 results must still be exact."""
    rng = np.random.default_rng(0)
    src = _save(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
        ],
        {"x": [1, 48, 16, 16]},
        "y",
        {"w": rng.normal(0, 0.1, (64, 48, 3, 3)), "w2": rng.normal(0, 0.1, (32, 64, 3, 3))},
        tmp_path / "conv.onnx",
    )
    out = tmp_path / "conv.dyn.onnx"
    for weight_type in (quantization.QuantType.QInt8, quantization.QuantType.QUInt8):
        quantization.quantize_dynamic(
            str(src),
            str(out),
            weight_type=weight_type,
            reduce_range=weight_type == quantization.QuantType.QInt8,
        )
        x = rng.normal(size=(1, 48, 16, 16)).astype(np.float32)
        got = run_sporenet(out, {"x": x})["y"]
        (want,) = run_ort(out, {"x": x})
        # Exact integer products; only float rounding of the rescaling may differ.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        # The convolutions read DynamicQuantizeLinear's integers as floats, minus the zero
        # point, with no round trip through uint8.
        model, _ = convert_onnx_model(out)
        casts = [n for n in model.graphs[0].nodes if n.op == OpCode.CAST]
        assert not [n for n in casts if model.tensors[n.inputs[0]].dtype == np.uint8]
        assert not [n for n in casts if n.attrs.get("to") == "uint8"]


def test_conv_integer_int32_round_trips_fold_and_match_onnxruntime(tmp_path: Path) -> None:
    """quantize_dynamic's ConvInteger -> Cast(float) (bias added in float afterwards): the
    importer's int32 cast and the float cast fold away (integer-add-folding)."""
    rng = np.random.default_rng(3)
    src = _save(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1]),
        ],
        {"x": [1, 48, 16, 16]},
        "y",
        {
            "w": rng.normal(0, 0.1, (64, 48, 3, 3)),
            "b": rng.normal(0, 2.0, 64),
            "w2": rng.normal(0, 0.1, (32, 64, 3, 3)),
            "b2": rng.normal(0, 2.0, 32),
        },
        tmp_path / "conv_bias.onnx",
    )
    out = tmp_path / "conv_bias.dyn.onnx"
    quantization.quantize_dynamic(str(src), str(out), weight_type=quantization.QuantType.QUInt8)
    model, report = convert_onnx_model(out)
    assert report.passes["integer-add-folding"] == 2
    tensors = [model.tensors[n.outputs[0]] for n in model.graphs[0].nodes]
    assert not [t for t in tensors if t.dtype == np.int32]
    interpreter = Interpreter(model_content=serialize(model))
    x = rng.normal(size=(1, 48, 16, 16)).astype(np.float32)
    got = interpreter.run({"x": x})["y"]
    (want,) = run_ort(out, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _dynamic_quantize_linear_model(path: Path) -> Path:
    """DynamicQuantizeLinear alone, its three outputs (uint8 y, scale, zero point) out."""
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 3, 5]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("zp", TensorProto.UINT8, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_dynamic_quantize_linear_is_one_node_and_matches_onnxruntime(tmp_path: Path) -> None:
    """DYNAMIC_QUANTIZE gives onnxruntime's uint8 values, scale and zero point exactly:
    mixed signs, one sign only, all zeros (scale 1), values on rounding ties and one
    rounding past 255 (saturated)."""
    path = _dynamic_quantize_linear_model(tmp_path / "dql.onnx")
    model, _ = convert_onnx_model(path)
    ops = [n.op for n in model.graphs[0].nodes]
    assert ops.count(OpCode.DYNAMIC_QUANTIZE) == 1
    assert OpCode.REDUCE_MIN not in ops and OpCode.DIV not in ops
    interpreter = Interpreter(model_content=serialize(model))
    rng = np.random.default_rng(5)
    ties = np.linspace(-1.0, 1.55, 30)  # scale 0.01: x / scale lands on halves
    ties[::2] += 0.005
    cases = [
        rng.normal(0, 3, 30),
        rng.uniform(0.5, 4, 30),
        -rng.uniform(0.5, 4, 30),
        np.zeros(30),
        ties,
        # scale 1, zero point round(1.5) = 2 and round(253.5) = 254: 256 saturates to 255.
        np.linspace(-1.5, 253.5, 30),
    ]
    # Many ranges: the rare rounding cases (a value rounding past 255 - zp) show up.
    for _ in range(200):
        lo, hi = sorted(rng.normal(0, 10.0 ** rng.integers(-3, 3), 2))
        cases.append(rng.uniform(lo, hi, 30))
    session = ort_reference_session(path)
    for x in cases:
        feed = {"x": x.astype(np.float32).reshape(2, 3, 5)}
        got = interpreter.run(feed)
        want = dict(zip(("y", "scale", "zp"), session.run(None, feed), strict=True))
        for name in ("y", "scale", "zp"):
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_dynamic_quantize_feeds_integer_ops_without_emulation_nodes(tmp_path: Path) -> None:
    """quantize_dynamic's MatMul and Conv: each activation quantized by one
    DYNAMIC_QUANTIZE node read straight by the product, results as onnxruntime's."""
    rng = np.random.default_rng(11)
    src = _save(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Reshape", ["r", "shape"], ["f"]),
            helper.make_node("MatMul", ["f", "m"], ["y"]),
        ],
        {"x": [1, 8, 8, 8]},
        "y",
        {
            "w": rng.normal(0, 0.2, (16, 8, 3, 3)),
            "b": rng.normal(0, 1.0, 16),
            "shape": np.array([16, 64]),
            "m": rng.normal(0, 0.1, (64, 40)),
        },
        tmp_path / "conv_matmul.onnx",
    )
    # Reshape's target must stay int64.
    proto = onnx.load(str(src))
    for init in proto.graph.initializer:
        if init.name == "shape":
            init.CopyFrom(numpy_helper.from_array(np.array([16, 64], np.int64), "shape"))
    onnx.save(proto, str(src))
    out = tmp_path / "conv_matmul.dyn.onnx"
    quantization.quantize_dynamic(str(src), str(out), weight_type=quantization.QuantType.QUInt8)
    model, _ = convert_onnx_model(out)
    ops = [n.op for n in model.graphs[0].nodes]
    assert ops.count(OpCode.DYNAMIC_QUANTIZE) == 2
    emulation = {OpCode.REDUCE_MIN, OpCode.REDUCE_MAX, OpCode.MINIMUM, OpCode.MAXIMUM}
    assert not emulation & set(ops)
    interpreter = Interpreter(model_content=serialize(model))
    for seed in range(3):
        x = np.random.default_rng(seed).normal(size=(1, 8, 8, 8)).astype(np.float32)
        got = interpreter.run({"x": x})["y"]
        (want,) = run_ort(out, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _int32_bias_conv(path: Path, rng: np.random.Generator) -> Path:
    """The older quantize_dynamic form ddddocr's int8 model has: the bias quantized at run
    time to int32 (Floor(b / (x_scale * w_scale))) and added to ConvInteger's int32
    output before the float cast."""
    w = rng.integers(0, 256, (16, 8, 3, 3)).astype(np.uint8)
    inits = {
        "w_q": w,
        "w_zp": np.array(131, np.uint8),
        "w_s": np.array(0.02, np.float32),
        "b": rng.normal(0, 40.0, 16).astype(np.float32),
        "shape": np.array([1, -1, 1, 1], np.int64),
    }
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        helper.make_node("Mul", ["xs", "w_s"], ["s"]),
        helper.make_node("Div", ["b", "s"], ["bt"]),
        helper.make_node("Floor", ["bt"], ["bf"]),
        helper.make_node("Cast", ["bf"], ["bq"], to=TensorProto.INT32),
        helper.make_node("ConvInteger", ["xq", "w_q", "xzp", "w_zp"], ["yq"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["bq", "shape"], ["bqr"]),
        helper.make_node("Add", ["yq", "bqr"], ["ya"]),
        helper.make_node("Cast", ["ya"], ["yf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["yf", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_conv_integer_int32_bias_added_in_float_matches_onnxruntime(tmp_path: Path) -> None:
    """ConvInteger -> Add(int32 bias) -> Cast(float): the integer Add and both casts become
    one float Add of the bias (integer-add-folding), with onnxruntime's results."""
    rng = np.random.default_rng(5)
    path = _int32_bias_conv(tmp_path / "int32_bias.onnx", rng)
    model, report = convert_onnx_model(path)
    assert report.passes["integer-add-folding"] == 1
    tensors = [model.tensors[n.outputs[0]] for n in model.graphs[0].nodes]
    assert not [t for t in tensors if t.dtype == np.int32 and t.shape != (16,)]
    interpreter = Interpreter(model_content=serialize(model))
    for scale in (1.0, 20.0):
        x = (rng.normal(size=(1, 8, 12, 12)) * scale).astype(np.float32)
        got = interpreter.run({"x": x})["y"]
        (want,) = run_ort(path, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_dynamic_quantize_lstm_matches_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    hidden, inp = 16, 12
    src = _save(
        [
            helper.make_node(
                "LSTM",
                ["x", "W", "R", "B"],
                ["y", "h", "c"],
                hidden_size=hidden,
                direction="bidirectional",
            )
        ],
        {"x": [5, 2, inp]},
        "y",
        {
            "W": rng.normal(0, 0.3, (2, 4 * hidden, inp)),
            "R": rng.normal(0, 0.3, (2, 4 * hidden, hidden)),
            "B": rng.normal(0, 0.1, (2, 8 * hidden)),
        },
        tmp_path / "lstm.onnx",
    )
    out = tmp_path / "lstm.dyn.onnx"
    quantization.quantize_dynamic(
        str(src),
        str(out),
        op_types_to_quantize=["LSTM"],
        weight_type=quantization.QuantType.QInt8,
        reduce_range=True,
    )
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(str(out)).graph.node}
    x = rng.normal(size=(5, 2, inp)).astype(np.float32)
    got = run_sporenet(out, {"x": x})["y"]
    (want,) = run_ort(out, {"x": x})[:1]
    # The same uint8 rounding of X and of each state before the products: the outputs
    # (|y| < 1) agree to float rounding.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _ddddocr_model() -> Path | None:
    return packaged_file("ddddocr", "common_old.onnx")


@pytest.mark.slow
@pytest.mark.skipif(
    _ddddocr_model() is None,
    reason="the ddddocr package (76 MB, not in the test extra) is not installed",
)
def test_ddddocr_int8_ocr_model_matches_onnxruntime() -> None:
    """ddddocr's common_old.onnx: ConvInteger, DynamicQuantizeLinear, DynamicQuantizeLSTM."""
    path = _ddddocr_model()
    assert path is not None
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM"} <= ops
    name = onnx.load(str(path)).graph.input[0].name
    model, _ = convert_onnx_model(path)  # no --input-shape: the image width stays dynamic
    assert sum(n.op == OpCode.LSTM for n in model.graphs[0].nodes) == 1
    interpreter = Interpreter(model_content=serialize(model))
    for width in (200, 120):
        x = np.random.default_rng(width).uniform(0, 1, (1, 1, 64, width)).astype(np.float32)
        got = next(iter(interpreter.run({name: x}).values()))
        (want,) = run_ort(path, {name: x})
        assert got.shape == want.shape
        assert np.array_equal(got.argmax(-1), want.argmax(-1))  # the same characters
        assert np.abs(got - want).max() < 0.01 * np.abs(want).max()


def _dq_lstm_model(
    path: Path, dirs: int, wtype: type, per_column: bool, seed: int, clip: float | None = None
) -> tuple[Path, Path]:
    """A com.microsoft DynamicQuantizeLSTM (sequence length dynamic) and the float ONNX LSTM
    with its weights dequantized (which differs from the first by the activations' uint8
    rounding)."""
    rng = np.random.default_rng(seed)
    hidden, inp = 8, 6
    cols = 4 * hidden
    # int8 weights of 7 bits: onnxruntime's u8s8 products are exact on every CPU then.
    lo, hi = (-EXACT_INT8_WEIGHT, EXACT_INT8_WEIGHT) if wtype is np.int8 else (0, 255)
    w = rng.integers(lo, hi + 1, (dirs, inp, cols)).astype(wtype)
    r = rng.integers(lo, hi + 1, (dirs, hidden, cols)).astype(wtype)
    params = (dirs, cols) if per_column else (dirs,)
    # onnxruntime takes int8 weights with zero points 0 only, uint8 ones with one zero
    # point per weight tensor.
    centre = 0 if wtype is np.int8 else 128
    w_zp = np.full(params, centre + (wtype is np.uint8) * 3).astype(wtype)
    r_zp = np.full(params, centre - (wtype is np.uint8) * 2).astype(wtype)
    w_scale = rng.uniform(0.002, 0.006, params).astype(np.float32)
    r_scale = rng.uniform(0.002, 0.006, params).astype(np.float32)
    b = rng.normal(0, 0.2, (dirs, 8 * hidden)).astype(np.float32)
    h0 = rng.normal(0, 0.5, (dirs, 2, hidden)).astype(np.float32)
    direction = "bidirectional" if dirs == 2 else "forward"

    def real(q: np.ndarray, zp: np.ndarray, scale: np.ndarray) -> np.ndarray:
        shape = (dirs, 1, cols) if per_column else (dirs, 1, 1)
        value = (q.astype(np.float64) - zp.reshape(shape)) * scale.reshape(shape)
        return value.astype(np.float32).transpose(0, 2, 1)

    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 2, inp])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", dirs, 2, hidden])
    inits = {"B": b, "h0": h0}
    quant = {"W": w, "R": r, "W_s": w_scale, "W_zp": w_zp, "R_s": r_scale, "R_zp": r_zp}
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "W", "R", "B", "", "h0", "", "", "W_s", "W_zp", "R_s", "R_zp"],
        ["y"],
        domain="com.microsoft",
        hidden_size=hidden,
        direction=direction,
        **({} if clip is None else {"clip": clip}),
    )
    graph = helper.make_graph(
        [node],
        "g",
        [x_info],
        [y_info],
        initializer=[numpy_helper.from_array(v, k) for k, v in {**inits, **quant}.items()],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    quantized = path / f"dq{dirs}{wtype.__name__}{per_column}.onnx"
    onnx.save(model, str(quantized))
    floats = {"W": real(w, w_zp, w_scale), "R": real(r, r_zp, r_scale), **inits}
    lstm = helper.make_node(
        "LSTM", ["x", "W", "R", "B", "", "h0"], ["y"], hidden_size=hidden, direction=direction
    )
    graph = helper.make_graph(
        [lstm],
        "g",
        [x_info],
        [y_info],
        initializer=[numpy_helper.from_array(v, k) for k, v in floats.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    reference = path / f"float{dirs}{wtype.__name__}{per_column}.onnx"
    onnx.save(model, str(reference))
    return quantized, reference


@pytest.mark.parametrize(
    ("dirs", "wtype", "per_column"),
    [(2, np.int8, False), (1, np.uint8, False), (1, np.int8, True), (2, np.uint8, True)],
)
def test_dynamic_quantize_lstm_node_runs_as_one_lstm_kernel(
    tmp_path: Path, dirs: int, wtype: type, per_column: bool
) -> None:
    """Forward and bidirectional, int8 and uint8, scales per direction or per column: one
    LSTM node at any sequence length, equal to onnxruntime's DynamicQuantizeLSTM (X and
    each state rounded to uint8 before the products), not to the float LSTM on the
    dequantized weights."""
    quantized, reference = _dq_lstm_model(tmp_path, dirs, wtype, per_column, seed=dirs)
    model, _ = convert_onnx_model(quantized)
    assert [n.op for n in model.graphs[0].nodes] == [OpCode.LSTM]
    weights = [model.tensors[i] for i in model.graphs[0].nodes[0].inputs[1:3]]
    if dirs == 1 or not per_column:  # expressible along one axis: int8 in the file
        assert all(t.dtype == np.int8 and t.quantization is not None for t in weights)
    else:
        assert all(t.dtype == np.float32 for t in weights)
    interpreter = Interpreter(model_content=serialize(model))
    rng = np.random.default_rng(7)
    for seq in (3, 9):  # one conversion, two sequence lengths
        x = rng.normal(0, 1, (seq, 2, 6)).astype(np.float32)
        got = interpreter.run({"x": x})["y"]
        (ort_int8,) = run_ort(quantized, {"x": x})
        assert got.shape == ort_int8.shape == (seq, dirs, 2, 8)
        np.testing.assert_allclose(got, ort_int8, rtol=0, atol=1e-6)
        (unrounded,) = run_ort(reference, {"x": x})
        assert np.abs(unrounded - ort_int8).max() > 1e-4  # the rounding is visible


def test_dynamic_quantize_lstm_rounds_activations_on_the_general_path(tmp_path: Path) -> None:
    """A clip keeps the node off the packed fast path: the general loop rounds X and the
    states to uint8 the same way."""
    quantized, _ = _dq_lstm_model(tmp_path, 2, np.int8, False, seed=3, clip=0.75)
    model, _ = convert_onnx_model(quantized)
    interpreter = Interpreter(model_content=serialize(model))
    x = np.random.default_rng(8).normal(0, 1, (6, 2, 6)).astype(np.float32)
    got = interpreter.run({"x": x})["y"]
    (want,) = run_ort(quantized, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
