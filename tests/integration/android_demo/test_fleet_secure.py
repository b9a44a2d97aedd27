"""The fleet simulator in secure jobs on the real sporenet-server daemon: its virtual
devices run the client SDK's SecAgg+ steps in secure rounds and secure async buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sporenet.android_demo.fleet import FleetProfile, simulate
from sporenet.android_demo.fleet.simulator import FleetReport
from tests.integration.android_demo.conftest import start_server
from tests.integration.federated.helpers import status_command
from tests.integration.federated.test_secure_rounds import published

LAX = ["--heartbeat-interval", "1", "--heartbeat-timeout", "60", "--round-timeout", "120"]
FAST = ["--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5", "--round-timeout", "60"]
# Weighted by samples (every device holds fewer than this), as a plain round weights them;
# a coordinate's clipping range far above any update's.
SECURE_CONFIG = """
[secure_aggregation]
clipping_range = 8.0
max_weight = 1000
stage_timeout = 30
"""


def run(
    tmp_path: Path,
    name: str,
    model: Path,
    *,
    devices: int,
    rounds: int,
    extra: list[str],
    profile: FleetProfile,
) -> tuple[FleetReport, Path]:
    config = tmp_path / "secure.toml"
    config.write_text(SECURE_CONFIG)
    state = tmp_path / name
    server = start_server(
        state, model, rounds=rounds, min_clients=devices, extra=["--config", str(config), *extra]
    )
    try:
        report = simulate(
            server.address,
            model.read_bytes(),
            devices=devices,
            rounds=rounds,
            profile=profile,
            groups=1,
            timeout=300,
        )
        assert server.proc is not None and server.proc.wait(120) == 0, server.logs()[-3000:]
    finally:
        server.terminate()
    return report, state


def test_secure_rounds_publish_the_plain_mean(tmp_path, digits_model):
    """The same fleet in plain and in secure rounds trains the same updates (batches per
    device and round): each secure round publishes the plain round's model within the
    fixed-point error."""
    devices, rounds = 6, 2
    profile = FleetProfile(partition="iid", simulate_time=False)
    reports = {}
    for mode in ("plain", "secure"):
        extra = [*LAX, *(["--secure"] if mode == "secure" else [])]
        reports[mode], state = run(
            tmp_path,
            mode,
            digits_model,
            devices=devices,
            rounds=rounds,
            extra=extra,
            profile=profile,
        )
        report = reports[mode]
        assert not report.errors, report.errors
        assert [r.trained for r in report.rounds] == [devices] * rounds
    fits = [r for r in status_command(state)["rounds"] if r["phase"] == "fit"]
    assert [f["num_results"] for f in fits] == [devices] * rounds
    # Round 1 starts from the same model in both; round 2 from models within the error.
    for version in range(1, rounds + 1):
        plain = published(tmp_path / "plain", version)
        secure = published(tmp_path / "secure", version)
        for k, w in plain.items():
            err = np.abs(secure[k].astype(np.float64) - w)
            assert err.max() <= 1e-5, (version, k, err.max())
        # ...while training moved the model far more than that.
        before = published(tmp_path / "plain", version - 1)
        assert max(np.abs(w - before[k]).max() for k, w in plain.items()) > 1e-3


def test_secure_async_buffers_with_dropouts(tmp_path, digits_model):
    """Devices that drop out inside a buffer are recovered (or the buffer runs again
    among its survivors); every buffer publishes, and the job finishes."""
    devices, rounds = 10, 3
    profile = FleetProfile(
        partition="iid", simulate_time=False, dropout_upload=0.1, rejoin_after_s=0.5, seed=3
    )
    extra = [*FAST, "--secure", "--async", "--concurrency", "8", "--buffer-size", "4"]
    report, state = run(
        tmp_path,
        "async",
        digits_model,
        devices=devices,
        rounds=rounds,
        extra=extra,
        profile=profile,
    )
    assert not report.errors, report.errors
    assert all(np.isfinite(r.accuracy) for r in report.rounds)
    fits = [r for r in status_command(state)["rounds"] if r["phase"] == "fit"]
    assert len(fits) == rounds
    assert all(f["num_results"] >= 2 for f in fits), fits
