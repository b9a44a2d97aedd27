"""The device policy (termux-api commands or simulated) and the opt-in federated
participant against the real sporenet-server daemon."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from sporenet.android_demo.app import App
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.participant import ParticipantState
from sporenet.android_demo.policy import DevicePolicy, Sensors
from tests.integration.android_demo.conftest import start_server, thicker_strokes
from tests.integration.federated.helpers import status_command, wait_for


def fake_termux(bin_dir: Path, battery: str, wifi: str) -> None:
    """Executables named like termux-api's, printing what the real ones print."""
    bin_dir.mkdir(exist_ok=True)
    for name, out in (("termux-battery-status", battery), ("termux-wifi-connectioninfo", wifi)):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out}\nEOF\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_policy_reads_termux_api_when_present(tmp_path, monkeypatch):
    fake_termux(
        tmp_path / "bin",
        '{"health": "GOOD", "percentage": 40, "plugged": "PLUGGED_AC", '
        '"status": "CHARGING", "temperature": 30.1}',
        '{"ip": "192.168.1.5", "supplicant_state": "COMPLETED", "ssid": "home"}',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    now = [100.0]
    sensors = Sensors(idle_after=30.0, clock=lambda: now[0])
    assert sensors.termux
    state = sensors.read()
    assert (state.source, state.charging, state.battery, state.unmetered, state.idle) == (
        "termux",
        True,
        40.0,
        True,
        True,
    )
    policy = DevicePolicy(min_battery=50)
    assert policy.blockers(state) == ["battery 40% < 50%"]
    sensors.touch()
    now[0] += 10
    assert policy.blockers(sensors.read()) == ["in use", "battery 40% < 50%"]
    now[0] += 30
    assert DevicePolicy(min_battery=30).blockers(sensors.read()) == []


def test_simulated_policy_and_bad_threshold():
    sensors = Sensors(charging=False, battery=80, unmetered=False, termux=False)
    assert DevicePolicy().blockers(sensors.read()) == ["not charging", "metered network"]
    with pytest.raises(AppError, match="min_battery"):
        DevicePolicy(min_battery=150)


def test_participant_trains_only_when_allowed_and_keeps_the_users_model(
    tmp_path, digits_model, digits
):
    server = start_server(
        tmp_path / "state", digits_model, rounds=2, min_clients=1, extra=["--evaluate-every", "1"]
    )
    sensors = Sensors(charging=False, idle_after=0.0, termux=False)
    app = App(digits_model, tmp_path / "data", server=server.address, sensors=sensors)
    try:
        x = thicker_strokes(digits.x_test[:40]).reshape(-1, 64)
        for k in range(40):
            app.store.add(x[k], int(digits.y_test[k]))
        version = app.model.version
        app.participant.check_every = 0.05  # type: ignore[union-attr]
        app.start()
        wait_for(
            lambda: app.status()["federated"]["state"] == "waiting_for_policy",
            what="the policy to hold the participant back",
        )
        assert app.status()["federated"]["device"]["blockers"] == ["not charging"]
        assert app.participant.rounds_trained == 0  # type: ignore[union-attr]
        sensors.simulated["charging"] = True
        wait_for(
            lambda: app.status()["federated"]["state"] == ParticipantState.DONE,
            timeout=120,
            what="the federated job to finish",
        )
        assert app.participant.rounds_trained == 2  # type: ignore[union-attr]
        rounds = status_command(server.state_dir)["rounds"]
        assert [r["phase"] for r in rounds].count("fit") == 2
        final = app.participant.final_weights  # type: ignore[union-attr]
        base = app.model.base.weights()
        assert not np.array_equal(final["head.weight"], base["head.weight"])
        np.testing.assert_array_equal(final["fc1.weight"], base["fc1.weight"])
        assert app.model.version == version  # the user's model is not the fleet's
    finally:
        app.close()
        server.terminate()
