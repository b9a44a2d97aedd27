"""The app's JSON API over real HTTP on loopback: results against the lite runtime,
the SQLite store, personalization, and 400s for bad requests."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sporenet.android_demo.app import App
from sporenet.lite import Interpreter
from tests.integration.android_demo.conftest import RunningApp, run_app, thicker_strokes


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    logits = Interpreter(model_path=model).run({"input": x.reshape(-1, 1, 8, 8)})["logits"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_predict_matches_the_runtime(running_app, digits, digits_model):
    assert running_app.server.server_address[0] == "127.0.0.1"
    x = digits.x_test[:5].reshape(5, 64)
    expected = reference(digits_model, x)
    for k in range(5):
        status, out = running_app.call("POST", "/api/predict", {"pixels": x[k].tolist()})
        assert status == 200
        assert out["label"] == int(expected[k].argmax())
        np.testing.assert_allclose(out["probabilities"], expected[k], rtol=1e-5, atol=1e-7)
        assert 0 < out["latency_ms"] < 1000


def test_samples_personalize_and_status(running_app, digits, digits_model, tmp_path):
    status, out = running_app.call("GET", "/api/status")
    assert status == 200 and out["samples"] == 0 and not out["model"]["personalized"]
    assert out["federated"]["enabled"] is False
    version = out["model"]["version"]
    x = thicker_strokes(digits.x_test[:150]).reshape(-1, 64)
    y = digits.y_test[:150]
    for k in range(len(y)):
        status, out = running_app.call(
            "POST", "/api/samples", {"pixels": x[k].tolist(), "label": int(y[k])}
        )
        assert status == 200 and out == {"stored": k + 1}
    status, out = running_app.call("POST", "/api/personalize", {"epochs": 30})
    assert status == 200, out
    assert out["samples"] == 120  # every 5th of 150 held out
    held = np.arange(1, 151) % 5 == 0
    before = float(np.mean(reference(digits_model, x[held]).argmax(1) == y[held]))
    assert out["before"] == pytest.approx(before)
    assert out["after"] > out["before"]
    status, st = running_app.call("GET", "/api/status")
    assert st["model"]["personalized"] and st["model"]["version"] == version + "+p1"
    assert st["personalization"]["last"]["after"] == out["after"]
    assert st["personalization"]["epoch"] == 30
    # The user's model and samples survive a restart of the app.
    again = App(digits_model, tmp_path / "data")
    try:
        assert again.store.count() == 150
        assert again.model.version == version + "+p1"
        assert again.model.accuracy(x[held], y[held]) == pytest.approx(out["after"])
    finally:
        again.close()


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/predict", {"pixels": [0] * 63}, "must hold 64 numbers"),
        ("/api/predict", {"pixels": [0] * 63 + [17]}, "pixel 63 is 17"),
        ("/api/predict", {"pixels": [0] * 63 + [-1]}, "in [0, 16]"),
        ("/api/predict", {"pixels": [0] * 63 + [True]}, "pixel 63 is True"),
        ("/api/predict", {"pixels": [0] * 63 + ["3"]}, "pixel 63"),
        ("/api/predict", {"pixels": "0" * 64}, "must be a list"),
        ("/api/predict", {}, "got nothing"),
        ("/api/predict", [1, 2], "JSON object"),
        ("/api/samples", {"pixels": [0] * 64, "label": 10}, "`label` must be an integer in [0, 9]"),
        ("/api/samples", {"pixels": [0] * 64, "label": "3"}, "`label`"),
        ("/api/samples", {"pixels": [0] * 64}, "got None"),
        ("/api/personalize", {"epochs": 0}, "`epochs` must be an integer in [1, 200]"),
        ("/api/personalize", {"epochs": 2.5}, "`epochs`"),
        ("/api/personalize", {"epochs": 3}, "needs at least 5 stored samples"),
    ],
)
def test_bad_requests_get_400_with_a_message(running_app, path, body, message):
    status, out = running_app.call("POST", path, body)
    assert status == 400
    assert message in out["error"]


def test_malformed_bodies_and_unknown_routes(running_app):
    status, out = running_app.call("POST", "/api/predict", raw=b"{not json")
    assert status == 400 and "JSON object" in out["error"]
    status, out = running_app.call("POST", "/api/predict", raw=b"\xff\xfe")
    assert status == 400
    status, out = running_app.call(
        "POST", "/api/predict", raw=b'{"pixels": [NaN' + b", 0" * 63 + b"]}"
    )
    assert status == 400 and "pixel 0" in out["error"]
    status, out = running_app.call("GET", "/api/nothing")
    assert status == 404 and "/api/predict" in out["error"]
    status, out = running_app.call("GET", "/api/predict")
    assert status == 405
    with urllib.request.urlopen(running_app.url, timeout=30) as page:
        html = page.read().decode()
    assert '<canvas id="pad"' in html and "/api/predict" in html


def test_the_command_serves_on_loopback(digits_model, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sporenet.android_demo",
            "--model",
            str(digits_model),
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "http://127.0.0.1:" in line, proc.stderr.read()  # type: ignore[union-attr]
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        running = RunningApp.__new__(RunningApp)
        running.url = url
        status, out = running.call("GET", "/api/status")
        assert status == 200 and out["samples"] == 0
    finally:
        proc.terminate()
        proc.wait(30)
    bad = run_app("--model", str(tmp_path / "missing.spore"), "--data-dir", str(tmp_path / "d"))
    assert bad.returncode == 2 and "missing.spore" in bad.stderr
