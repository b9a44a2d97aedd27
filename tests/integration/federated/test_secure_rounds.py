"""Secure aggregation (SecAgg+) inside the real daemon, with real Clients on loopback.

The server only ever holds masked vectors and their sum; what it publishes must equal the
plain mean of the contributors' (clipped) deltas within the fixed-point error it states.
Dropouts before and after the masked upload, a kill -9 in the middle of the masked-input
stage, and too many dropouts (the round runs again with a new cohort; with no retries
left the job fails and no model is published) are covered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.aggregation import template_of
from sporenet.federated.errors import JobFailedError
from sporenet.federated.secagg import Stage
from sporenet.federated.secagg.session import SecureClientSession
from sporenet.federated.server.state import Store
from sporenet.federated.server.status import read_status
from sporenet.lite import read_weights
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    ServerProcess,
    make_model,
    poll_task,
    upload_raw,
    wait_for,
)

# Short liveness so dropouts are noticed quickly (a stage waits heartbeat_timeout for them).
FLAGS = ["--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5", "--secure"]
CONFIG = """
[secure_aggregation]
enabled = true
clipping_range = 1.0
stage_timeout = 30
"""


def local_delta(i: int, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Client i's deterministic update: a small, client-specific delta (within the clip)."""
    return {
        k: (0.01 * (i + 1) * np.sin(np.arange(v.size) + i).reshape(v.shape)).astype(np.float64)
        for k, v in w.items()
    }


def train_for(i: int, hold: threading.Event | None = None):  # type: ignore[no-untyped-def]
    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        if hold is not None:
            hold.wait(60)
        d = local_delta(i, weights)
        return {k: weights[k] + d[k] for k in weights}, 10 + i, {"loss": float(i)}

    return train


class DroppingClient(Client):
    """A real client that vanishes (stops calling) when a given secure stage arrives."""

    def __init__(self, *args, drop_at: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.drop_at = drop_at
        self.dropped = False

    def _secure_fit(self, task: pb.Task) -> None:
        if task.secure_stage == self.drop_at:
            self.dropped = True
            self.stop()
            return
        super()._secure_fit(task)


def start_clients(
    address: str,
    n: int,
    *,
    drops: dict[int, int] | None = None,
    hold: dict[int, threading.Event] | None = None,
    first: int = 0,
) -> tuple[list[threading.Thread], dict[int, Client]]:
    """Clients c{first} .. c{first + n - 1}, running."""
    clients: dict[int, Client] = {}
    for i in range(first, first + n):
        kwargs = dict(
            train=train_for(i, (hold or {}).get(i)), name=f"c{i}", poll_wait=0.5, max_backoff=0.3
        )
        if drops and i in drops:
            clients[i] = DroppingClient(address, drop_at=drops[i], **kwargs)  # type: ignore[arg-type]
        else:
            clients[i] = Client(address, **kwargs)  # type: ignore[arg-type]
    threads = [ClientThread(c) for c in clients.values()]
    for t in threads:
        t.start()
    return threads, clients


class ClientThread(threading.Thread):
    """Runs a client; `outcome` is what `run()` returned or the exception it raised."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.outcome: object = None

    def run(self) -> None:
        try:
            self.outcome = self.client.run()
        except Exception as e:  # the test reads it
            self.outcome = e


def join(threads: list[threading.Thread], server) -> None:  # type: ignore[no-untyped-def]
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads), server.logs()[-4000:]


def fit_statuses(state_dir: Path, round_: int = 1) -> dict[str, str]:
    """Each cohort member's final status in a fit round, from the daemon's database."""
    store = Store(state_dir / "state.db")
    try:
        return {c: s for c, (s, _, _) in store.participants(round_, "fit").items()}
    finally:
        store.close()


def published(state_dir: Path, version: int) -> dict[str, np.ndarray]:
    data = (state_dir / "models" / f"v{version:05d}.spore").read_bytes()
    return {k: np.array(v) for k, v in read_weights(data).items()}


def check_mean(server, w0: dict, contributors: list[int], version: int = 1) -> None:  # type: ignore[no-untyped-def]
    """The published model is w0 + the plain mean of the contributors' deltas, within the
    stated fixed-point bound (divided by n for the mean) plus float32 rounding."""
    # The event is logged just after the version is stored, which clients may see first.
    wait_for(lambda: len(server.events("round_published")) >= version, what="round_published")
    event = server.events("round_published")[version - 1]
    bound = event["secure_error_bound"] / len(contributors)
    assert 0 < bound < 1e-3
    got = published(server.state_dir, version)
    for k, w in w0.items():
        want = w.astype(np.float64) + np.mean([local_delta(i, w0)[k] for i in contributors], 0)
        err = np.abs(got[k].astype(np.float64) - want)
        assert err.max() <= bound + 4 * np.finfo(np.float32).eps * np.abs(want).max(), (k, err)
    # A wrong contributor set would be far outside the bound: the test can tell them apart.
    outsider = next(i for i in range(max(contributors) + 2) if i not in contributors)
    other = [outsider, *contributors[1:]]
    wrong = w0["w"].astype(np.float64) + np.mean([local_delta(i, w0)["w"] for i in other], 0)
    assert np.abs(got["w"] - wrong).max() > 10 * bound


def secure_server(
    server_factory: Callable[..., ServerProcess],
    config_file: Path,
    tmp_path: Path,
    min_clients: int,
    *,
    rounds: int = 1,
    extra: list[str] | None = None,
) -> ServerProcess:
    """The daemon with secure aggregation on the model at tmp_path/init.spore, started."""
    return server_factory(
        [
            "--config",
            str(config_file),
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            str(rounds),
            "--min-clients",
            str(min_clients),
            *FLAGS,
            *(extra or []),
        ]
    ).start()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(CONFIG)
    return path


def test_secure_fedavg_rounds_equal_the_plain_mean(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 6
    server = secure_server(server_factory, config_file, tmp_path, n)
    threads, clients = start_clients(server.address, n)
    join(threads, server)
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    assert fit_statuses(server.state_dir) == {f"c{i}": "accepted" for i in range(n)}
    closed = [e["stage"] for e in server.events("secure_stage_closed")]
    assert closed == ["advertise_keys", "share_keys", "masked_input", "unmask"]
    check_mean(server, w0, list(range(n)))
    assert all(c.rounds_trained == 1 for c in clients.values())  # trained once, then masked
    # The round's metrics come from the headers of the masked uploads.
    assert status["rounds"][0]["metrics"]["num_samples"] == sum(10 + i for i in range(n))


def test_dropouts_before_and_after_the_masked_upload(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 10
    server = secure_server(server_factory, config_file, tmp_path, n)
    # c3 leaves when asked for its masked input; c7 uploads and leaves before unmasking.
    drops = {3: pb.SECURE_MASKED_INPUT, 7: pb.SECURE_UNMASK}
    threads, clients = start_clients(server.address, n, drops=drops)
    join(threads, server)
    assert clients[3].dropped and clients[7].dropped  # type: ignore[attr-defined]
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    parts = fit_statuses(server.state_dir)
    assert parts["c3"] == "dropped"
    assert parts["c7"] == "accepted"  # its self-mask was rebuilt from the survivors' shares
    contributors = [i for i in range(n) if i != 3]
    closed = {e["stage"]: e["missing"] for e in server.events("secure_stage_closed")}
    assert closed["masked_input"] == ["c3"] and closed["unmask"] == ["c7"]
    check_mean(server, w0, contributors)


def test_kill9_in_the_masked_input_stage_then_restart_completes(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 6
    server = secure_server(server_factory, config_file, tmp_path, n)
    release = threading.Event()
    threads, _ = start_clients(server.address, n, hold={5: release})

    def masked_uploads() -> int:
        return sum(s == "masked" for s in read_status(server.state_dir)["participants"].values())

    wait_for(lambda: masked_uploads() >= 3, timeout=20, what="three masked uploads")
    server.kill9()
    assert read_status(server.state_dir)["secure_stage"] == "masked_input"  # what was saved
    server.start()
    release.set()
    join(threads, server)
    restored = server.events("secure_round_restored")
    assert restored and restored[0]["stage"] == "masked_input"
    # Masked uploads since the last saved transition were lost with the process: the
    # clients resent them (byte for byte, from their sessions), so the restarted server
    # heard all n. (Counted after the restore only: the killed process may have saved a
    # message and died before logging it.)
    since = restored[0]["ts"]
    masked = [
        e
        for e in server.events("secure_message")
        if e["stage"] == "masked_input" and e["ts"] >= since
    ]
    assert len({e["client"] for e in masked}) == n
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    assert fit_statuses(server.state_dir) == {f"c{i}": "accepted" for i in range(n)}
    check_mean(server, w0, list(range(n)))


def test_a_failed_secure_round_runs_again_with_a_new_cohort(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 5  # 4 neighbours each, threshold 3
    server = secure_server(server_factory, config_file, tmp_path, n)
    # The first cohort is c0..c4, and three of them leave at the masked input: the run
    # cannot reach the threshold. c5..c7 arrive once it has started.
    drops = dict.fromkeys((0, 1, 2), pb.SECURE_MASKED_INPUT)
    first, _ = start_clients(server.address, n, drops=drops)
    wait_for(lambda: bool(server.events("phase_started")), what="the first secure run")
    late, _ = start_clients(server.address, 3, first=n)
    join(first + late, server)

    retried = server.events("secure_round_retried")
    assert [(e["round"], e["attempt"]) for e in retried] == [(1, 1)], retried
    assert "2 clients uploaded, threshold is 3" in retried[0]["reason"]
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    assert status["job"]["secure_attempt"] == 0  # reset once the round published
    cohorts = [e["selected"] for e in server.events("phase_started")]
    assert cohorts == [5, 5]
    # The first run's cohort is marked abandoned; the second's is everyone still live:
    # c3, c4 and the late three.
    parts = fit_statuses(server.state_dir)
    assert {c: parts[c] for c in ("c0", "c1", "c2")} == dict.fromkeys(
        ("c0", "c1", "c2"), "abandoned"
    )
    assert all(parts[f"c{i}"] == "accepted" for i in range(3, 8)), parts
    check_mean(server, w0, [3, 4, 5, 6, 7])
    # The second run had its own task id, so no client answered it with the first's keys.
    tasks = {e["task"] for e in server.events("secure_message")}
    assert tasks == {"r1-fit", "r1-fit-s1"}


def test_too_many_dropouts_with_no_retries_left_fail_the_job_without_a_model(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    config_file.write_text(CONFIG + "retries = 0\n")
    make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 5  # 4 neighbours each, threshold 3
    # It must still answer after the job failed (a late message is refused below).
    server = secure_server(server_factory, config_file, tmp_path, n, extra=["--keep-serving"])
    drops = dict.fromkeys((0, 1, 2), pb.SECURE_MASKED_INPUT)
    threads, _ = start_clients(server.address, n, drops=drops)
    join(threads, server)
    job = read_status(server.state_dir)["job"]
    assert job["status"] == "failed"
    assert "secure aggregation failed" in job["reason"] and "threshold is 3" in job["reason"]
    # The clients still there are told why the job failed.
    failed = [t.outcome for t in threads if isinstance(t.outcome, JobFailedError)]
    assert failed and all("threshold is 3" in str(e) for e in failed)
    assert job["model_version"] == 0
    assert not (server.state_dir / "models" / "v00001.spore").exists()
    # A message that arrives now is refused with the round's reason.
    with grpc.insecure_channel(server.address) as ch:
        header = pb.SecureHeader(
            client_id="c4", task_id="r1-fit", stage=pb.SECURE_MASKED_INPUT, total_size=1
        )
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.FederatedStub(ch).SubmitSecure(
                iter([pb.SecureChunk(header=header, data=b"x")]), timeout=5
            )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "threshold is 3" in (err.value.details() or "")


def test_weighted_secure_rounds_with_max_weight(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    """`max_weight` weights each client by min(samples, max_weight) through one more masked
    coordinate; two rounds check that every round gets a fresh secure session."""
    config_file.write_text(CONFIG + "max_weight = 12\n")
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 4  # samples 10, 11, 12, 13: weights 10/12, 11/12, 1, 1 (the last one capped)
    server = secure_server(server_factory, config_file, tmp_path, n, rounds=2)
    threads, clients = start_clients(server.address, n)
    join(threads, server)
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    assert all(c.rounds_trained == 2 for c in clients.values())
    weights = np.array([min(10 + i, 12) / 12 for i in range(n)])
    got = published(server.state_dir, 2)
    for k, w in w0.items():
        mean = sum(wt * local_delta(i, w0)[k] for i, wt in enumerate(weights)) / weights.sum()
        # Numerator and denominator each carry the fixed-point error of one round's sum.
        tol = sum(
            2 * e["secure_error_bound"] / weights.sum() * (1 + np.abs(mean).max())
            for e in server.events("round_published")
        )
        want = w.astype(np.float64) + 2 * mean
        assert (
            np.abs(got[k] - want).max() <= tol + 8 * np.finfo(np.float32).eps * np.abs(want).max()
        )
        plain = w.astype(np.float64) + 2 * np.mean([local_delta(i, w0)[k] for i in range(n)], 0)
        assert np.abs(got[k] - plain).max() > 10 * tol  # weighting made a measurable difference


def test_secure_messages_are_checked_and_mapped_to_status_codes(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    make_model(tmp_path / "init.spore", out=4, inp=8)
    server = secure_server(server_factory, config_file, tmp_path, 2)
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)
        for name in ("a", "b"):
            stub.Register(pb.RegisterRequest(client_name=name), timeout=5)
        task = poll_task(ch, "a", wait_ms=3000)
        assert task.type == pb.TASK_SECURE_FIT and task.secure_stage == pb.SECURE_ADVERTISE_KEYS
        assert task.secure_setup and not task.secure_payload

        def submit(stage: int, data: bytes, size: int | None = None) -> grpc.StatusCode:
            header = pb.SecureHeader(
                client_id="a",
                task_id=task.task_id,
                stage=stage,  # type: ignore[arg-type]
                total_size=len(data) if size is None else size,
            )
            try:
                stub.SubmitSecure(iter([pb.SecureChunk(header=header, data=data)]), timeout=5)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        assert submit(pb.SECURE_ADVERTISE_KEYS, b"not a secagg message") == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert submit(pb.SECURE_SHARE_KEYS, b"x") == grpc.StatusCode.FAILED_PRECONDITION
        assert submit(pb.SECURE_ADVERTISE_KEYS, b"x", size=10) == grpc.StatusCode.OUT_OF_RANGE
        template = template_of(read_weights((tmp_path / "init.spore").read_bytes()))
        session = SecureClientSession(task.secure_setup, template)
        reply = session.respond(Stage.ADVERTISE_KEYS, b"")
        assert submit(pb.SECURE_ADVERTISE_KEYS, reply) == grpc.StatusCode.OK
        assert submit(pb.SECURE_ADVERTISE_KEYS, reply) == grpc.StatusCode.OK  # a resend: no-op
        # A plain update in a secure round is refused: the server must never see one.
        with pytest.raises(grpc.RpcError) as err:
            upload_raw(ch, client_id="a", task_id=task.task_id, payload=b"\x00" * 64)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "secure round" in (err.value.details() or "")
        # Answered: nothing more for "a" until the stage closes ("b" has not answered).
        again = poll_task(ch, "a")
        assert again.type == pb.TASK_WAIT


@pytest.mark.parametrize(
    ("stage", "dropped"),
    [
        (pb.SECURE_ADVERTISE_KEYS, (4,)),  # 10%
        (pb.SECURE_SHARE_KEYS, (1, 5, 8)),  # 30%
        (pb.SECURE_MASKED_INPUT, (0, 2, 9)),  # 30%, before the upload: left out
        (pb.SECURE_UNMASK, (3, 6, 7)),  # 30%, after the upload: still counted
    ],
    ids=["advertise-10pct", "share-30pct", "masked-30pct", "unmask-30pct"],
)
def test_dropouts_at_each_stage(
    tmp_path: Path,
    server_factory: Callable[..., ServerProcess],
    config_file: Path,
    stage: int,
    dropped: tuple[int, ...],
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 10  # 9 neighbours each, threshold 5
    server = secure_server(server_factory, config_file, tmp_path, n)
    threads, _ = start_clients(server.address, n, drops=dict.fromkeys(dropped, stage))
    join(threads, server)
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    counted = stage == pb.SECURE_UNMASK
    contributors = [i for i in range(n) if counted or i not in dropped]
    statuses = fit_statuses(server.state_dir)
    assert statuses == {f"c{i}": "accepted" if i in contributors else "dropped" for i in range(n)}
    check_mean(server, w0, contributors)


class AmnesicClient(Client):
    """A real client that loses its secure session at the share-keys stage (as a restarted
    client process would) and keeps polling: it must withdraw rather than look alive."""

    def _secure_fit(self, task: pb.Task) -> None:
        if task.secure_stage == pb.SECURE_SHARE_KEYS:
            self._secure.reset()
        super()._secure_fit(task)


def test_a_client_that_lost_its_secrets_withdraws(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 6
    # Liveness alone would wait 20 s for it: the withdrawal is what lets the stage close.
    server = secure_server(
        server_factory, config_file, tmp_path, n, extra=["--heartbeat-timeout", "20"]
    )
    threads, _ = start_clients(server.address, n - 1)
    amnesic = AmnesicClient(
        server.address, train=train_for(n - 1), name=f"c{n - 1}", poll_wait=0.5, max_backoff=0.3
    )
    threads.append(threading.Thread(target=amnesic.run, daemon=True))
    threads[-1].start()
    t0 = time.monotonic()
    join(threads, server)
    assert time.monotonic() - t0 < 10
    assert [e["client"] for e in server.events("secure_withdrawn")] == [f"c{n - 1}"]
    assert fit_statuses(server.state_dir)[f"c{n - 1}"] == "dropped"
    assert amnesic.rounds_trained == 0
    check_mean(server, w0, list(range(n - 1)))


class HoldingClient(Client):
    """A real client that waits for `release` before answering one secure stage."""

    def __init__(self, *args, hold_at: int, release: threading.Event, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.hold_at, self.release = hold_at, release

    def _secure_fit(self, task: pb.Task) -> None:
        if task.secure_stage == self.hold_at:
            self.release.wait(60)
        super()._secure_fit(task)


@pytest.mark.parametrize(
    ("hold_at", "stage"),
    [(pb.SECURE_SHARE_KEYS, "share_keys"), (pb.SECURE_UNMASK, "unmask")],
    ids=["share_keys", "unmask"],
)
def test_kill9_in_other_stages_then_restart_completes(
    tmp_path: Path,
    server_factory: Callable[..., ServerProcess],
    config_file: Path,
    hold_at: int,
    stage: str,
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 6
    # No dropouts here: a longer liveness window keeps the held client in the round.
    server = secure_server(
        server_factory, config_file, tmp_path, n, extra=["--heartbeat-timeout", "8"]
    )
    threads, _ = start_clients(server.address, n - 1)
    release = threading.Event()
    held = HoldingClient(
        server.address,
        hold_at=hold_at,
        release=release,
        train=train_for(n - 1),
        name=f"c{n - 1}",
        poll_wait=0.5,
        max_backoff=0.3,
    )
    threads.append(threading.Thread(target=held.run, daemon=True))
    threads[-1].start()

    def answered() -> int:
        return sum(e["stage"] == stage for e in server.events("secure_message"))

    wait_for(lambda: answered() >= n - 1, timeout=20, what=f"{n - 1} {stage} messages")
    server.kill9()
    assert read_status(server.state_dir)["secure_stage"] == stage
    server.start()
    release.set()
    join(threads, server)
    assert server.events("secure_round_restored")[0]["stage"] == stage
    assert answered() >= (n - 1) + n  # the lost messages were resent after the restart
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    assert fit_statuses(server.state_dir) == {f"c{i}": "accepted" for i in range(n)}
    check_mean(server, w0, list(range(n)))


def test_a_stage_deadline_leaves_out_a_client_that_never_answers(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    # Liveness would wait 20 s: only the 1.5 s stage deadline can close the share-keys stage.
    config_file.write_text(CONFIG.replace("stage_timeout = 30", "stage_timeout = 1.5"))
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n = 6
    server = secure_server(
        server_factory, config_file, tmp_path, n, extra=["--heartbeat-timeout", "20"]
    )
    threads, _ = start_clients(server.address, n - 1)
    release = threading.Event()
    stuck = HoldingClient(
        server.address,
        hold_at=pb.SECURE_SHARE_KEYS,
        release=release,
        train=train_for(n - 1),
        name=f"c{n - 1}",
        poll_wait=0.5,
        max_backoff=0.3,
    )
    stuck_thread = threading.Thread(target=stuck.run, daemon=True)
    stuck_thread.start()
    try:
        join(threads, server)
    finally:
        release.set()
    stuck_thread.join(20)
    closed = {e["stage"]: e["missing"] for e in server.events("secure_stage_closed")}
    assert closed["share_keys"] == [f"c{n - 1}"]
    assert fit_statuses(server.state_dir)[f"c{n - 1}"] == "dropped"
    check_mean(server, w0, list(range(n - 1)))
