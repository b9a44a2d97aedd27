"""A job's settings survive restarts: a restart with only --state-dir resumes the job as
it was started (rounds, strategy, DP); conflicting settings are refused, each named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.federated.helpers import make_model, status_command

SETTINGS = """
rounds = 4
min_clients = 2
[strategy]
name = "fedprox"
proximal_mu = 0.25
[differential_privacy]
enabled = true
mode = "central"
noise_multiplier = 0.7
clipping_norm = 2.0
"""


def _run(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sporenet.federated.server", "--address", "127.0.0.1:0"]
    return subprocess.run(
        [*cmd, "--state-dir", str(state_dir), *args], capture_output=True, text=True, timeout=120
    )


def _started_job(tmp_path: Path, server_factory) -> Path:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    toml = tmp_path / "job.toml"
    toml.write_text(f'model = "{tmp_path / "init.spore"}"\n' + SETTINGS)
    server = server_factory(["--config", str(toml)]).start()
    assert server.terminate() == 0
    return server.state_dir


def test_restart_with_only_state_dir_resumes_the_job_settings(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    state_dir = _started_job(tmp_path, server_factory)
    server = server_factory([], name=state_dir.name).start()  # only --state-dir (and address)
    config = status_command(state_dir)["config"]
    assert config["rounds"] == 4 and config["min_clients"] == 2
    assert config["strategy"] == {"name": "fedprox", "options": {"proximal_mu": 0.25}}
    dp = config["differential_privacy"]
    assert (dp["mode"], dp["noise_multiplier"], dp["clipping_norm"]) == ("central", 0.7, 2.0)
    assert server.terminate() == 0


def test_conflicting_settings_are_refused_naming_each_key(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    state_dir = _started_job(tmp_path, server_factory)
    out = _run(state_dir, "--rounds", "3", "--min-clients", "2")
    assert out.returncode == 2, out.stderr
    assert "`rounds` = 3 (the job has 4)" in out.stderr and "min_clients" not in out.stderr
    no_dp = tmp_path / "no_dp.toml"
    no_dp.write_text("[differential_privacy]\nenabled = false\n[strategy]\nname = 'fedavg'\n")
    out = _run(state_dir, "--config", str(no_dp))
    assert out.returncode == 2, out.stderr
    for key in ("differential_privacy.enabled", "differential_privacy.noise_multiplier"):
        assert f"`{key}` = None" in out.stderr, out.stderr
    assert "`strategy.name` = 'fedavg' (the job has 'fedprox')" in out.stderr
    assert "`strategy.proximal_mu` = None (the job has 0.25)" in out.stderr
    assert "Traceback" not in out.stderr
