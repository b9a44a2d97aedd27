"""A signed request dated in the future cannot be replayed across a restart, and error
messages quote request strings only truncated, so the real status reaches the client."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.common.auth import (
    AUDIENCE,
    KEY_ID,
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    signing_payload,
)
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import auth_config, make_model, poll_task

REGISTER = "/sporenet.federated.v1.Federated/Register"


def _signed(key: Ed25519PrivateKey, ts: int, nonce: str, to: str) -> list[tuple[str, str]]:
    payload = signing_payload(REGISTER, "dev1", ts, nonce, audience=to)
    sig = base64.b64encode(key.sign(payload)).decode()
    return [
        (KEY_ID, "dev1"),
        (TIMESTAMP, str(ts)),
        (NONCE, nonce),
        (AUDIENCE, to),
        (SIGNATURE, sig),
    ]


def test_future_dated_request_replayed_after_a_restart_is_refused(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    key = Ed25519PrivateKey.generate()
    config = auth_config(tmp_path, key, {"alice": "tok-alice"}, min_clients=2)
    server = server_factory(["--config", str(config)]).start()
    # Dated 60 s ahead (inside the default 300 s skew): after a restart it is still "new".
    ts = int(time.time() * 1000) + 60_000
    metadata = _signed(key, ts, "future-nonce-0123456789", server.address)
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


def test_a_request_signed_for_one_server_is_refused_by_another(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    """Two servers (say two edges) trust the same device key: a Register captured on its
    way to one and replayed to the other, within the clock skew and with a nonce the
    other never saw, is refused because it names the first as its audience."""
    key = Ed25519PrivateKey.generate()
    config = auth_config(tmp_path, key, {"alice": "tok-alice"}, min_clients=2)
    first = server_factory(["--config", str(config)], name="first").start()
    second = server_factory(["--config", str(config)], name="second").start()
    metadata = _signed(key, int(time.time() * 1000), "captured-nonce-0123456789", first.address)
    reg = pb.RegisterRequest(client_name="x")
    with grpc.insecure_channel(first.address) as channel:
        assert pb_grpc.FederatedStub(channel).Register(reg, metadata=metadata, timeout=10)
    with grpc.insecure_channel(second.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.FederatedStub(channel).Register(reg, metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert f"signed for '{first.address}', not for this server" in info.value.details()
    # The SDK signs for the server it dials, by any of its loopback names.
    alias = second.address.replace("127.0.0.1", "localhost")
    with grpc.insecure_channel(alias) as channel:
        fresh = _signed(key, int(time.time() * 1000), "fresh-nonce-0123456789abc", alias)
        assert pb_grpc.FederatedStub(channel).Register(reg, metadata=fresh, timeout=10)
    assert first.terminate() == 0 and second.terminate() == 0
