"""The client's secure steps without I/O (client/secure.py's SecureTasks), driven against
a real SecureRound: a round trains once at its masked input and unmasks to the mean, a
resent stage is answered byte for byte, a client that lost its secrets withdraws, and a
secure buffer's member masks its held update times the weight it is told."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sporenet.federated.client.secure import SecureTasks, trained_delta
from sporenet.federated.common.wire import SECURE_STAGES, SECURE_WEIGHT_KEY
from sporenet.federated.secagg import ProtocolError, SecAggConfig, Stage
from sporenet.federated.secagg.session import SecureRound
from sporenet.proto import federated_pb2 as pb

TEMPLATE = {"w": ((3, 4), np.dtype(np.float32)), "b": ((4,), np.dtype(np.float32))}
CLIENTS = ["a", "b", "c", "d"]


def _update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.normal(0, 0.2, shape).astype(dt) for n, (shape, dt) in TEMPLATE.items()}


def _task(r: SecureRound, cid: str, task_id: str = "r1-fit", **config: float) -> pb.Task:
    return pb.Task(
        type=pb.TASK_SECURE_FIT,
        task_id=task_id,
        secure_stage=SECURE_STAGES[r.stage.value],
        secure_setup=r.setup_payload(cid),
        secure_payload=r.payload_for(cid),
        config_json=json.dumps(config),
    )


def _zeros() -> dict[str, np.ndarray]:
    return {n: np.zeros(shape, dt) for n, (shape, dt) in TEMPLATE.items()}


def _run(r: SecureRound, tasks: dict[str, SecureTasks], masked: dict[str, object]) -> None:
    """Every client answers every stage; `masked[c]` is what `answer` is given at the
    masked-input stage (a trained update, or None for a buffer's held one)."""
    for _ in range(4):
        for c in CLIENTS:
            t = _task(r, c)
            trained = masked[c] if tasks[c].needs_training(t) else None
            reply = tasks[c].answer(t, c, lambda: TEMPLATE, trained)  # type: ignore[arg-type]
            assert not reply.withdraws and reply.header.client_id == c
            # A lost reply is rebuilt byte for byte, without training again.
            assert tasks[c].answer(t, c, lambda: TEMPLATE).body == reply.body
            r.submit(c, reply.body)
        r.close_stage()


def test_a_round_trains_once_and_unmasks_to_the_mean() -> None:
    r = SecureRound.start(SecAggConfig(), client_ids=CLIENTS, template=TEMPLATE)
    updates = {c: _update(i) for i, c in enumerate(CLIENTS)}
    tasks = {c: SecureTasks() for c in CLIENTS}
    first = _task(r, "a")
    assert not tasks["a"].needs_training(first)  # only the masked-input stage trains
    masked = {c: trained_delta(_zeros(), updates[c], 10, {"loss": 1.0}) for c in CLIENTS}
    _run(r, tasks, masked)  # type: ignore[arg-type]
    assert r.stage == Stage.COMPLETED
    delta, contributors = r.result()
    assert sorted(contributors) == CLIENTS
    for k in TEMPLATE:
        want = np.mean([updates[c][k].astype(np.float64) for c in CLIENTS], axis=0)
        np.testing.assert_allclose(delta[k], want, atol=1e-5)


def test_a_client_that_lost_its_secrets_withdraws_and_sits_out() -> None:
    r = SecureRound.start(SecAggConfig(), client_ids=CLIENTS, template=TEMPLATE)
    for c in CLIENTS:
        r.submit(c, SecureTasks().answer(_task(r, c), c, lambda: TEMPLATE).body)
    r.close_stage()  # at share keys: a fresh SecureTasks holds none of its keys
    tasks = SecureTasks()
    t = _task(r, "a")
    reply = tasks.answer(t, "a", lambda: TEMPLATE)
    assert reply.withdraws and reply.header.task_id == "r1-fit"
    assert tasks.sitting_out(t) and not tasks.needs_training(t)


def test_a_buffer_member_masks_its_held_update_times_its_weight() -> None:
    r = SecureRound.start(SecAggConfig(), client_ids=CLIENTS, template=TEMPLATE)
    updates = {c: _update(10 + i) for i, c in enumerate(CLIENTS)}
    weights = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 1.0}
    tasks = {c: SecureTasks() for c in CLIENTS}
    for c in CLIENTS:
        training = pb.Task(type=pb.TASK_FIT, task_id=f"v0-{c}", config_json="{}")
        with pytest.raises(ProtocolError, match="needs a trained update"):
            tasks[c].ready(training, c)
        ready = tasks[c].ready(training, c, trained_delta(_zeros(), updates[c], 7, {}))
        assert ready.header.stage == pb.SECURE_READY and ready.header.num_samples == 7
        assert tasks[c].holds(training)
        assert tasks[c].ready(training, c).header == ready.header  # resent, not retrained
    for _ in range(4):
        for c in CLIENTS:
            t = _task(r, c, **{SECURE_WEIGHT_KEY: weights[c]})
            assert not tasks[c].needs_training(t)
            r.submit(c, tasks[c].answer(t, c, lambda: TEMPLATE).body)
        r.close_stage()
    delta, _ = r.result()
    for k in TEMPLATE:
        want = np.mean([weights[c] * updates[c][k].astype(np.float64) for c in CLIENTS], 0)
        np.testing.assert_allclose(delta[k], want, atol=1e-5)
