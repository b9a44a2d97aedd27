"""The stepwise int8 reference of benchmarks/_exact_int8.py on a small dynamically quantized
model: the converted model is within one quantization step at every step, and a step off
by more is reported, so the benchmark's "stepwise" match cannot pass a wrong engine."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")
ort = pytest.importorskip("onnxruntime", reason="test extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx  # noqa: E402
from sporenet.lite import Interpreter  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def exact_int8():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _exact_int8

        yield _exact_int8
    finally:
        sys.path.remove(str(BENCHMARKS))


def _two_layer_model(path: Path) -> None:
    """x -> DynamicQuantizeLinear -> MatMulInteger (int8 W1) -> scaled -> Tanh -> the same
    again with W2: two quantization steps, the second fed by the first's integers."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for k in (1, 2):
        w = rng.integers(-127, 128, (16, 16), dtype=np.int8)
        inits += [
            numpy_helper.from_array(w, f"w{k}"),
            numpy_helper.from_array(np.array(0, np.int8), f"w{k}_zp"),
            numpy_helper.from_array(np.array(0.02, np.float32), f"w{k}_s"),
        ]
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [x], [f"q{k}", f"s{k}", f"z{k}"]),
            helper.make_node("MatMulInteger", [f"q{k}", f"w{k}", f"z{k}", f"w{k}_zp"], [f"i{k}"]),
            helper.make_node("Cast", [f"i{k}"], [f"f{k}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"s{k}", f"w{k}_s"], [f"m{k}"]),
            helper.make_node("Mul", [f"f{k}", f"m{k}"], [f"p{k}"]),
            helper.make_node("Tanh", [f"p{k}"], [f"y{k}"]),
        ]
        x = f"y{k}"
    graph = helper.make_graph(
        nodes,
        "dynamic_int8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _stepwise(exact_int8, path: Path, ours: dict, feeds: dict) -> tuple[float, float, dict]:  # type: ignore[no-untyped-def]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        exact_int8.stepwise_graph(str(path)), options, providers=["CPUExecutionProvider"]
    )
    given = {i.name for i in session.get_inputs()}
    fed = {k: np.asarray(v) for k, v in {**feeds, **ours}.items() if k in given}
    names = [o.name for o in session.get_outputs()]
    reference = {**feeds, **dict(zip(names, session.run(None, fed), strict=True))}
    worst_q, worst_lstm = exact_int8.compare_steps(str(path), ours, reference)
    return worst_q, worst_lstm, reference


def test_the_converted_model_is_within_one_step_and_a_wrong_step_is_caught(exact_int8) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        _two_layer_model(path)
        names = exact_int8.probed_names(str(path))
        assert names == ["q1", "s1", "z1", "q2", "s2", "z2"]
        run = Interpreter(model_content=convert_onnx(exact_int8.probe_graph(str(path)))).run
        feeds = {"x": np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)}
        got = run(feeds)
        ours = {n: got[n] for n in names}
        worst_q, worst_lstm, reference = _stepwise(exact_int8, path, ours, feeds)
        assert worst_q <= 1.0 and worst_lstm == 0.0
        np.testing.assert_allclose(got["y2"], reference["y2"], atol=1e-6)
        # An engine whose second step rounds one value two steps away is reported.
        wrong = dict(ours)
        q2 = np.array(ours["q2"], np.uint8)
        q2.flat[0] = q2.flat[0] + 2 if q2.flat[0] < 250 else q2.flat[0] - 2
        wrong["q2"] = q2
        assert _stepwise(exact_int8, path, wrong, feeds)[0] >= 2.0 - 1e-6
