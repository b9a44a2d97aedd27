"""The runnable clients a new user starts from: `sporenet-client` on a folder of .npz
files, and examples/federated_client.py, against the real daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet import lite
from tests.integration.federated.helpers import status_command

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sporenet import cloud

    data = cloud.load_digits()
    cloud.manual_seed(0)
    model = cloud.models.digits_mlp(hidden=16)
    cloud.fit(model, data.x_train, data.y_train, epochs=1, batch_size=64, seed=0, verbose=0)
    path = tmp_path_factory.mktemp("model") / "digits.spore"
    cloud.export(model, path, labels=data.labels)
    return path


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_sporenet_client_and_the_example_finish_a_job(digits_model, tmp_path, server_factory):
    from sporenet import cloud

    server = server_factory(
        [
            "--model",
            str(digits_model),
            "--rounds",
            "2",
            "--min-clients",
            "2",
            "--evaluate-every",
            "1",
        ]
    ).start()
    data = cloud.load_digits()
    folder = tmp_path / "data"
    folder.mkdir()
    np.savez(folder / "part1.npz", x=data.x_train[:200], y=data.y_train[:200])
    np.savez(
        folder / "part2.npz", x=data.x_train[200:300].reshape(100, 64), y=data.y_train[200:300]
    )
    np.savez(folder / "eval.npz", x=data.x_test[:50], y=data.y_test[:50])
    client = start(
        [
            "-m",
            "sporenet.federated.client",
            "--server",
            server.address,
            "--model",
            str(digits_model),
            "--data",
            str(folder),
            "--name",
            "cli",
            "--out",
            str(tmp_path / "final.spore"),
        ]
    )
    example = start(
        [
            str(ROOT / "examples" / "federated_client.py"),
            "--server",
            server.address,
            "--model",
            str(digits_model),
            "--shard",
            "1",
            "--shards",
            "2",
        ]
    )
    try:
        out_client, _ = client.communicate(timeout=240)
        out_example, _ = example.communicate(timeout=240)
    finally:
        for proc in (client, example):
            if proc.poll() is None:
                proc.kill()
        server.terminate()
    assert client.returncode == 0, out_client + server.logs()[-2000:]
    assert example.returncode == 0, out_example
    assert "300 samples to train on, 50 to evaluate" in out_client
    assert "the job finished; final model written to" in out_client
    assert "the job finished: final model" in out_example
    fits = [r for r in status_command(server.state_dir)["rounds"] if r["phase"] == "fit"]
    assert [r["num_results"] for r in fits] == [2, 2]
    final = lite.load(tmp_path / "final.spore").weights()
    served = lite.load(server.state_dir / "models" / "v00002.spore").weights()
    for name, w in served.items():
        np.testing.assert_array_equal(final[name], w)


def test_sporenet_client_names_a_bad_data_folder(digits_model, tmp_path):
    (tmp_path / "empty").mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.federated.client",
            "--server",
            "127.0.0.1:1",
            "--model",
            str(digits_model),
            "--data",
            str(tmp_path / "empty"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "holds no .npz files" in out.stderr
