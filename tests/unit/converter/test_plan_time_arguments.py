"""Op arguments fed as graph inputs that the runtime reads when it plans the graph:
CumSum's axis, OneHot's depth and values, Trilu's k (compared at run time), Resize's
sizes, scales and roi with `axes` and keep_aspect_ratio_policy, Upsample's scales. Each
model runs at two values of the argument against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from tests.unit.converter.helpers import TensorProto, helper, run_ort

RNG = np.random.default_rng(5)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _model(node, inputs: dict, rank: int, opset: int = 19, out_type: int = F32) -> object:
    graph = helper.make_graph(
        [node],
        "plan-time",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, [f"d{k}" for k in range(rank)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


X = rand(1, 1, 4, 6)
CASES = {
    "cumsum-axis": (
        helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1),
        {"x": (F32, [3, 4]), "axis": (I64, [])},
        2,
        [{"x": rand(3, 4), "axis": np.int64(0)}, {"x": rand(3, 4), "axis": np.int64(-1)}],
    ),
    "onehot-depth": (
        helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=0),
        {"i": (I64, [4]), "depth": (I64, []), "values": (F32, [2])},
        2,
        [
            {"i": i64(0, 2, -1, 5), "depth": np.int64(3), "values": np.float32([-1, 2])},
            {"i": i64(1, 0, 3, 3), "depth": np.int64(5), "values": np.float32([0, 7])},
        ],
    ),
    "trilu-k-upper": (
        helper.make_node("Trilu", ["x", "k"], ["y"], upper=1),
        {"x": (F32, [4, 5]), "k": (I64, [])},
        2,
        [{"x": rand(4, 5), "k": np.int64(-1)}, {"x": rand(4, 5), "k": np.int64(2)}],
    ),
    "trilu-k-lower": (
        helper.make_node("Trilu", ["x", "k"], ["y"], upper=0),
        {"x": (F32, [4, 5]), "k": (I64, [])},
        2,
        [{"x": rand(4, 5), "k": np.int64(0)}, {"x": rand(4, 5), "k": np.int64(-3)}],
    ),
    "resize-sizes-axes": (
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[3, 2]),
        {"x": (F32, [1, 1, 4, 6]), "sizes": (I64, [2])},
        4,
        [{"x": X, "sizes": i64(9, 3)}, {"x": X, "sizes": i64(2, 8)}],
    ),
    "resize-sizes-not-larger": (
        helper.make_node(
            "Resize",
            ["x", "", "", "sizes"],
            ["y"],
            axes=[2, 3],
            keep_aspect_ratio_policy="not_larger",
        ),
        {"x": (F32, [1, 1, 4, 6]), "sizes": (I64, [2])},
        4,
        [{"x": X, "sizes": i64(8, 9)}, {"x": X, "sizes": i64(2, 12)}],
    ),
    "resize-scales-axes": (
        helper.make_node("Resize", ["x", "", "scales"], ["y"], axes=[2], mode="linear"),
        {"x": (F32, [1, 1, 4, 6]), "scales": (F32, [1])},
        4,
        [{"x": X, "scales": np.float32([2.0])}, {"x": X, "scales": np.float32([0.5])}],
    ),
    "resize-crop-roi": (
        helper.make_node(
            "Resize",
            ["x", "roi", "", "sizes"],
            ["y"],
            axes=[2, 3],
            mode="linear",
            coordinate_transformation_mode="tf_crop_and_resize",
            extrapolation_value=9.0,
        ),
        {"x": (F32, [1, 1, 4, 6]), "roi": (F32, [4]), "sizes": (I64, [2])},
        4,
        [
            {"x": X, "roi": np.float32([0.1, 0.2, 0.9, 0.7]), "sizes": i64(3, 3)},
            {"x": X, "roi": np.float32([-0.2, 0, 1.2, 1]), "sizes": i64(5, 2)},
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_argument_is_read_when_planned(case: str) -> None:
    node, inputs, rank, runs = CASES[case]
    model = _model(node, inputs, rank)
    interpreter = Interpreter(model_content=convert_onnx(model))
    for feeds in runs:
        (want,) = run_ort(model, {k: np.asarray(v) for k, v in feeds.items()})
        got = interpreter.run(feeds)["y"]
        assert got.shape == want.shape, (feeds, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_upsample_scales_fed_at_run_time() -> None:
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    model = _model(node, {"x": (F32, [1, 1, 2, 3]), "scales": (F32, [4])}, 4, opset=9)
    interpreter = Interpreter(model_content=convert_onnx(model))
    x = rand(1, 1, 2, 3)
    for scales in ([1, 1, 2, 3], [1, 1, 3, 1]):
        got = interpreter.run({"x": x, "scales": np.float32(scales)})["y"]
        want = x.repeat(scales[2], axis=2).repeat(scales[3], axis=3)
        np.testing.assert_array_equal(got, want)
