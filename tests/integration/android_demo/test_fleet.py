"""The fleet simulator against the real sporenet-server daemon: the sporenet-fleet command
(local backend) and the Ray backend on a local Ray the test starts on loopback."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sporenet.android_demo.fleet import FleetProfile, simulate
from sporenet.android_demo.fleet.devices import DeviceGroup, GroupReport
from sporenet.android_demo.fleet.shared import DEVICES_PER_CHANNEL
from sporenet.android_demo.fleet.simulator import group_args
from tests.integration.android_demo.conftest import start_server
from tests.integration.federated.helpers import status_command

# Dropouts are noticed after heartbeat_timeout: short here, so rounds close quickly.
FAST = ["--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.0", "--round-timeout", "60"]
# Without dropouts, heartbeats as lax as a busy machine needs for every device to count
# (a device starved of CPU for FAST's 1 s would be dropped and its round retrained).
LAX = ["--heartbeat-interval", "1", "--heartbeat-timeout", "60", "--round-timeout", "120"]


def test_fleet_command_with_dropouts_and_a_plot(tmp_path, digits_model):
    devices, rounds = 24, 3
    server = start_server(
        tmp_path / "state", digits_model, rounds=rounds, min_clients=4, extra=FAST
    )
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "partition": "dirichlet",
                "alpha": 0.5,
                "dropout_train": 0.15,
                "dropout_upload": 0.1,
                "latency_ms": 2,
                "bandwidth_mbps": 100,
                "speed_sigma": 0.5,
                "rejoin_after_s": 0.5,
                "online_fraction": 0.8,
                "mean_online_s": 2.0,
                "seed": 1,
            }
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.android_demo.fleet",
            "--server",
            server.address,
            "--model",
            str(digits_model),
            "--devices",
            str(devices),
            "--rounds",
            str(rounds),
            "--profile",
            str(profile),
            "--plot",
            str(tmp_path / "fleet.png"),
            "--json",
            str(tmp_path / "fleet.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    server.terminate()
    assert out.returncode == 0, out.stdout + out.stderr + server.logs()[-3000:]
    report = json.loads((tmp_path / "fleet.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert all(np.isfinite(r["accuracy"]) and r["seconds"] > 0 for r in report["rounds"])
    # What the simulator counted agrees with what the server aggregated.
    fits = [r for r in status_command(server.state_dir)["rounds"] if r["phase"] == "fit"]
    assert len(fits) == rounds
    dropped = sum(r["dropped_train"] + r["dropped_upload"] for r in report["rounds"])
    assert dropped > 0
    assert report["offline_periods"] > 0  # the availability trace took devices away
    assert sum(r["trained"] for r in report["rounds"]) >= rounds * 4
    assert (tmp_path / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "accuracy" in out.stdout and "plot:" in out.stdout
    # A line per round while it ran, then the table and what its columns mean.
    assert [f"round {r}/{rounds}:" in out.stdout for r in (1, 2, 3)] == [True] * 3
    assert "uploaded: devices whose update the server accepted" in out.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed (pip install 'sporenet[fleet-ray]')",
)
def test_ray_backend_runs_the_same_groups(tmp_path, digits_model):
    devices, rounds = 16, 2
    server = start_server(
        tmp_path / "state", digits_model, rounds=rounds, min_clients=devices, extra=LAX
    )
    try:
        report = simulate(
            server.address,
            Path(digits_model).read_bytes(),
            devices=devices,
            rounds=rounds,
            backend="ray",
            groups=2,
            profile=FleetProfile(partition="iid", simulate_time=False),
            timeout=240,
        )
    finally:
        server.terminate()
    assert not report.errors, report.errors
    assert [r.trained for r in report.rounds] == [devices] * rounds
    assert all(np.isfinite(r.accuracy) for r in report.rounds)
    fits = [r for r in status_command(server.state_dir)["rounds"] if r["phase"] == "fit"]
    assert len(fits) == rounds


def test_processes_backend_trains_natural_partitions_in_child_processes(tmp_path, digits_model):
    """Each group in a spawned process; the devices hold the dataset's natural owners."""
    from sporenet.android_demo.fleet.data import FleetData, load_digits

    digits = load_digits()
    devices, rounds = 6, 1
    owned = FleetData(
        "digits by label", digits.x, digits.y, digits.x_test, digits.y_test, owners=digits.y
    )
    server = start_server(
        tmp_path / "state", digits_model, rounds=rounds, min_clients=devices, extra=LAX
    )
    try:
        report = simulate(
            server.address,
            Path(digits_model).read_bytes(),
            devices=devices,
            rounds=rounds,
            data=owned,
            backend="processes",
            profile=FleetProfile(partition="natural", simulate_time=False),
            timeout=240,
        )
    finally:
        server.terminate()
    assert not report.errors, report.errors
    assert [r.trained for r in report.rounds] == [devices] * rounds
    assert np.isfinite(report.rounds[0].accuracy)


def test_a_group_shares_its_threads_connections_and_models(tmp_path, digits_model):
    """Devices are coroutines, not threads; their streams share a few connections; each
    global model is downloaded once per group, and what the devices trained is what the
    server aggregated."""
    devices, rounds = 150, 2
    server = start_server(
        tmp_path / "state", digits_model, rounds=rounds, min_clients=devices, extra=LAX
    )
    model = Path(digits_model).read_bytes()
    args = group_args(
        model, devices, FleetProfile(simulate_time=False), 1, head_only=True, train_config={}
    )[0]
    group = DeviceGroup(**args)
    result: list[GroupReport] = []
    runner = threading.Thread(target=lambda: result.append(group.run(server.address, timeout=240)))
    before = threading.active_count()
    runner.start()
    most = 0
    while runner.is_alive():
        most = max(most, threading.active_count() - before)
        runner.join(0.05)
    try:
        # Every device was told the job ended, holding the group's one final download, so
        # the daemon exits 0 without waiting out the heartbeat timeout for any of them.
        assert server.proc.wait(120) == 0, server.logs()[-3000:]
    finally:
        server.terminate()
    (finished,), (exiting,) = server.events("job_finished"), server.events("job_ended_exiting")
    assert exiting["ts"] - finished["ts"] < float(LAX[LAX.index("--heartbeat-timeout") + 1])
    report = result[0]
    assert not report.errors, report.errors
    assert [report.rounds[r].trained for r in (1, 2)] == [devices, devices]
    # The runner, the training worker and (once) the shared transport loop; never one
    # thread per device.
    assert most <= 4, most
    assert len(group._channels.channels) == math.ceil(devices / DEVICES_PER_CHANNEL)
    # Round 1's model, round 2's and the final one: each fetched once for all devices.
    assert group.models.downloads == rounds + 1
    fits = [r for r in status_command(server.state_dir)["rounds"] if r["phase"] == "fit"]
    assert [f["num_results"] for f in fits] == [devices] * rounds
    assert report.final is not None and set(report.final) == set(report.weights[1])
