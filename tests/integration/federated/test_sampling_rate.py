"""`fraction` with `min_available`: a round selects a fraction of the live clients (at
least min_clients), and differential privacy is charged that cohort's share as q.

A real `sporenet-server` subprocess with central DP and real Clients on loopback.
"""

from __future__ import annotations

from pathlib import Path

from sporenet.federated.server.status import read_status
from tests.integration.federated.helpers import make_model
from tests.integration.federated.test_differential_privacy import (
    expected_epsilons,
    fixed_deltas,
    run_clients,
    write_config,
)


def test_min_available_gates_the_start_and_the_cohort_is_a_fraction_of_the_live(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore")
    dp = "mode = 'central'\nnoise_multiplier = 1.0\nclipping_norm = 1.0"
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=1, clients=2)
    cfg.write_text("fraction = 0.5\nmin_available = 4\n" + cfg.read_text())
    server = server_factory(["--config", str(cfg)]).start()
    threads = run_clients(server.address, fixed_deltas(w0, [0.5] * 4))
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()
    # The round waited for all 4 (min_available), then asked half of them.
    started = server.events("phase_started")
    assert [(e["selected"], e["live"]) for e in started] == [(2, 4)], started
    (entry,) = read_status(server.state_dir)["privacy"]["rounds"]
    assert (entry["cohort"], entry["sample_rate"]) == (2, 0.5)
    assert entry["epsilon"] == expected_epsilons(1.0, 0.5, 1)[0]
    assert server.proc.wait(60) == 0
