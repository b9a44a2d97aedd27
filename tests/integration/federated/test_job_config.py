"""Strategy settings reach clients, the live status RPC, and a job that never gets its clients."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client, JobFailedError
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import make_model, wait_for


def test_fedprox_mu_and_fit_config_reach_clients(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    (tmp_path / "server.toml").write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 1\nmin_clients = 2\n'
        '[strategy]\nname = "fedprox"\nproximal_mu = 0.25\n[fit_config]\nlr = 0.5\n'
    )
    # --keep-serving: GetStatus is polled while the (quick) job may already be over.
    server = server_factory(["--config", str(tmp_path / "server.toml"), "--keep-serving"]).start()
    configs: list[dict] = []
    finals: list[dict[str, np.ndarray] | None] = [None, None]

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            configs.append(config)
            # A proximal step toward the global weights, using what the server sent.
            target = {k: v + (i + 1) for k, v in weights.items()}
            mu, lr = config["proximal_mu"], config["lr"]
            return (
                {k: weights[k] + lr * (target[k] - weights[k]) / (1 + mu) for k in weights},
                1,
                {},
            )

        finals[i] = Client(server.address, train=train, name=f"p{i}", poll_wait=1.0).run()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)
        wait_for(
            lambda: (
                json.loads(stub.GetStatus(pb.StatusRequest(), timeout=5).status_json)[
                    "clients_registered"
                ]
                == 2
            ),
            what="two registered clients",
        )
    for t in threads:
        t.join(30)
    assert [c["proximal_mu"] for c in configs] == [0.25, 0.25]
    assert all(c["lr"] == 0.5 and c["round"] == 1 and c["rounds"] == 1 for c in configs)
    shift = 0.5 * (1 + 2) / 2 / 1.25  # mean over the two clients of lr·(i+1)/(1+mu)
    np.testing.assert_allclose(finals[0]["w"], w0["w"] + shift, rtol=1e-6)  # type: ignore[index]


def test_wait_timeout_fails_the_job_instead_of_hanging(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--min-clients", "3", "--wait-timeout", "1"]
    ).start()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        raise AssertionError("no round may start with one of three clients")

    client = Client(server.address, train=train, poll_wait=1.0)
    with pytest.raises(JobFailedError, match="wait_timeout=1 s"):
        client.run()  # told the job failed, not left polling
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "failed"
    assert (
        "only 1 of min_clients=3 clients connected within wait_timeout=1 s"
        in status["job"]["reason"]
    )
    assert server.proc.wait(60) == 1  # a failed job's daemon exits 1 once its client knows
