"""A recurrent model imported from ONNX fine-tunes with the lite Trainer (its LSTM/GRU
weights are found and updated through the recurrent gradient rules)."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, parse
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model

onnx = pytest.importorskip("onnx", reason="the ONNX import needs the onnx extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx  # noqa: E402

SEQ, IN, HID, CLASSES = 6, 3, 8, 2


def sequence_classifier(kind: str) -> bytes:
    """X (seq, batch, 3) -> bidirectional recurrent layer -> final states -> Gemm logits."""
    rng = np.random.default_rng(0)
    gates = {"LSTM": 4, "GRU": 3}[kind]
    inits = {
        "W": rng.normal(size=(2, gates * HID, IN)) * 0.3,
        "R": rng.normal(size=(2, gates * HID, HID)) * 0.3,
        "B": np.zeros((2, 2 * gates * HID)),
        "fc_w": rng.normal(size=(2 * HID, CLASSES)) * 0.3,
        "fc_b": np.zeros(CLASSES),
        "shape": np.array([-1, 2 * HID]),
    }
    outputs = ["y", "y_h"] + (["y_c"] if kind == "LSTM" else [])
    nodes = [
        helper.make_node(
            kind, ["x", "W", "R", "B"], outputs, hidden_size=HID, direction="bidirectional"
        ),
        helper.make_node("Transpose", ["y_h"], ["states"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["states", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, "batch", IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[
            numpy_helper.from_array(v.astype(np.int64 if k == "shape" else np.float32), k)
            for k, v in inits.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return convert_onnx(model)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_classifier_fine_tunes(kind):
    # Label: whether the first feature rises over the sequence (needs the recurrence).
    rng = np.random.default_rng(1)
    x = rng.normal(size=(SEQ, 64, IN)).astype(np.float32)
    trend = np.linspace(-1, 1, SEQ, dtype=np.float32)[:, None]
    labels = rng.integers(0, 2, 64)
    x[:, :, 0] += np.where(labels == 1, trend, -trend) * 1.5
    model = make_training_model(
        parse(sequence_classifier(kind)),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=0.05),
    )
    ops = {n.op for n in model.graphs[model.signature("train").graph].nodes}
    if kind == "LSTM":  # the backward pass reads the steps the forward saved
        assert {OpCode.LSTM_TRAINING, OpCode.LSTM_GRAD} <= ops and OpCode.LSTM not in ops
    trainer = Trainer(model, num_threads=1)
    losses = [trainer.step({"x": x, "labels": labels}, 0.05) for _ in range(40)]
    assert np.mean(losses[-3:]) < 0.3 * np.mean(losses[:3])
    accuracy = (trainer.evaluate({"x": x})["logits"].argmax(1) == labels).mean()
    assert accuracy > 0.95
    trained = set(trainer.weights())
    assert {"W", "R", "B"} <= trained, trained  # the recurrent layer's own weights
