"""The round loop is woken by the update that settles a phase, not by every update."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from sporenet.federated.common.codec import encode_update
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.rounds import RoundManager
from tests.integration.federated.helpers import make_model


def _submit(manager: RoundManager, client_id: str, task_id: str, update: bytes) -> None:
    manager.submit_update(
        client_id,
        task_id,
        memoryview(update),
        upload=None,
        mismatch="",
        num_samples=1,
        metrics_json="",
    )


def test_only_the_last_awaited_update_wakes_the_round_loop(tmp_path: Path) -> None:
    w0 = make_model(tmp_path / "init.spore")
    config = build_config(
        {
            "state_dir": str(tmp_path / "state"),
            "model": str(tmp_path / "init.spore"),
            "min_clients": 3,
            "rounds": 1,
        },
        {},
    )
    manager = RoundManager(config, metrics=Metrics(), logger=logging.getLogger("test-wake"))
    try:
        ids = [manager.register(f"c{i}", None, {}) for i in range(3)]
        manager.tick()  # three live clients: the fit phase opens for all of them
        tasks = [manager.get_task(cid) for cid in ids]
        assert [t.type for t in tasks] == ["fit"] * 3
        update = encode_update({k: np.ones_like(v) for k, v in w0.items()})
        for cid, task in zip(ids[:2], tasks[:2], strict=True):
            manager.wake.clear()
            _submit(manager, cid, task.task_id, update)
            assert not manager.wake.is_set(), "woken while a selected client had not reported"
        _submit(manager, ids[2], tasks[2].task_id, update)
        assert manager.wake.is_set(), "the update that settles the phase must wake the loop"
        manager.tick()  # and that wake-up publishes the round
        assert manager.status()["job"]["status"] == "finished"
    finally:
        manager.close()
