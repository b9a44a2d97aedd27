"""Malformed, oversized, non-finite, wrongly shaped updates: INVALID_ARGUMENT, aggregate intact."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.common.codec import encode_update
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import fit_task, make_model, upload_raw, wait_for


def _expect_invalid(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert match in info.value.details(), info.value.details()


def test_bad_updates_are_refused_and_never_reach_the_aggregate(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    server = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "2",
            "--min-available",
            "4",
            "--max-update-norm",
            "1000",
        ]
    ).start()
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.FederatedStub(channel)
    bad = [
        stub.Register(pb.RegisterRequest(client_name=f"bad{i}"), timeout=10).client_id
        for i in range(2)
    ]

    release = threading.Event()
    results: dict[int, dict[str, np.ndarray] | None] = {}

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            release.wait(30)  # keep the round open while the bad clients misbehave
            return {k: v + (i + 1) for k, v in weights.items()}, 10 * (i + 1), {}

        c = Client(server.address, train=train, name=f"good{i}", poll_wait=1.0)
        results[i] = c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    task = fit_task(channel, bad[0])
    fit_task(channel, bad[1])
    good = {"w": np.ones((3, 4), np.float32), "b": np.ones(3, np.float32)}

    def send(cid: str, payload: bytes, **kw: object) -> object:
        return upload_raw(channel, client_id=cid, task_id=task.task_id, payload=payload, **kw)  # type: ignore[arg-type]

    # Three refusals for the first bad client: garbage, wrong shape, NaN.
    _expect_invalid(
        lambda: send(bad[0], b"\xff\x00 not a bundle", upload_id="a"), "not a valid TensorBundle"
    )
    wrong_shape = encode_update({"w": np.ones((4, 3), np.float32), "b": good["b"]})
    _expect_invalid(
        lambda: send(bad[0], wrong_shape, upload_id="b"),
        "expected float32[3, 4], got float32[4, 3]",
    )
    nan = encode_update({"w": np.full((3, 4), np.nan, np.float32), "b": good["b"]})
    _expect_invalid(lambda: send(bad[0], nan, upload_id="c"), "NaN or infinite")
    # ...after which it sits out the round.
    with pytest.raises(grpc.RpcError) as info:
        send(bad[0], encode_update(good), upload_id="d")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # The second: declared oversized, more bytes than declared, a missing tensor, a huge norm.
    _expect_invalid(lambda: send(bad[1], b"x" * 100, upload_id="e", total_size=10**9), "at most")
    _expect_invalid(
        lambda: send(bad[1], encode_update(good) + b"\x00" * 64, upload_id="f", total_size=10),
        "more than the 10 bytes",
    )
    _expect_invalid(
        lambda: send(bad[1], encode_update({"w": good["w"]}), upload_id="g"), "missing ['b']"
    )
    status = read_status(server.state_dir)
    assert status["participants"] == {
        "bad0": "rejected",
        "bad1": "rejected",
        "good0": "selected",
        "good1": "selected",
    }

    release.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), server.logs()
    # The aggregate holds only the two good updates: (10·1 + 20·2) / 30 added to w0.
    shift = (10 * 1 + 20 * 2) / 30
    for k, v in w0.items():
        np.testing.assert_allclose(results[0][k], v + shift, rtol=1e-6)  # type: ignore[index]
    wait_for(lambda: read_status(server.state_dir)["job"]["status"] == "finished", what="job end")
    assert read_status(server.state_dir)["rounds"][0]["num_results"] == 2
    channel.close()


def test_norm_bound_refuses_large_updates(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    server = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "1",
            "--max-update-norm",
            "1.0",
        ]
    ).start()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.FederatedStub(channel)
        cid = stub.Register(pb.RegisterRequest(client_name="x"), timeout=10).client_id
        task = fit_task(channel, cid)
        big = encode_update({"w": np.ones((3, 4), np.float32), "b": np.ones(3, np.float32)})
        _expect_invalid(
            lambda: upload_raw(channel, client_id=cid, task_id=task.task_id, payload=big),
            "exceeds the bound max_update_norm=1",
        )
        small = encode_update({"w": np.full((3, 4), 0.1, np.float32), "b": np.zeros(3, np.float32)})
        reply = upload_raw(
            channel, client_id=cid, task_id=task.task_id, payload=small, upload_id="ok"
        )
        assert reply.accepted  # type: ignore[attr-defined]
