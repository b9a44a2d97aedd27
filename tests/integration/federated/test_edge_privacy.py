"""Differential privacy across tiers (local mode): the cloud's `dp_local_*` task keys reach
the devices through the edges, each device clips and noises its own delta, and the cloud's
ledger charges each round with q = 1. Checked against the noise and epsilon the docs give."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sporenet.federated.privacy import RDPAccountant
from sporenet.federated.server.status import read_status
from tests.integration.federated.edge_helpers import (
    SAMPLES,
    join_all,
    run_devices_behind,
    serving,
    tier_logs,
)
from tests.integration.federated.helpers import make_model

Z, C, DELTA = 0.7, 0.5, 1e-5


def no_change(i: int, weights: dict[str, np.ndarray], config: dict[str, Any]) -> dict:
    """Devices that do not move the model: whatever the published delta holds is noise."""
    return weights


def test_local_dp_through_edges_noise_and_epsilon(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=64, inp=32)
    toml = tmp_path / "cloud.toml"
    toml.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 1\nmin_clients = 2\n'
        '[differential_privacy]\nenabled = true\nmode = "local"\n'
        f"noise_multiplier = {Z}\nclipping_norm = {C}\ndelta = {DELTA}\n"
    )
    cloud = server_factory(["--config", str(toml)]).start()
    args = ["--min-clients", "2"]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    threads, results, configs = run_devices_behind(edges, step=no_change)
    join_all(threads, 120, tier_logs(cloud, edges))

    # Every device was told to add all of the noise itself.
    assert {(c["dp_local_noise_multiplier"], c["dp_clipping_norm"]) for c in configs} == {(Z, C)}
    # Noise N(0, (zC)^2) on each device's delta, then sample-weighted means at the edges
    # and the cloud: the published delta's std is zC·sqrt(sum n_i^2)/sum n_i.
    final = results[0]
    noise = np.concatenate([(final[k] - w0[k]).ravel() for k in w0]).astype(np.float64)
    expected = Z * C * math.sqrt(sum(n * n for n in SAMPLES)) / sum(SAMPLES)
    # 2112 coordinates: the sample std is within ~1.5% (one sigma) of the true std.
    assert abs(noise.std() / expected - 1) < 0.08, (noise.std(), expected)
    assert abs(noise.mean()) < 4 * expected / math.sqrt(noise.size)
    # Epsilon: the cloud's ledger charged one round of the Gaussian mechanism with q = 1.
    privacy = read_status(cloud.state_dir)["privacy"]
    reference = RDPAccountant(delta=DELTA)
    want = reference.spend(noise_multiplier=Z, sample_rate=1.0)
    assert privacy["rounds"][0]["sample_rate"] == 1.0, privacy
    assert privacy["epsilon"] == pytest.approx(want, rel=1e-9), privacy
