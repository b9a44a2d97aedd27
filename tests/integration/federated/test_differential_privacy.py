"""Central differential privacy in the real daemon: clipping, noise scale, accounting, budget.

Real `sporenet-server` subprocesses and real Clients on loopback. Every client's update is
a fixed vector, so the clipped mean of a round is known exactly and what remains of the
published model change is the server's Gaussian noise.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from sporenet.federated import Client
from sporenet.federated.privacy import RDPAccountant
from sporenet.federated.server.status import read_status
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model, status_command, wait_for

CLIP = 1.0
NOISE = 0.5


def fixed_deltas(w0: dict[str, np.ndarray], norms: list[float]) -> list[dict[str, np.ndarray]]:
    """One fixed update per client with the given global L2 norm."""
    rng = np.random.default_rng(7)
    out = []
    for norm in norms:
        d = {k: rng.standard_normal(v.shape) for k, v in w0.items()}
        scale = norm / np.sqrt(sum(float(np.sum(a * a)) for a in d.values()))
        out.append({k: (a * scale).astype(np.float32) for k, a in d.items()})
    return out


def write_config(path: Path, model: Path, dp: str, *, rounds: int, clients: int) -> Path:
    path.write_text(
        f'model = "{model}"\nrounds = {rounds}\nmin_clients = {clients}\n'
        f"[differential_privacy]\nenabled = true\n{dp}\n"
    )
    return path


def run_clients(
    address: str,
    deltas: list[dict[str, np.ndarray]],
    *,
    hold: threading.Event | None = None,
) -> list[threading.Thread]:
    """Clients that add their fixed delta to whatever model they get."""

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if hold is not None and i == 0 and config["round"] == 2:
                hold.wait(60)  # keeps round 2 open while the server is killed
            return {k: w + deltas[i][k] for k, w in weights.items()}, 10, {}

        c = Client(address, train=train, name=f"dp{i}", poll_wait=1.0, max_backoff=0.3)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(deltas))]
    for t in threads:
        t.start()
    return threads


def model_version(state_dir: Path, v: int) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(a, np.float64)
        for k, a in read_weights((state_dir / f"models/v{v:05d}.spore").read_bytes()).items()
    }


def expected_epsilons(noise: float, sample_rate: float, rounds: int) -> list[float]:
    acc = RDPAccountant(delta=1e-5)
    return [acc.spend(noise_multiplier=noise, sample_rate=sample_rate) for _ in range(rounds)]


def test_central_dp_clips_adds_noise_of_the_configured_scale_and_accounts(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    n = 4
    w0 = make_model(tmp_path / "init.spore", out=64, inp=64)  # 4160 coordinates
    # Three honest updates under the clipping norm, one enormous one.
    deltas = fixed_deltas(w0, [0.3, 0.5, 0.8, 1000.0])
    dp = f"noise_multiplier = {NOISE}\nclipping_norm = {CLIP}\ndelta = 1e-5"
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=2, clients=n)
    server = server_factory(["--config", str(cfg)]).start()
    threads = run_clients(server.address, deltas)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    clipped = [
        {k: a.astype(np.float64) * min(1.0, CLIP / norm) for k, a in d.items()}
        for d, norm in zip(deltas, [0.3, 0.5, 0.8, 1000.0], strict=True)
    ]
    clipped_mean = {k: sum(c[k] for c in clipped) / n for k in w0}
    plain_mean = {k: sum(d[k].astype(np.float64) for d in deltas) / n for k in w0}
    want_std = NOISE * CLIP / n
    for v in (1, 2):
        before, after = model_version(server.state_dir, v - 1), model_version(server.state_dir, v)
        residual = np.concatenate([(after[k] - before[k] - clipped_mean[k]).ravel() for k in w0])
        # 4160 draws: the sample std is within ~1.1% (1 sigma) of the true one.
        assert abs(residual.std() / want_std - 1) < 0.2, (residual.std(), want_std)
        assert abs(residual.mean()) < 5 * want_std / np.sqrt(residual.size)
        # Unclipped, the 1000-norm update would dominate: the change would be ~250 in norm.
        change = np.concatenate([(after[k] - before[k]).ravel() for k in w0])
        plain = np.concatenate([plain_mean[k].ravel() for k in w0])
        assert np.linalg.norm(change) < 20 < np.linalg.norm(plain)

    status = read_status(server.state_dir)
    privacy = status["privacy"]
    eps = [r["epsilon"] for r in privacy["rounds"]]
    assert [r["round"] for r in privacy["rounds"]] == [1, 2]
    assert [r["sample_rate"] for r in privacy["rounds"]] == [1.0, 1.0]
    assert eps[0] < eps[1]
    np.testing.assert_allclose(eps, expected_epsilons(NOISE, 1.0, 2), rtol=1e-9)
    assert privacy["epsilon"] == eps[-1] and privacy["delta"] == 1e-5
    assert [e["epsilon"] for e in server.events("privacy_spent")] == eps
    assert status["job"]["status"] == "finished"
    # What an operator sees: `sporenet-server status` prints the same privacy record.
    shown = status_command(server.state_dir)["privacy"]
    assert shown["epsilon"] == eps[-1] and shown["epsilon_budget"] is None
    assert [r["epsilon"] for r in shown["rounds"]] == eps
    assert server.terminate() == 0


def test_kill9_keeps_the_accountant_and_the_budget_stops_the_job(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    n, noise = 3, 2.0
    w0 = make_model(tmp_path / "init.spore")
    eps = expected_epsilons(noise, 1.0, 5)
    budget = (eps[2] + eps[3]) / 2  # three rounds fit, a fourth would overspend
    dp = f"noise_multiplier = {noise}\nclipping_norm = 1.0\ndelta = 1e-5\nepsilon_budget = {budget}"
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=10, clients=n)
    server = server_factory(["--config", str(cfg), "--checkpoint-every", "1"]).start()
    hold = threading.Event()
    threads = run_clients(server.address, fixed_deltas(w0, [0.2, 0.4, 3.0]), hold=hold)

    def round2_has_two_updates() -> bool:
        s = read_status(server.state_dir)
        accepted = [c for c, st in s["participants"].items() if st == "accepted"]
        return s["job"]["round"] == 2 and s["job"]["active"] and len(accepted) == 2

    # Round 1 is paid for; round 2 holds two clipped updates in its checkpoint.
    wait_for(round2_has_two_updates, timeout=30, what="round 2 with two updates")
    assert len(read_status(server.state_dir)["privacy"]["rounds"]) == 1
    server.kill9()
    server.start()
    hold.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    # The clipped-sum checkpoint of the DP aggregator came back with the round.
    assert [e["checkpointed"] for e in server.events("aggregate_restored")] == [2]
    restored = server.events("privacy_restored")
    assert len(restored) == 1 and restored[0]["rounds"] == 1
    np.testing.assert_allclose(restored[0]["epsilon"], eps[0], rtol=1e-9)
    status = read_status(server.state_dir)
    privacy = status["privacy"]
    assert [r["round"] for r in privacy["rounds"]] == [1, 2, 3]
    np.testing.assert_allclose([r["epsilon"] for r in privacy["rounds"]], eps[:3], rtol=1e-9)
    assert privacy["epsilon"] <= budget
    # A clean finish, not a failure, with the reason; three models published, not more.
    assert status["job"]["status"] == "finished"
    assert "privacy budget" in status["job"]["reason"], status["job"]
    assert status["job"]["model_version"] == 3
    assert [r["round"] for r in status["rounds"] if r["finished_at"]] == [1, 2, 3]
    assert server.terminate() == 0


def test_adaptive_clipping_moves_the_norm_towards_the_quantile(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore")
    # Every update is far below the initial norm: the unclipped fraction is 1 > 0.5, so the
    # norm shrinks by exp(-lr·(1 - 0.5)) per round (the count noise, σ=0.06, is tiny).
    dp = (
        "noise_multiplier = 0.1\nclipping_norm = 1.0\nadaptive_clipping = true\n"
        "target_quantile = 0.5\nclipping_learning_rate = 1.0\ncount_noise_multiplier = 0.06"
    )
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=2, clients=3)
    server = server_factory(["--config", str(cfg)]).start()
    threads = run_clients(server.address, fixed_deltas(w0, [0.01, 0.02, 0.03]))
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()
    privacy = read_status(server.state_dir)["privacy"]
    norms = [r["clipping_norm"] for r in privacy["rounds"]]
    assert norms[0] == 1.0
    np.testing.assert_allclose(norms[1], np.exp(-0.5), rtol=0.1)
    np.testing.assert_allclose(privacy["adaptive"]["clipping_norm"], np.exp(-1.0), rtol=0.2)
    assert server.terminate() == 0


def test_distributed_dp_with_secure_aggregation_noises_the_secure_sum(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    n = 4
    w0 = make_model(tmp_path / "init.spore", out=64, inp=64)  # 4160 coordinates
    norms = [0.3, 0.5, 0.8, 1000.0]
    deltas = fixed_deltas(w0, norms)
    dp = f'mode = "distributed"\nnoise_multiplier = {NOISE}\nclipping_norm = {CLIP}'
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=2, clients=n)
    # 4 clients: 3 neighbours, threshold 2, so each client adds N(0, (zC)²/2).
    cfg.write_text(cfg.read_text() + "[secure_aggregation]\nenabled = true\nclipping_range = 5.0\n")
    server = server_factory(["--config", str(cfg)]).start()
    threads = run_clients(server.address, deltas)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    clipped_mean = {
        k: sum(
            d[k].astype(np.float64) * min(1.0, CLIP / m) for d, m in zip(deltas, norms, strict=True)
        )
        / n
        for k in w0
    }
    # The mean over 4 contributors of 4 shares of variance (zC)²/2: std zC·sqrt(2)/4.
    want_std = NOISE * CLIP * np.sqrt(n / 2) / n
    for v in (1, 2):
        before, after = model_version(server.state_dir, v - 1), model_version(server.state_dir, v)
        residual = np.concatenate([(after[k] - before[k] - clipped_mean[k]).ravel() for k in w0])
        assert abs(residual.std() / want_std - 1) < 0.2, (residual.std(), want_std)
        assert abs(residual.mean()) < 5 * want_std / np.sqrt(residual.size)
    privacy = read_status(server.state_dir)["privacy"]
    assert privacy["mode"] == "distributed"
    np.testing.assert_allclose(
        [r["epsilon"] for r in privacy["rounds"]], expected_epsilons(NOISE, 1.0, 2), rtol=1e-9
    )
    assert server.terminate() == 0


def test_distributed_dp_refuses_a_clipping_range_the_noise_would_overflow(
    tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    from sporenet.federated.server.cli import main

    make_model(tmp_path / "init.spore", out=64, inp=64)
    dp = 'mode = "distributed"\nnoise_multiplier = 1.0\nclipping_norm = 1.0'
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=1, clients=4)
    cfg.write_text(cfg.read_text() + "[secure_aggregation]\nenabled = true\nclipping_range = 1.0\n")
    code = main(
        ["--config", str(cfg), "--state-dir", str(tmp_path / "state"), "--address", "127.0.0.1:0"]
    )
    assert code == 2
    assert "`secure_aggregation.clipping_range` must be >= " in capsys.readouterr().err


def test_dp_cannot_be_switched_on_for_a_job_that_ran_without_it(tmp_path: Path) -> None:
    import logging

    import pytest

    from sporenet.federated.errors import ConfigError
    from sporenet.federated.server.config import build_config
    from sporenet.federated.server.observability import Metrics
    from sporenet.federated.server.rounds import RoundManager

    make_model(tmp_path / "init.spore")
    plain = {"state_dir": str(tmp_path / "state"), "model": str(tmp_path / "init.spore")}
    log = logging.getLogger("test-dp")
    RoundManager(build_config(plain, {}), metrics=Metrics(), logger=log).close()
    with_dp = {**plain, "differential_privacy": {"enabled": True}}
    with pytest.raises(ConfigError, match="cannot be enabled for a job that started without it"):
        RoundManager(build_config(with_dp, {}), metrics=Metrics(), logger=log)
    # A job created with DP has its (empty) accountant from the start, and restarts fine.
    dp_dir = {**with_dp, "state_dir": str(tmp_path / "dp")}
    RoundManager(build_config(dp_dir, {}), metrics=Metrics(), logger=log).close()
    manager = RoundManager(build_config(dp_dir, {}), metrics=Metrics(), logger=log)
    assert manager.status()["privacy"]["epsilon"] == 0.0
    assert manager.status()["privacy"]["rounds"] == []
    manager.close()


def test_local_dp_clients_add_all_the_noise_and_get_no_sampling_amplification(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=64, inp=64)  # 4160 coordinates
    # Every client has the same update (norm 3, clipped to 1), so the clipped mean is known
    # whichever clients the half-fraction sample picks.
    (common,) = fixed_deltas(w0, [3.0])
    dp = f'mode = "local"\nnoise_multiplier = {NOISE}\nclipping_norm = {CLIP}'
    cfg = write_config(tmp_path / "s.toml", tmp_path / "init.spore", dp, rounds=2, clients=2)
    cfg.write_text("fraction = 0.5\n" + cfg.read_text())
    server = server_factory(["--config", str(cfg)]).start()
    threads = run_clients(server.address, [common] * 4)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()
    privacy = read_status(server.state_dir)["privacy"]
    clipped = {k: common[k].astype(np.float64) * CLIP / 3.0 for k in w0}
    for v, entry in zip((1, 2), privacy["rounds"], strict=True):
        assert entry["cohort"] == 2  # half of the live clients, at least min_clients
        before, after = model_version(server.state_dir, v - 1), model_version(server.state_dir, v)
        residual = np.concatenate([(after[k] - before[k] - clipped[k]).ravel() for k in w0])
        # Each of the 2 clients adds N(0, (zC)²); the mean of two: std zC/sqrt(2).
        want_std = NOISE * CLIP / np.sqrt(2)
        assert abs(residual.std() / want_std - 1) < 0.2, (residual.std(), want_std)
    # Round 2 sampled 2 of 4 live clients, yet is charged as q = 1: the server knows who
    # took part, so local DP gets no amplification by sampling.
    started = [e for e in server.events("phase_started") if e["round"] == 2]
    assert [(e["selected"], e["live"]) for e in started] == [(2, 4)]
    assert [r["sample_rate"] for r in privacy["rounds"]] == [1.0, 1.0]
    np.testing.assert_allclose(
        [r["epsilon"] for r in privacy["rounds"]], expected_epsilons(NOISE, 1.0, 2), rtol=1e-9
    )
    assert server.terminate() == 0
