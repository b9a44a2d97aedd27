"""Resumable chunked transfers and compressed updates, against the real daemon."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
from sporenet.federated.aggregation import template_of
from sporenet.federated.common.codec import decode_update, encode_update
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import make_model, upload_raw, wait_for


def test_interrupted_upload_and_download_resume_from_their_offsets(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=600, inp=1000)  # 2.4 MB: several chunks
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "1"]
    ).start()
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)
        cid = stub.Register(pb.RegisterRequest(client_name="r"), timeout=5).client_id
        task = stub.GetTask(pb.TaskRequest(client_id=cid, wait_ms=5000), timeout=10)
        assert task.type == pb.TASK_FIT

        # Download in two calls: the second starts where the first was cut.
        first = stub.DownloadModel(
            pb.DownloadRequest(client_id=cid, model_version=task.model_version)
        )
        head = next(iter(first)).data
        first.cancel()
        rest = b"".join(
            c.data
            for c in stub.DownloadModel(
                pb.DownloadRequest(
                    client_id=cid, model_version=task.model_version, offset=len(head)
                )
            )
        )
        model = head + rest
        assert len(model) == task.model_size
        assert hashlib.sha256(model).hexdigest() == task.model_sha256

        delta = {k: np.full_like(v, 0.5) for k, v in w0.items()}
        payload = encode_update(delta)
        header = pb.UploadHeader(
            client_id=cid,
            task_id=task.task_id,
            upload_id="resume1",
            total_size=len(payload),
            sha256=hashlib.sha256(payload).hexdigest(),
            num_samples=3,
        )
        cut = 1 << 20

        def broken() -> Iterator[pb.UploadChunk]:
            yield pb.UploadChunk(header=header, offset=0, data=payload[:cut])
            raise ConnectionError("network dropped")  # the client's stream dies mid-upload

        try:
            stub.UploadUpdate(broken(), timeout=10)
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)

        # A stream that breaks may or may not have delivered its chunk before the cancel,
        # and the server notices the break after the client does: give it a moment.
        def kept() -> int:
            return int(
                stub.GetUploadOffset(
                    pb.UploadOffsetRequest(client_id=cid, upload_id="resume1"), timeout=5
                ).received
            )

        with contextlib.suppress(TimeoutError):
            wait_for(lambda: kept() == cut, timeout=2.0, what="the broken stream's chunk")
        offset = kept()
        assert offset in (0, cut)
        if offset == 0:  # a call that ends early, cleanly, keeps what it sent
            reply = stub.UploadUpdate(
                iter([pb.UploadChunk(header=header, offset=0, data=payload[:cut])]), timeout=10
            )
            assert not reply.accepted and reply.received == cut
        offset = stub.GetUploadOffset(
            pb.UploadOffsetRequest(client_id=cid, upload_id="resume1"), timeout=5
        ).received
        assert offset == cut
        # Resuming at a wrong offset is refused with the offset to use.
        try:
            upload_raw(
                stub, client_id=cid, task_id=task.task_id, payload=payload, upload_id="resume1"
            )
            raise AssertionError("a restart at offset 0 must be refused")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.OUT_OF_RANGE and f"offset {cut}" in e.details()
        rest_chunks = [
            pb.UploadChunk(header=header, offset=cut, data=payload[cut : cut + (1 << 20)]),
            pb.UploadChunk(offset=cut + (1 << 20), data=payload[cut + (1 << 20) :]),
        ]
        reply = stub.UploadUpdate(iter(rest_chunks), timeout=10)
        assert reply.accepted and reply.received == len(payload)
        done = stub.GetTask(pb.TaskRequest(client_id=cid, wait_ms=5000), timeout=10)
        assert done.type == pb.TASK_DONE
        final_bytes = b"".join(
            c.data
            for c in stub.DownloadModel(
                pb.DownloadRequest(client_id=cid, model_version=done.model_version)
            )
        )
    from sporenet.lite import read_weights

    final = read_weights(final_bytes)
    np.testing.assert_allclose(final["w"], w0["w"] + 0.5, rtol=1e-6)


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
