"""The secure buffer's state machine driven with real SecAgg+ client sessions: formed by
the first K ready devices, each scaling by the staleness weight it is told, one dropout
recovered, and the unmasked mean equal to the plain buffered result within the
fixed-point error bound; and a secure async job on a RoundManager with a fake clock:
plain uploads refused, READY devices forming the buffer, a late one left for the next."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.aggregation import WeightedMeanAggregator, template_of
from sporenet.federated.common.codec import encode_update
from sporenet.federated.errors import AggregationError, StaleTaskError
from sporenet.federated.secagg import SecAggConfig, Stage
from sporenet.federated.secagg.session import SecureClientSession
from sporenet.federated.server.async_fit import scaled
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import TaskType
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.secure_buffer import SecureBuffer
from sporenet.federated.strategies.staleness import Polynomial
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model
from tests.unit.federated.round_helpers import FakeClock

TEMPLATE = {"w": ((3, 4), np.dtype(np.float32)), "b": ((4,), np.dtype(np.float32))}
STAGES = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)


def _update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.normal(0, 0.2, shape).astype(dt) for n, (shape, dt) in TEMPLATE.items()}


def _buffer() -> SecureBuffer:
    return SecureBuffer(size=5, max_staleness=3, staleness=Polynomial(0.5))


def test_first_k_ready_form_the_buffer_and_late_or_stale_ones_wait() -> None:
    buf = _buffer()
    with pytest.raises(StaleTaskError, match="4 versions old"):
        buf.ready("old", version=6, current_version=10)
    for i, v in enumerate((10, 10, 9, 8)):
        buf.ready(f"d{i}", v, 10)
    with pytest.raises(StaleTaskError, match="already in this secure buffer"):
        buf.ready("d0", 10, 10)
    with pytest.raises(AggregationError, match="4 of its 5 members"):
        buf.form(SecAggConfig(), TEMPLATE, max_weight=100, deadline=1.0)
    buf.leave("d3")  # silent before the cohort formed: its place is free again
    buf.ready("d3", 7, 10)
    assert buf.weight_of("d3") == pytest.approx(0.5)  # (1 + 3) ** -0.5
    buf.ready("d4", 10, 10)
    with pytest.raises(StaleTaskError, match="joins the next one"):
        buf.ready("late", 10, 10)
    secure = buf.form(SecAggConfig(), TEMPLATE, max_weight=100, deadline=1.0)
    assert sorted(secure.cohort) == ["d0", "d1", "d2", "d3", "d4"]
    with pytest.raises(StaleTaskError, match="not in this secure buffer"):
        buf.weight_of("late")


def test_the_unmasked_buffer_equals_the_plain_one_with_a_dropout_and_a_restart() -> None:
    versions = {"d0": 10, "d1": 9, "d2": 10, "d3": 7, "d4": 8}
    samples = {"d0": 30, "d1": 12, "d2": 50, "d3": 7, "d4": 21}
    updates = {c: _update(i) for i, c in enumerate(versions)}
    buf = _buffer()
    for c, v in versions.items():
        buf.ready(c, v, current_version=10)
    buf.form(SecAggConfig(threshold=3), TEMPLATE, max_weight=100, deadline=1.0)
    sessions: dict[str, SecureClientSession] = {}
    dropped = "d2"  # leaves after sharing its keys: its mask is recovered from shares
    for stage in STAGES:
        assert buf.secure is not None
        rnd = buf.secure.round
        for c in rnd.pending():
            if stage == Stage.ADVERTISE_KEYS:
                sessions[c] = SecureClientSession(rnd.setup_payload(c), TEMPLATE, max_weight=100)
            if c == dropped and stage in (Stage.MASKED_INPUT, Stage.UNMASK):
                continue
            mine = scaled(updates[c], buf.weight_of(c))  # the device scales, then masks
            rnd.submit(c, sessions[c].respond(stage, rnd.payload_for(c), mine, samples[c]))
        rnd.close_stage()
        # Saved at every transition: a restarted server resumes the same buffer.
        buf = SecureBuffer.from_bytes(buf.to_bytes(), 3, Polynomial(0.5))
    mean, contributors = buf.result()
    assert sorted(contributors) == ["d0", "d1", "d3", "d4"]
    assert buf.mean_staleness(contributors) == pytest.approx((0 + 1 + 3 + 2) / 4)

    # The plain async buffer: the server scales each update by its weight and folds it.
    plain = WeightedMeanAggregator(TEMPLATE)
    staleness = Polynomial(0.5)
    for c in contributors:
        plain.add(c, scaled(updates[c], staleness.weight(10 - versions[c])), samples[c])
    want = plain.result()
    assert buf.secure is not None
    bound = buf.secure.round.server.result().error_bound
    # The weighted mean divides the sum by the (fixed-point) total weight: its error is
    # at most the sum's bound over the weights' sum, plus float32 rounding (~3e-8 here).
    total = sum(samples[c] for c in contributors) / 100
    for name in TEMPLATE:
        err = np.max(np.abs(mean[name].astype(np.float64) - want[name].astype(np.float64)))
        assert err <= 2 * bound / total + 1e-7, (name, err, bound)
        assert err > 0 or bound == 0  # it was masked and quantized, not passed through


def test_a_corrupt_saved_buffer_is_refused() -> None:
    with pytest.raises(AggregationError, match="not a secure buffer state"):
        SecureBuffer.from_bytes(b"XXXX\x00\x00\x00\x00", 3, Polynomial(0.5))
    with pytest.raises(AggregationError, match="at least 2 members"):
        SecureBuffer(size=1, max_staleness=3, staleness=Polynomial(0.5))


def test_a_secure_async_job_driven_by_hand_forms_buffers_from_ready_devices(
    tmp_path: Path, clock: FakeClock
) -> None:
    w0 = make_model(tmp_path / "init.spore")
    table = {
        "state_dir": str(tmp_path / "state"),
        "model": str(tmp_path / "init.spore"),
        "min_clients": 2,
        "rounds": 2,
        "resume_grace": 0.0,
        "job": {"mode": "async", "concurrency": 4, "buffer_size": 3},
        "secure_aggregation": {"enabled": True, "max_weight": 100},
    }
    m = RoundManager(
        build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"), clock=clock
    )
    try:
        for cid in "abcd":
            m.register(cid, None, {})
        m.tick()
        samples = {"a": 10, "b": 30, "c": 60, "d": 5}
        deltas = {
            c: {k: np.full_like(v, 0.01 * (i + 1)) for k, v in w0.items()}
            for i, c in enumerate("abcd")
        }
        training = {c: m.get_task(c) for c in "abcd"}
        assert all(t.type == TaskType.FIT and t.config["secure_buffer"] for t in training.values())
        with pytest.raises(StaleTaskError, match="takes no plain updates"):
            m.submit_update(
                "a",
                training["a"].task_id,
                memoryview(encode_update(deltas["a"])),
                upload=None,
                mismatch="",
                num_samples=10,
                metrics_json="",
            )
        for c in "abc":  # done training: a, b and c fill buffer 1
            m.submit_secure(c, training[c].task_id, "ready", b"", num_samples=samples[c])
        m.tick()
        m.submit_secure("d", training["d"].task_id, "ready", b"", num_samples=samples["d"])
        assert m.get_task("d").type == TaskType.WAIT  # buffer 1 is formed without it
        template = template_of(w0)
        sessions: dict[str, SecureClientSession] = {}
        for stage in STAGES:
            for c in "abc":
                t = m.get_task(c)
                assert t.type == TaskType.SECURE_FIT and t.secure_stage == stage.value
                if stage == Stage.ADVERTISE_KEYS:
                    sessions[c] = SecureClientSession(t.secure_setup, template, max_weight=100)
                mine = scaled(deltas[c], t.config["secure_weight"])
                reply = sessions[c].respond(stage, t.secure_payload, mine, samples[c])
                m.submit_secure(c, t.task_id, stage.value, reply, num_samples=samples[c])
            m.tick()
        assert m.job.model_version == 1
        got = read_weights((tmp_path / "state" / "models" / "v00001.spore").read_bytes())
        total = sum(samples[c] for c in "abc")
        for k, w in w0.items():
            want = w.astype(np.float64) + sum(samples[c] * deltas[c][k] for c in "abc") / total
            np.testing.assert_allclose(got[k], want, atol=1e-6)
        # d finished on version 0 while buffer 1's round ran: buffer 2's first member.
        assert m.get_task("d").reason == "waiting for the secure buffer to fill"
    finally:
        m.close()
