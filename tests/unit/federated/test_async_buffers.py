"""Buffered asynchronous jobs driven by hand with a fake clock: staleness-weighted
buffers, one version per buffer, in-flight devices carried over, restart recovery."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.common.codec import encode_update
from sporenet.federated.errors import ConfigError, StaleTaskError
from sporenet.federated.server.config import build_config
from sporenet.federated.server.hierarchy import edge_refusal
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import JobStatus, Participant, TaskType
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.status import read_status
from sporenet.federated.server.status_view import phase_in_words
from sporenet.federated.strategies.staleness import STALENESS, make_staleness
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model
from tests.unit.federated.round_helpers import FakeClock

Start = Callable[..., RoundManager]


@pytest.fixture
def w0(tmp_path: Path) -> dict[str, np.ndarray]:
    return make_model(tmp_path / "init.spore")


@pytest.fixture
def start(tmp_path: Path, w0: dict, clock: FakeClock) -> Iterator[Start]:
    made: list[RoundManager] = []

    def make(
        clients: str = "",
        checkpoint_every: int = 16,
        dp: dict | None = None,
        delta: float = 1e-5,
        **job: object,
    ) -> RoundManager:
        table: dict[str, object] = {
            "checkpoint_every": checkpoint_every,
            "state_dir": str(tmp_path / "state"),
            "model": str(tmp_path / "init.spore"),
            "min_clients": 1,
            "rounds": 3,
            "resume_grace": 0.0,
            "heartbeat_timeout": 30.0,
            "round_timeout": 600.0,
            "job": {"mode": "async", "concurrency": 2, "buffer_size": 2, **job},
        }
        if dp is not None:
            table["differential_privacy"] = {**dp, "delta": delta}
        m = RoundManager(
            build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"), clock=clock
        )
        made.append(m)
        for cid in clients:
            m.register(cid, None, {})
        m.tick()
        return m

    yield make
    for m in made:
        m.close()


def upload(m: RoundManager, cid: str, value: float, samples: int, w0: dict) -> None:
    """`cid` answers the fit task it holds with a delta of `value` everywhere, and is told
    it was accepted (its batch committed first, as the session does)."""
    task = m.get_task(cid)
    assert task.type == TaskType.FIT, task
    delta = {k: np.full_like(v, value) for k, v in w0.items()}
    m.submit_update(
        cid,
        task.task_id,
        memoryview(encode_update(delta)),
        upload=None,
        mismatch="",
        num_samples=samples,
        metrics_json='{"loss": 1.0}',
    )
    m.commit()


def published(tmp_path: Path, version: int) -> dict[str, np.ndarray]:
    return read_weights((tmp_path / "state" / "models" / f"v{version:05d}.spore").read_bytes())


def test_staleness_weights_are_a_table_with_checked_options() -> None:
    assert sorted(STALENESS) == ["constant", "hinge", "polynomial"]
    assert make_staleness("constant", {}).weight(9) == 1.0
    assert make_staleness("polynomial", {"exponent": 0.5}).weight(3) == pytest.approx(0.5)
    hinge = make_staleness("hinge", {"slope": 2.0, "cutoff": 1})
    assert hinge.weight(1) == 1.0 and hinge.weight(3) == pytest.approx(1 / 5)
    with pytest.raises(ConfigError, match=r"unknown `job\.staleness\.name` 'cubic'"):
        make_staleness("cubic", {})
    with pytest.raises(ConfigError, match=r"unknown key `job\.staleness\.a`"):
        make_staleness("polynomial", {"a": 1})


def test_async_settings_are_checked_and_what_they_do_not_combine_with_is_refused(
    tmp_path: Path,
) -> None:
    base = {"state_dir": str(tmp_path), "job": {"mode": "async"}}
    config = build_config(base, {"concurrency": 7, "buffer_size": 3})
    assert config.job.is_async and (config.job.concurrency, config.job.buffer_size) == (7, 3)
    assert build_config({"state_dir": str(tmp_path)}, {"async": True}).job.is_async
    with pytest.raises(ConfigError, match=r"`job\.mode` must be one of \['sync', 'async'\]"):
        build_config({"state_dir": str(tmp_path), "job": {"mode": "later"}}, {})
    with pytest.raises(ConfigError, match=r"`job\.buffer_size` must be >= 1, got 0"):
        build_config(base, {"buffer_size": 0})
    with pytest.raises(ConfigError, match="`evaluate_every` must be 0"):
        build_config({**base, "evaluate_every": 2}, {})
    secure = {**base, "secure_aggregation": {"enabled": True}}
    assert build_config(secure, {}).secure_aggregation is not None  # secure buffers
    with pytest.raises(ConfigError, match=r"`job\.buffer_size` must be >= 2 with secure"):
        build_config(secure, {"buffer_size": 1})
    dp = {"enabled": True, "mode": "distributed"}
    with pytest.raises(ConfigError, match="both `secure_aggregation` and `differential_priv"):
        build_config({**secure, "differential_privacy": dp}, {})
    assert "asynchronous" in edge_refusal(config)
    # the versions a device may still train on stay on disk
    assert config.keep_models == 3 and config.models_kept == 12
    assert build_config({**base, "storage": {"keep_models": 0}}, {}).models_kept == 0


def test_a_full_buffer_publishes_the_staleness_weighted_mean_and_carries_the_rest(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    # constant staleness: buffer 1 is the plain weighted mean of "a" and "b"
    m = start("abc", concurrency=3, staleness={"name": "polynomial", "exponent": 1.0})
    assert sorted(m.clients.with_status(Participant.SELECTED)) == ["a", "b", "c"]
    assert m.get_task("c").task_id == "v0-async"
    upload(m, "a", 1.0, 10, w0)
    upload(m, "b", 4.0, 30, w0)
    m.tick()
    assert m.job.model_version == 1 and m.job.round == 2 and m.job.active
    first = (10 * 1.0 + 30 * 4.0) / 40
    for k, v in w0.items():
        np.testing.assert_allclose(published(tmp_path, 1)[k], v + first, rtol=1e-6)
    # "c" still trains on version 0 and is carried into buffer 2; "a" and "b" get new tasks
    assert m.clients.status("c") == Participant.SELECTED
    m.tick()
    assert m.get_task("a").task_id == "v1-async" and m.get_task("c").task_id == "v0-async"
    upload(m, "c", 2.0, 10, w0)  # one version stale: weight 1 / (1 + 1)
    upload(m, "a", 3.0, 10, w0)
    m.tick()
    assert m.job.model_version == 2
    second = (10 * 2.0 * 0.5 + 10 * 3.0) / 20
    for k, v in w0.items():
        np.testing.assert_allclose(published(tmp_path, 2)[k], v + first + second, rtol=1e-5)
    rows = m.store.rounds()
    assert [r["num_results"] for r in rows] == [2, 2, 0]  # buffer 3 is open
    assert rows[1]["metrics"]["staleness"] == pytest.approx(0.5)


def test_updates_staler_than_max_staleness_are_refused_and_the_device_let_go(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("abc", concurrency=3, buffer_size=1, max_staleness=0)
    old = m.get_task("c")
    upload(m, "a", 1.0, 10, w0)
    m.tick()  # version 1: "c" (on version 0) is now too stale and is not carried
    assert m.job.model_version == 1 and m.clients.status("c") is None
    with pytest.raises(StaleTaskError, match="is not open"):
        m.submit_update(
            "c",
            old.task_id,
            memoryview(encode_update({k: np.zeros_like(v) for k, v in w0.items()})),
            upload=None,
            mismatch="",
            num_samples=1,
            metrics_json="{}",
        )
    assert not m.heartbeat("c", old.task_id)


def test_silent_devices_free_their_slot_for_another(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("abc", concurrency=2, buffer_size=2)
    busy = sorted(m.clients.with_status(Participant.SELECTED))
    (idle,) = set("abc") - set(busy)
    clock.advance(31)
    m.touch(busy[1])
    m.touch(idle)
    m.tick()
    assert m.clients.status(busy[0]) == Participant.DROPPED
    assert m.clients.status(idle) == Participant.SELECTED  # the freed slot
    assert m.get_task(idle).type == TaskType.FIT


def test_a_restart_mid_buffer_loses_no_accepted_update_and_folds_none_twice(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("abc", concurrency=3, buffer_size=3, checkpoint_every=1)
    upload(m, "a", 1.0, 10, w0)  # checkpointed
    m.close()  # as after kill -9: nothing more is written
    again = start("", concurrency=3, buffer_size=3, checkpoint_every=1)
    for cid in "abc":
        again.touch(cid)
    assert again.clients.status("a") == Participant.ACCEPTED
    with pytest.raises(StaleTaskError):  # "a" answered already: not folded twice
        again.submit_update(
            "a",
            "v0-async",
            memoryview(encode_update({k: np.ones_like(v) for k, v in w0.items()})),
            upload=None,
            mismatch="",
            num_samples=10,
            metrics_json="{}",
        )
    upload(again, "b", 4.0, 10, w0)
    upload(again, "c", 7.0, 20, w0)
    again.tick()
    assert again.job.model_version == 1
    mean = (10 * 1.0 + 10 * 4.0 + 20 * 7.0) / 40
    for k, v in w0.items():
        np.testing.assert_allclose(published(tmp_path, 1)[k], v + mean, rtol=1e-6)


def test_the_job_ends_after_its_last_buffer(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("ab", buffer_size=1)
    for version in range(3):
        cid = sorted(m.clients.with_status(Participant.SELECTED))[0]
        upload(m, cid, 1.0, 1, w0)
        m.tick()
        assert m.job.model_version == version + 1
        m.tick()
    assert m.job.status == JobStatus.FINISHED and m.get_task("a").type == TaskType.DONE


def test_dp_charges_each_buffer_as_an_unsampled_gaussian_as_dp_accounting_does(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    """Which devices fill a buffer depends on who finishes first, not on a uniform random
    sample, so no amplification by sampling is claimed: each published buffer is charged
    as one Gaussian mechanism (q = 1) with the job's noise multiplier, checked against
    Google's dp-accounting (PLD, replace-one adjacency)."""
    dpa = pytest.importorskip("dp_accounting", reason="dp-accounting is a test extra")
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    z, delta = 2.0, 1e-5
    dp = {"enabled": True, "mode": "central", "noise_multiplier": z, "clipping_norm": 1.0}
    m = start("abcdefgh", concurrency=4, buffer_size=2, dp=dp, delta=delta)
    for _ in range(3):
        busy = sorted(m.clients.with_status(Participant.SELECTED))
        for cid in busy[:2]:
            upload(m, cid, 0.1, 5, w0)
        m.tick()
        m.tick()
    assert m.job.model_version == 3 and m.job.status == JobStatus.FINISHED
    spent = m.store.get_meta("privacy")
    assert [r["sample_rate"] for r in spent["rounds"]] == [1.0, 1.0, 1.0]
    assert [r["cohort"] for r in spent["rounds"]] == [2, 2, 2]
    pld = pld_privacy_accountant.PLDAccountant(
        dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
    )
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 3))
    exact = float(pld.get_epsilon(delta))
    # RDP's conversion bounds the exact (PLD) epsilon from above, not far above it.
    assert exact <= spent["epsilon"] <= 1.35 * exact, (spent["epsilon"], exact)
    # A uniform sample of 2 out of 8 would have been charged far less: not claimed.
    sampled = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    event = dpa.SampledWithoutReplacementDpEvent(8, 2, dpa.GaussianDpEvent(z / 2))
    sampled.compose(dpa.SelfComposedDpEvent(event, 3))
    assert float(sampled.get_epsilon(delta)) < exact


def test_the_status_says_which_buffer_fills(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("abc", concurrency=3, buffer_size=2)
    upload(m, "a", 1.0, 10, w0)
    assert phase_in_words(read_status(tmp_path / "state"), clock.now) == (
        "buffer 1 of 3 (asynchronous, on version 0): 1 of 2 updates in, 2 devices training"
    )


def test_a_silence_limit_that_moves_earlier_is_still_checked(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    # The tick skips its pass over the training devices until one may be dropped; a last
    # call noted later than it happened (a restart's grace) must not hide a silence.
    m = start("a", concurrency=1, buffer_size=1)
    now = clock()
    m.clients.seen("a", now + 100)  # as a restart notes every client
    m.tick()  # scanned: "a" may not be dropped before now + 130
    assert m.clients.status("a") == Participant.SELECTED
    m.clients.seen("a", now + 5)  # "a" called then after all: silent after now + 35
    clock.advance(36)
    m.tick()
    assert m.clients.status("a") == Participant.DROPPED


def test_an_update_wakes_the_round_loop_only_when_there_is_work_for_it(
    w0: dict, start: Start
) -> None:
    # Every device trains (concurrency 3 of 3): an update that leaves the buffer short has
    # no slot to give and nothing to close, so the round loop is not woken for it.
    m = start("abc", concurrency=3, buffer_size=2)
    assert sorted(m.context.phase.assigned) == ["a", "b", "c"]
    m.wake.clear()
    upload(m, "a", 1.0, 10, w0)
    assert not m.wake.is_set()
    upload(m, "b", 1.0, 10, w0)  # the buffer is full: it closes on the next tick
    assert m.wake.is_set()
    m.tick()
    assert m.job.model_version == 1
    # An idle device (d, registered, not training) may take the slot an update frees.
    m.register("d", None, {})
    m.wake.clear()
    upload(m, "c", 1.0, 10, w0)
    assert m.wake.is_set()
    m.tick()
    assert "d" in m.context.phase.assigned
