"""The app with every kind of model a user brings: the cloud export (dynamic batch), an
ONNX MLP converted with a fixed input [1, 64], the int8 model the converter writes, and a
model with no layer to train.

Each is driven over real HTTP with good, bad and odd requests on every route; no answer
is ever a 500. The fixed-batch model personalizes (batches of its size), the int8 model
personalizes a float copy of its head, and the model without a head predicts and refuses
personalization with a 409 that says why.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from sporenet import lite
from sporenet.android_demo.app import App
from tests.integration.android_demo.conftest import RunningApp

onnx = pytest.importorskip("onnx", reason="onnx is in the test extra")


def fixed_batch_onnx_mlp(path: Path, rng: np.random.Generator) -> Path:
    """An ONNX MLP (Gemm, Relu, Gemm) with a fixed input [1, 64], as torch.onnx.export
    writes for a model traced on one sample."""
    from onnx import TensorProto, helper, numpy_helper

    w1 = rng.normal(0, 0.1, (32, 64)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (10, 32)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.zeros(10, np.float32), "b2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from sporenet.converter import convert_onnx

    path.write_bytes(convert_onnx(model))
    return path


@pytest.fixture(scope="module")
def model_kinds(digits_model: Path, digits, tmp_path_factory) -> dict[str, Path]:
    from sporenet.converter.quantize import quantize_model

    root = tmp_path_factory.mktemp("kinds")
    int8 = quantize_model(
        digits_model.read_bytes(), mode="int8", calibration={"input": digits.x_train[:64]}
    )
    (root / "int8.spore").write_bytes(int8.data)
    b = lite.ModelBuilder()
    x = b.input("input", (-1, 64))
    b.output(b.op(lite.OpCode.RELU, [x]), name="logits")
    lite.save(b.build(), root / "no_head.spore")
    return {
        "float": digits_model,
        "fixed_batch": fixed_batch_onnx_mlp(root / "mlp.spore", np.random.default_rng(0)),
        "int8": root / "int8.spore",
        "no_head": root / "no_head.spore",
    }


def raw_request(url: str, data: bytes) -> int:
    """Send bytes as they are (a lying Content-Length, a truncated body) and return the
    HTTP status the app answers."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        reply = s.recv(4096).decode("latin-1")
    return int(reply.split()[1])


BAD_BODIES: list[object] = [
    None,
    [],
    "pixels",
    {},
    {"pixels": None},
    {"pixels": "0" * 64},
    {"pixels": [0] * 63},
    {"pixels": [0] * 65},
    {"pixels": [17] * 64},
    {"pixels": [-1] * 64},
    {"pixels": [True] * 64},
    {"pixels": [[0] * 8] * 8},
    {"pixels": [0] * 64, "label": -1},
    {"pixels": [0] * 64, "label": 10},
    {"pixels": [0] * 64, "label": 1.5},
    {"pixels": [0] * 64, "label": "3"},
    {"epochs": 0},
    {"epochs": 10**9},
    {"epochs": "5"},
    {"epochs": None},
]


@pytest.mark.parametrize("kind", ["float", "fixed_batch", "int8", "no_head"])
def test_every_route_answers_every_request_without_a_500(kind, model_kinds, digits, tmp_path):
    running = RunningApp(App(model_kinds[kind], tmp_path / "data"))
    statuses: list[tuple[str, object, int]] = []
    try:
        routes = [("POST", "/api/predict"), ("POST", "/api/samples"), ("POST", "/api/personalize")]
        for method, path in routes:
            for body in BAD_BODIES:
                code, answer = running.call(method, path, body)
                statuses.append((path, body, code))
                assert "error" in answer or code == 200
            for raw in (b"", b"{", b"\xff\xfe", b"[1, 2]", b"null", b'{"pixels": NaN}'):
                code, answer = running.call(method, path, raw=raw)
                statuses.append((path, raw, code))
        for method, path in [
            ("GET", "/api/nothing"),
            ("PUT", "/api/predict"),
            ("DELETE", "/api/samples"),
            ("GET", "/api/predict"),
        ]:
            statuses.append((path, method, running.call(method, path)[0]))
        lying = b"POST /api/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n{}"
        statuses.append(("/api/predict", "huge length", raw_request(running.url, lying)))
        # Personalizing with too few samples is a 400; predictions work on every kind.
        statuses.append(
            (
                "/api/personalize",
                "empty store",
                running.call("POST", "/api/personalize", {"epochs": 2})[0],
            )
        )
        x = digits.x_test[:12].reshape(12, 64)
        for k in range(12):
            code, answer = running.call("POST", "/api/predict", {"pixels": x[k].tolist()})
            assert code == 200, answer
            assert len(answer["probabilities"]) == (64 if kind == "no_head" else 10)
            assert abs(sum(answer["probabilities"]) - 1) < 1e-6
            code, _ = running.call(
                "POST", "/api/samples", {"pixels": x[k].tolist(), "label": int(digits.y_test[k])}
            )
            assert code == 200
        code, answer = running.call("POST", "/api/personalize", {"epochs": 3})
        status_code, status = running.call("GET", "/api/status")
        assert status_code == 200
        json.dumps(status, allow_nan=False)
    finally:
        running.close()
    assert not [s for s in statuses if s[2] >= 500], [s for s in statuses if s[2] >= 500]
    # Only a prediction with 64 good pixels is accepted (an extra `label` is ignored).
    accepted = [
        s
        for s in statuses
        if s[2] == 200
        and not (s[0] == "/api/predict" and s[1]["pixels"] == [0] * 64)
        and not (kind == "no_head" and s[0] == "/api/samples" and s[1]["label"] == 10)
    ]
    assert not accepted, accepted
    if kind == "no_head":
        assert code == 409 and "no layer with float weights" in answer["error"]
        assert status["model"]["personalizable"] is False
        assert "there is no head to personalize" in status["model"]["why_not"]
    else:
        assert code == 200, answer
        assert answer["held_out"] == 2 and answer["samples"] == 10
        assert status["model"]["personalizable"] is True
        assert status["model"]["personalized"] is True
        assert status["model"]["float_head_copy"] is (kind == "int8")


def test_a_fixed_batch_model_predicts_as_the_runtime_and_trains_its_head(
    model_kinds, digits, tmp_path
):
    path = model_kinds["fixed_batch"]
    app = App(path, tmp_path / "data")
    try:
        assert app.model.fixed_batch == 1
        x = digits.x_test[:7].reshape(7, 64)
        interpreter = lite.Interpreter(model_path=str(path))
        expected = np.concatenate([interpreter.run({"input": row[None]})["logits"] for row in x])
        np.testing.assert_allclose(app.model.logits(x), expected, rtol=1e-6, atol=1e-6)
        before = {n: w.copy() for n, w in lite.load(path).weights().items()}
        y = digits.y_test[:7]
        app.model.personalize(x[:5], y[:5], x[5:], y[5:], epochs=2)
        after = app.model.model.weights()
        changed = {n for n in before if not np.array_equal(before[n], after[n])}
        assert changed == set(app.model.head.names) and changed
    finally:
        app.close()


def test_a_model_without_logits_or_in_another_format_is_refused_with_a_reason(
    model_kinds, tmp_path
):
    from sporenet.android_demo.errors import AppError

    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"\x08\x08\x12\x07pytorch" + bytes(64))
    with pytest.raises(lite.ModelFormatError, match="ONNX model: convert it with"):
        App(onnx_file, tmp_path / "data")
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(AppError, match="is a file; give a directory"):
        App(model_kinds["float"], a_file)


def test_the_float_copy_of_an_int8_head_computes_what_the_int8_head_does(model_kinds, digits):
    """Where the int8 logits are not clipped by their range, the float copy is within half
    an output step of them (the int8 head's own rounding); the other outputs (the int8
    softmax) now read the copy's requantized logits."""
    from sporenet.android_demo.head import float_head_copy

    int8 = lite.load(model_kinds["int8"])
    copied, head = float_head_copy(int8, "logits")
    assert head.available and all(n.endswith("/float") for n in head.names)
    x = digits.x_test[:200]
    want = lite.Interpreter(model=int8).run({"input": x})
    got = lite.Interpreter(model=copied).run({"input": x})
    producer = next(
        n for n in int8.graphs[0].nodes if int8.signature().outputs["logits"] in n.outputs
    )
    q = int8.tensors[producer.inputs[0]].quantization
    scale, zero = float(q.scale.reshape(-1)[0]), int(q.zero_point.reshape(-1)[0])
    lo, hi = (-128 - zero) * scale, (127 - zero) * scale
    inside = (got["logits"] > lo + scale) & (got["logits"] < hi - scale)
    assert inside.mean() > 0.9
    diff = np.abs(got["logits"] - want["logits"])[inside]
    assert diff.max() <= 0.5 * scale * (1 + 1e-3)
    # The int8 softmax's output step is 1/256: one step either way at most, where the
    # logits it reads were rounded to the other side.
    assert np.abs(got["probabilities"] - want["probabilities"]).max() <= 2 / 256
