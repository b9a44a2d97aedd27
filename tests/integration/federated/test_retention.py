"""Model retention: `[storage] keep_models` keeps the newest versions (plus the initial
one) and optimizer state for the latest only, and a `kill -9` mid-job still resumes.

A real `sporenet-server` subprocess with FedAdam (it has optimizer moments) and real
Clients on loopback; the published model is checked against the strategy run in-process.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from sporenet.federated.strategies import make_strategy
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model, wait_for

ROUNDS = 5


def files_in(models: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(models.iterdir())}


def test_old_versions_and_moments_are_deleted_and_a_restart_resumes(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=32, inp=32)
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = {ROUNDS}\nmin_clients = 2\n'
        'checkpoint_every = 1\n[strategy]\nname = "fedadam"\n[storage]\nkeep_models = 2\n'
    )
    server = server_factory(["--config", str(cfg)]).start()
    rng = np.random.default_rng(5)
    deltas = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in w0.items()}]
    deltas.append({k: -0.5 * d for k, d in deltas[0].items()})
    hold = threading.Event()

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if i == 0 and config["round"] == 4:
                hold.wait(60)  # keeps round 4 open while the server is killed
            return {k: w + deltas[i][k] for k, w in weights.items()}, 10, {}

        c = Client(server.address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.3)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()

    def round4_has_one_update() -> bool:
        s = read_status(server.state_dir)
        return s["job"]["round"] == 4 and s["participants"].get("c1") == "accepted"

    models = server.state_dir / "models"
    # (Files are pruned right after the store records a version, outside its transaction.)
    wait_for(
        lambda: round4_has_one_update() and not (models / "v00001.spore").exists(),
        timeout=120,
        what="round 4 with c1's update, v1 pruned",
    )
    model_size = (models / "v00000.spore").stat().st_size
    # v3 is the latest: it and v2 are kept, v1 deleted; moments only for v3.
    assert sorted(files_in(models)) == [
        "v00000.spore",
        "v00002.spore",
        "v00003.opt.npz",
        "v00003.spore",
    ]
    server.kill9()
    server.start()
    hold.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()
    assert server.proc.wait(60) == 0  # the daemon exits once the job is done and pruned
    assert read_status(server.state_dir)["job"]["status"] == "finished"

    on_disk = files_in(models)
    assert sorted(on_disk) == ["v00000.spore", "v00004.spore", "v00005.opt.npz", "v00005.spore"]
    moments = on_disk["v00005.opt.npz"]
    assert sum(on_disk.values()) == 3 * model_size + moments  # not 6 models and 5 moments
    removed = [e["models_removed"] for e in server.events("round_published")]
    assert [v for r in removed for v in r] == [1, 2, 3]
    # The restarted round 4 used v3's moments: the model is FedAdam's, step for step.
    strategy = make_strategy("fedadam", {})
    weights = {k: v.copy() for k, v in w0.items()}
    state: dict[str, np.ndarray] = {}
    for _ in range(ROUNDS):
        # Each client's delta as it computes it: float32 (w + d) - w.
        sent = [{k: (weights[k] + d[k]) - weights[k] for k in w0} for d in deltas]
        mean = {k: (sent[0][k].astype(np.float64) + sent[1][k]) / 2 for k in w0}
        new, state = strategy.apply(weights, mean, state)
        weights = {k: np.asarray(v, np.float32) for k, v in new.items()}
    final = read_weights((models / "v00005.spore").read_bytes())
    for k in w0:
        np.testing.assert_allclose(final[k], weights[k], rtol=1e-5, atol=1e-6)
