"""Models from the converter and from cloud export train on the device as they are."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, parse
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model

onnx = pytest.importorskip("onnx")  # the onnx extra; the converter needs it


def gemm_hard_swish_onnx() -> bytes:
    """x (N, 4) -> Gemm(8) -> HardSwish -> Gemm(3): the converter fuses the HardSwish."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
        for n, s in (("w1", (8, 4)), ("b1", (8,)), ("w2", (3, 8)), ("b2", (3,)))
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("HardSwish", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def test_converted_model_with_fused_hard_swish_trains_without_no_optimize():
    from sporenet.converter import convert_onnx

    model = parse(convert_onnx(gemm_hard_swish_onnx()))
    fused = [n.attrs.get("activation") for n in model.graphs[0].nodes]
    assert "hard_swish" in fused  # what used to need --no-optimize
    output = next(iter(model.signature().outputs))
    train = make_training_model(
        model,
        output=output,
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=0.02),
    )
    trainer = Trainer(train)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    inputs = next(iter(model.signature().inputs))
    losses = [trainer.step({inputs: x, "labels": y}, 0.02) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]


def test_cloud_export_names_tensors_after_layers():
    from sporenet import cloud
    from sporenet.cloud import layers as L
    from sporenet.cloud.errors import ConfigError
    from sporenet.cloud.export import to_inference_ir
    from sporenet.cloud.module import Sequential

    names = {
        t.name
        for t in to_inference_ir(cloud.models.digits_cnn(), input_shape=(1, 8, 8)).tensors
        if t.data is not None
    }
    assert {"conv1.weight", "conv1.bias", "head.weight", "head.bias"} <= names
    plain = to_inference_ir(Sequential(L.Flatten(), L.Dense(64, 10)), input_shape=(1, 8, 8))
    assert {t.name for t in plain.tensors if t.data is not None} == {"dense1.weight", "dense1.bias"}
    model = Sequential(L.Flatten(), ("out", L.Dense(64, 10)))
    assert [n for n, _ in model.named_state()] == ["out.weight", "out.bias"]
    with pytest.raises(ConfigError, match="'1x'"):
        Sequential(("1x", L.Dense(2, 2)))
    train = make_training_model(
        to_inference_ir(cloud.models.digits_cnn(), input_shape=(1, 8, 8)),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig(),
        trainable={"head.weight", "head.bias"},
    )
    assert sum(n.op == OpCode.SGD_UPDATE for n in train.graphs[-1].nodes) == 2
