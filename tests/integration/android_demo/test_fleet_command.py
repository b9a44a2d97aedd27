"""The sporenet-fleet command as a user meets it: it starts its own server with the cohort
the fleet needs, says when a server is not there, fails when rounds are missing, writes a
plot only when asked, and refuses a model without logits with a reason."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from sporenet import lite
from tests.integration.android_demo.conftest import start_server
from tests.integration.federated.helpers import free_port as closed_port


def fleet(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sporenet.android_demo.fleet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def test_the_fleet_starts_its_own_server_with_the_cohort_and_a_fresh_head(digits_model, tmp_path):
    out = fleet(
        "--model",
        str(digits_model),
        "--devices",
        "12",
        "--rounds",
        "2",
        "--fresh-head",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a round starts with 12 live devices" in out.stdout
    assert "aggregates once 6 updates are in" in out.stdout
    # The server outlives the devices: the round monitor's last look finds it.
    assert "does not answer" not in out.stdout
    # Every device trained in round 1: the server waited for the whole cohort.
    assert "round 1/2: 12 of 12 devices' updates aggregated" in out.stdout
    initial = float(out.stdout.split("initial accuracy ")[1].split()[0])
    assert initial < 0.3  # a fresh head starts near chance, the shipped one near 0.9
    assert not list(tmp_path.glob("*.png"))  # no --plot, no file


@pytest.mark.slow  # the unit test of wait_for_server covers the backoff and message
def test_a_server_that_is_not_there_is_named_and_the_command_fails(digits_model, tmp_path):
    address = f"127.0.0.1:{closed_port()}"
    out = fleet(
        "--model",
        str(digits_model),
        "--devices",
        "2",
        "--rounds",
        "1",
        "--server",
        address,
        "--connect-timeout",
        "2",
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"cannot reach the server at {address}" in out.stderr
    assert "retrying in" in out.stdout and address in out.stdout


def test_rounds_the_server_did_not_run_make_the_exit_code_1(digits_model, tmp_path):
    server = start_server(tmp_path / "state", digits_model, rounds=1, min_clients=3)
    try:
        out = fleet(
            "--model",
            str(digits_model),
            "--devices",
            "3",
            "--rounds",
            "2",
            "--server",
            server.address,
            cwd=tmp_path,
        )
    finally:
        server.terminate()
    assert out.returncode == 1, out.stdout + out.stderr
    assert "rounds [2] did not run" in out.stderr


@pytest.mark.slow  # a subprocess for one message
def test_a_model_without_logits_is_refused_with_a_reason(digits_model, tmp_path):
    model = lite.load(digits_model)
    sig = model.signatures["infer"]
    outputs = {"probabilities": sig.outputs["probabilities"]}
    model.signatures["infer"] = dataclasses.replace(sig, outputs=outputs)
    path = tmp_path / "probabilities-only.spore"
    lite.save(model, path)
    out = fleet("--model", str(path), "--devices", "2", "--rounds", "1", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "needs a 'logits' output" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow  # a subprocess for one message
def test_plot_without_matplotlib_is_refused_before_the_run(digits_model, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot itself is checked where it is installed")
    blocker = tmp_path / "site" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no matplotlib here')")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]);"
            "from sporenet.android_demo.fleet.cli import main; sys.exit(main(sys.argv[2:]))",
            str(tmp_path / "site"),
            "--model",
            str(digits_model),
            "--devices",
            "2",
            "--rounds",
            "1",
            "--plot",
            "x.png",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "--plot needs matplotlib: pip install 'sporenet[plot]'" in out.stderr
