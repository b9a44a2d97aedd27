"""Idle clients poll with unary calls and hold no stream; the interceptor checks what a
request may act for. Real daemon on loopback, real SDK clients."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated import Client
from sporenet.federated.server.pacing import JITTER, MIN_PAUSE
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    RawSession,
    auth_config,
    free_port,
    make_model,
    register_raw,
    wait_for,
)


def _metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        name: float(value)
        for name, value in (line.split() for line in body.splitlines() if line[:1] != "#")
    }


def test_idle_clients_hold_no_stream_and_start_the_round_when_it_forms(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    port = free_port()
    # Three SDK clients and one raw one: the round starts with the third SDK client.
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "3"]
    args += ["--min-available", "4"]
    args += ["--metrics-port", str(port), "--round-timeout", "3", "--keep-serving"]
    server = server_factory(args).start()
    finals: dict[int, dict[str, np.ndarray] | None] = {}

    def train(weights: dict, config: dict) -> tuple[dict, int, dict]:
        return {k: v + 1.0 for k, v in weights.items()}, 1, {}

    def run(i: int) -> None:
        finals[i] = Client(server.address, train=train, name=f"c{i}", give_up_after=60).run()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(3)]
    for t in threads[:2]:
        t.start()
    # Two of four: the round cannot start, and the clients poll without a stream.
    wait_for(lambda: _metrics(port)["sporenet_polls_total"] >= 8, what="idle polls")
    seen, since = _metrics(port), time.monotonic()
    assert seen["sporenet_clients_registered"] == 2
    assert seen["sporenet_sessions_open"] == 0, seen
    # At the server's pace: no faster than its shortest pause allows (a bound that holds
    # on any machine: a slower one polls less often).
    wait_for(lambda: _metrics(port)["sporenet_polls_total"] >= seen["sporenet_polls_total"] + 8)
    polls = _metrics(port)["sporenet_polls_total"] - seen["sporenet_polls_total"]
    fastest = 2 / (MIN_PAUSE * (1 - JITTER))  # polls per second of two clients
    assert polls <= fastest * (time.monotonic() - since) + 2, polls

    with grpc.insecure_channel(server.address) as channel:
        (raw,) = register_raw(channel, ["raw"])
        task = pb_grpc.FederatedStub(channel).Poll(pb.TaskRequest(client_id=raw), timeout=10)
        assert task.type == pb.TASK_WAIT and task.reason == "waiting"
        # A round forms: the pause is short, and jittered around a quarter of a second.
        assert 0 < task.retry_after_ms <= 1000, task

        threads[2].start()
        while threads[2].is_alive():  # the raw client takes its part in the round, too
            task = pb_grpc.FederatedStub(channel).Poll(
                pb.TaskRequest(client_id=raw, wait_ms=1000), timeout=10
            )
            if task.type == pb.TASK_FIT:
                break
        assert task.type == pb.TASK_FIT
        # The task's model comes over a Session; the raw client then sends no update, so
        # the round closes without it at its deadline: the others are done before.
        session = RawSession(channel)
        request = pb.DownloadRequest(client_id=raw, model_version=task.model_version)
        assert sum(len(c.data) for c in session.download(request)) == task.model_size
        session.close()
        for t in threads:
            t.join(120)
        assert all(finals[i] is not None for i in range(3)), finals
        for i in range(3):
            np.testing.assert_allclose(finals[i]["w"], w0["w"] + 1.0, rtol=1e-6)  # type: ignore[index]
        task = pb_grpc.FederatedStub(channel).Poll(pb.TaskRequest(client_id=raw), timeout=10)
        assert task.type == pb.TASK_DONE
    wait_for(lambda: _metrics(port)["sporenet_sessions_open"] == 0, what="sessions closed")


def test_the_interceptor_lets_a_call_act_only_for_its_own_client(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    config = auth_config(tmp_path, Ed25519PrivateKey.generate(), {"alice": "tok"}, min_clients=2)
    server = server_factory(["--config", str(config)]).start()
    alice = [("authorization", "Bearer tok")]
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.FederatedStub(channel)
        assert stub.Register(pb.RegisterRequest(), metadata=alice, timeout=10).client_id == "alice"
        assert stub.Poll(pb.TaskRequest(client_id="alice"), metadata=alice, timeout=10).type == (
            pb.TASK_WAIT
        )
        for call, request in (
            (stub.Poll, pb.TaskRequest(client_id="dev1")),
            (stub.ReportEvaluation, pb.EvaluationReport(client_id="dev1", task_id="t")),
        ):
            try:
                call(request, metadata=alice, timeout=10)
                raise AssertionError(f"{request} was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
                assert e.details() == (
                    "authenticated as 'alice' but the request names client 'dev1'"
                ), e.details()
        # A message naming alice first and someone else after: refused too.
        twice = (
            pb.TaskRequest(client_id="alice").SerializeToString()
            + pb.TaskRequest(client_id="dev1").SerializeToString()
        )
        poll = channel.unary_unary(
            "/sporenet.federated.v1.Federated/Poll", response_deserializer=pb.Task.FromString
        )
        try:
            poll(twice, metadata=alice, timeout=10)
            raise AssertionError("a poll naming two clients was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'dev1'" in e.details()


def test_a_session_acts_for_the_one_client_it_first_names(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    server = server_factory(["--model", str(tmp_path / "init.spore"), "--min-clients", "3"])
    server.start()
    with grpc.insecure_channel(server.address) as channel:
        first, second = register_raw(channel, ["c1", "c2"])
        session = RawSession(channel)
        assert session.poll(first).type == pb.TASK_WAIT
        session.send(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(client_id=second)))
        code, details = session.refusal()
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert details == f"this stream acts for client {first!r}; a request names {second!r}"


def test_a_held_poll_keeps_its_client_live(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--min-clients", "2"]
    server = server_factory([*args, "--heartbeat-timeout", "1", "--heartbeat-interval", "0.2"])
    server.start()
    with grpc.insecure_channel(server.address) as channel:
        (first,) = register_raw(channel, ["c1"])
        stub = pb_grpc.FederatedStub(channel)
        held: dict[str, pb.Task] = {}
        poll = threading.Thread(
            target=lambda: held.__setitem__(
                "task", stub.Poll(pb.TaskRequest(client_id=first, wait_ms=4000), timeout=10)
            )
        )
        poll.start()
        # Longer than heartbeat_timeout into the hold, the second client arrives: the
        # round starts only if the held client still counts as live.
        time.sleep(1.5)
        (second,) = register_raw(channel, ["c2"])
        stub.Poll(pb.TaskRequest(client_id=second), timeout=10)
        poll.join(10)
        assert held["task"].type == pb.TASK_FIT, held
