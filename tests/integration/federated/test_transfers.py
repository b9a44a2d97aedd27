"""Resumable chunked transfers and compressed updates, against the real daemon."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
from sporenet.federated.aggregation import template_of
from sporenet.federated.common.codec import decode_update, encode_update
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import RawSession, fit_task, make_model


def test_an_interrupted_download_resumes_from_its_offset(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore", out=600, inp=1000)  # 2.4 MB: several chunks
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "1"]
    ).start()
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)
        cid = stub.Register(pb.RegisterRequest(client_name="r"), timeout=5).client_id
        task = fit_task(ch, cid)
        request = pb.DownloadRequest(client_id=cid, model_version=task.model_version)

        # The first session takes one chunk and breaks; the second continues after it.
        first = RawSession(ch)
        first.send(pb.SessionRequest(download=request))
        head = first.receive("model").model
        first.close()
        assert head.offset == 0 and 0 < len(head.data) < task.model_size
        second = RawSession(ch)
        request.offset = len(head.data)
        rest = second.download(request)
        second.close()
    assert rest[0].offset == len(head.data)
    model = head.data + b"".join(c.data for c in rest)
    assert len(model) == task.model_size
    assert hashlib.sha256(model).hexdigest() == task.model_sha256
    assert model == (server.state_dir / "models" / "v00000.spore").read_bytes()


def test_int8_and_topk_updates_are_decoded_by_the_server(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=20, inp=50)
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "2"]
    ).start()
    rng = np.random.default_rng(0)
    deltas = [
        {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in w0.items()}
        for _ in range(2)
    ]
    compressions = [("int8",), ("topk",)]
    results: list[dict[str, np.ndarray] | None] = [None, None]

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            return {k: v + deltas[i][k] for k, v in weights.items()}, 1, {}

        c = Client(
            server.address, train=train, compression=compressions[i], topk_ratio=0.1, poll_wait=1.0
        )
        results[i] = c.run()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # What the server must have aggregated: the decoded compressed deltas, averaged.
    sent = [
        decode_update(
            encode_update(deltas[i], compression=compressions[i], topk_ratio=0.1), template_of(w0)
        )
        for i in range(2)
    ]
    for k in w0:
        want = w0[k] + (sent[0][k] + sent[1][k]) / 2
        np.testing.assert_allclose(results[0][k], want, rtol=1e-5, atol=1e-6)  # type: ignore[index]
        assert np.count_nonzero(sent[1][k]) <= int(np.ceil(0.1 * w0[k].size))
