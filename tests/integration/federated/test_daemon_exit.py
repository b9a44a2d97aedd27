"""What `sporenet-server` does once its job has ended: it exits 0 after the last phase
and after telling its clients, or with --keep-serving goes on answering. Real daemon
subprocesses and real Clients on loopback."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2

from sporenet.federated import Client
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import make_model, status_command, wait_for


def run_clients(address: str, n: int) -> tuple[list[threading.Thread], dict[int, object]]:
    finals: dict[int, object] = {}

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: v + 1.0 for k, v in weights.items()}, 4, {}

    def evaluate(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return 0.25, 4, {}

    def run(i: int) -> None:
        c = Client(address, train=train, evaluate=evaluate, name=f"c{i}", poll_wait=1.0)
        finals[i] = c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, finals


def test_the_daemon_exits_0_once_the_job_is_done_and_its_clients_told(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "2", "--min-clients", "2"]
    server = server_factory([*args, "--evaluate-every", "1"]).start()
    threads, finals = run_clients(server.address, 2)
    assert server.proc.wait(120) == 0, server.logs()
    for t in threads:
        t.join(30)
    # Every client got the final model before the daemon left.
    for i in range(2):
        np.testing.assert_allclose(finals[i]["w"], w0["w"] + 2.0)  # type: ignore[index]
    names = [
        json.loads(line).get("event") for line in server.logs().splitlines() if line.startswith("{")
    ]
    tail = [n for n in names if n in ("evaluation_finished", "job_finished", "job_ended_exiting")]
    assert tail[-3:] == ["evaluation_finished", "job_finished", "job_ended_exiting"], names
    assert names[-1] == "server_stopped"
    job = status_command(server.state_dir)["job"]
    assert (job["status"], job["round"], job["phase"]) == ("finished", 2, "evaluate")


def test_with_keep_serving_the_daemon_answers_after_the_job(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "2"]
    server = server_factory([*args, "--keep-serving"]).start()
    threads, finals = run_clients(server.address, 2)
    for t in threads:
        t.join(120)
    assert len(finals) == 2 and all(f is not None for f in finals.values())
    with grpc.insecure_channel(server.address) as ch:
        reply = pb_grpc.FederatedStub(ch).GetStatus(pb.StatusRequest(), timeout=10)
    assert json.loads(reply.status_json)["job"]["status"] == "finished"
    # A late client still gets the final model.
    late = Client(server.address, train=lambda w, c: (w, 1, {}), name="late", poll_wait=1.0)
    assert late.run() is not None
    late.close()
    assert server.proc.poll() is None and not server.events("job_ended_exiting")
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    assert server.terminate() == 0


def test_a_restarted_daemon_of_a_finished_job_exits_without_clients(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "1"]
    server = server_factory(args).start()
    threads, _ = run_clients(server.address, 1)
    assert server.proc.wait(120) == 0, server.logs()
    for t in threads:
        t.join(30)
    # Its one client was told and went away: a restart has nobody left to tell, but gives
    # known clients heartbeat_timeout to come back first.
    again = server_factory(["--heartbeat-timeout", "6"], name="state")
    again.start(wait=False)
    wait_for(lambda: again.proc.poll() is not None, timeout=120, what="the daemon to exit")
    assert again.proc.returncode == 0, again.logs()
    assert again.events("job_ended_exiting")[-1]["status"] == "finished"
