"""Small ONNX models for the quantization tests (a CNN with Conv+BN+Relu, strided
Conv+Relu, MaxPool and Gemm; Conv -> activation -> Conv) and calibration
data, built with onnx.helper so the tests need no exporter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def cnn(seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.normal(0, 0.4, (8, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, 8),
        "g": rng.uniform(0.5, 1.5, 8),
        "beta": rng.normal(0, 0.1, 8),
        "mean": rng.normal(0, 0.1, 8),
        "var": rng.uniform(0.5, 2, 8),
        "w2": rng.normal(0, 0.2, (16, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, 16),
        "w3": rng.normal(0, 0.2, (10, 64)),
        "b3": rng.normal(0, 0.1, 10),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def calibration(n: int = 64, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)}


def mixed(seed: int = 0) -> Any:
    """Conv, a residual Add, Sigmoid, Concat, GlobalAveragePool, MatMul + Add, Softmax:
    the ops onnxruntime's quantizer turns into QLinearAdd/Concat/Sigmoid/... or QDQ."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.normal(0, 0.3, (8, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, 8),
        "w2": rng.normal(0, 0.2, (8, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, 8),
        "w3": rng.normal(0, 0.2, (8, 8, 1, 1)),
        "b3": rng.normal(0, 0.1, 8),
        "wm": rng.normal(0, 0.3, (16, 10)),
        "bm": rng.normal(0, 0.1, 10),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("Sigmoid", ["res"], ["s"]),
        helper.make_node("Conv", ["r1", "w3", "b3"], ["c3"]),
        helper.make_node("Concat", ["s", "c3"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "wm"], ["mm"]),
        helper.make_node("Add", ["mm", "bm"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def conv_act_conv(activation: str) -> Any:
    """x -> Conv -> activation (SiLU written as c * Sigmoid(c)) -> Conv -> y."""
    rng = np.random.default_rng(6)
    inits = {"w1": rng.normal(0, 0.5, (6, 1, 3, 3)), "w2": rng.normal(0, 0.3, (4, 6, 3, 3))}
    if activation == "silu":
        act = [
            helper.make_node("Sigmoid", ["c1"], ["s"]),
            helper.make_node("Mul", ["c1", "s"], ["a"]),
        ]
    else:
        act = [helper.make_node(activation, ["c1"], ["a"])]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
            *act,
            helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    proto.ir_version = 8
    return proto
