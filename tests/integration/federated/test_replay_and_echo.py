"""A signed request dated in the future cannot be replayed across a restart, and error
messages quote request strings only truncated, so the real status reaches the client."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.common.auth import KEY_ID, NONCE, SIGNATURE, TIMESTAMP, signing_payload
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import auth_config, make_model, poll_task

REGISTER = "/sporenet.federated.v1.Federated/Register"


def _signed(key: Ed25519PrivateKey, ts: int, nonce: str) -> list[tuple[str, str]]:
    sig = base64.b64encode(key.sign(signing_payload(REGISTER, "dev1", ts, nonce))).decode()
    return [(KEY_ID, "dev1"), (TIMESTAMP, str(ts)), (NONCE, nonce), (SIGNATURE, sig)]


def test_future_dated_request_replayed_after_a_restart_is_refused(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    key = Ed25519PrivateKey.generate()
    config = auth_config(tmp_path, key, {"alice": "tok-alice"}, min_clients=2)
    server = server_factory(["--config", str(config)]).start()
    # Dated 60 s ahead (inside the default 300 s skew): after a restart it is still "new".
    metadata = _signed(key, int(time.time() * 1000) + 60_000, "future-nonce-0123456789")
    reg = pb.RegisterRequest(client_name="x")
    with grpc.insecure_channel(server.address) as channel:
        assert pb_grpc.FederatedStub(channel).Register(reg, metadata=metadata, timeout=10)
    assert server.terminate() == 0
    server.start()
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.FederatedStub(channel).Register(reg, metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "replayed" in info.value.details()
    assert server.terminate() == 0


def test_a_long_client_id_gets_its_real_status(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    server = server_factory(["--model", str(tmp_path / "init.spore")]).start()
    long_id = "x" * 10_000
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
        poll_task(channel, long_id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()
    details = info.value.details()
    assert "is not registered" in details and "(10000 characters)" in details
    assert len(details) < 300
    assert server.terminate() == 0
