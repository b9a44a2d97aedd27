"""Authentication (tokens, Ed25519 signed requests, replay), TLS and mutual TLS, config refusals."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated import Client
from sporenet.federated.common.auth import (
    AUDIENCE,
    KEY_ID,
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    Credentials,
    signing_payload,
)
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    auth_config,
    free_port,
    make_model,
    poll_task,
    self_signed_cert,
)

REGISTER = "/sporenet.federated.v1.Federated/Register"


def _code(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def _run_clients(clients: list[Client]) -> list[dict[str, np.ndarray] | None]:
    out: list[dict[str, np.ndarray] | None] = [None] * len(clients)

    def run(i: int) -> None:
        out[i] = clients[i].run()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _train(weights: dict[str, np.ndarray], config: dict) -> tuple:
    return {k: v + 1.0 for k, v in weights.items()}, 5, {}


def test_tokens_signatures_and_replays(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    key = Ed25519PrivateKey.generate()
    config = auth_config(tmp_path, key, {"alice": "tok-alice", "bob": "tok-bob"}, min_clients=2)
    server = server_factory(["--config", str(config)]).start()
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.FederatedStub(channel)
    reg = pb.RegisterRequest(client_name="x")

    code, msg = _code(lambda: stub.Register(reg, timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in msg
    code, msg = _code(
        lambda: stub.Register(reg, metadata=[("authorization", "Bearer nope")], timeout=5)
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED and "unknown token" in msg

    alice = [("authorization", "Bearer tok-alice")]
    assert stub.Register(reg, metadata=alice, timeout=5).client_id == "alice"
    code, msg = _code(lambda: poll_task(channel, "bob", metadata=alice))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "'alice'" in msg

    here = server.address  # the audience: the server the requests are for
    signed = Credentials(key_id="dev1", private_key=key).metadata(REGISTER, audience=here)
    assert stub.Register(reg, metadata=signed, timeout=5).client_id == "dev1"
    code, msg = _code(lambda: stub.Register(reg, metadata=signed, timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "replayed" in msg
    # Signed for another method: the signature does not verify.
    other = Credentials(key_id="dev1", private_key=key).metadata(REGISTER, audience=here)
    code, msg = _code(lambda: poll_task(channel, "dev1", metadata=other))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "bad signature" in msg
    # A key that is not the allow-listed one.
    impostor = Credentials(key_id="dev1", private_key=Ed25519PrivateKey.generate()).metadata(
        REGISTER, audience=here
    )
    code, msg = _code(lambda: stub.Register(reg, metadata=impostor, timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "bad signature" in msg
    # Correctly signed but ten minutes old.
    ts, nonce = int(time.time() * 1000) - 600_000, "0123456789abcdef0123"
    payload = signing_payload(REGISTER, "dev1", ts, nonce, audience=here)
    stale = [
        (KEY_ID, "dev1"),
        (TIMESTAMP, str(ts)),
        (NONCE, nonce),
        (AUDIENCE, here),
        (SIGNATURE, base64.b64encode(key.sign(payload)).decode()),
    ]
    code, msg = _code(lambda: stub.Register(reg, metadata=stale, timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "off the server clock" in msg
    channel.close()

    # The SDK with each scheme completes a round.
    results = _run_clients(
        [
            Client(
                server.address,
                train=_train,
                credentials=Credentials(token="tok-alice"),
                poll_wait=1.0,
            ),
            Client(
                server.address,
                train=_train,
                credentials=Credentials(key_id="dev1", private_key=key),
                poll_wait=1.0,
            ),
        ]
    )
    assert all(r is not None for r in results), server.logs()


def test_tls_and_mutual_tls(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    cert, key = self_signed_cert()
    client_cert, client_key = self_signed_cert("client-1")
    for name, data in [("server.pem", cert), ("server.key", key), ("client.pem", client_cert)]:
        (tmp_path / name).write_bytes(data)
    server = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "1",
            "--tls-cert",
            str(tmp_path / "server.pem"),
            "--tls-key",
            str(tmp_path / "server.key"),
            "--tls-client-ca",
            str(tmp_path / "client.pem"),
        ]
    ).start()
    # Plaintext to a TLS port fails; TLS without a client certificate is refused (mTLS).
    with grpc.insecure_channel(server.address) as ch:
        code, _ = _code(lambda: pb_grpc.FederatedStub(ch).GetStatus(pb.StatusRequest(), timeout=3))
        assert code == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(server.address, grpc.ssl_channel_credentials(cert)) as ch:
        code, _ = _code(lambda: pb_grpc.FederatedStub(ch).GetStatus(pb.StatusRequest(), timeout=3))
        assert code == grpc.StatusCode.UNAVAILABLE
    client = Client(
        server.address,
        train=_train,
        credentials=Credentials(
            root_certificates=cert, certificate_chain=client_cert, client_key_pem=client_key
        ),
        poll_wait=1.0,
    )
    (final,) = _run_clients([client])
    assert final is not None
    np.testing.assert_allclose(final["w"], w0["w"] + 1.0, rtol=1e-6)


def _refused(args: list[str], tmp_path: Path) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "--state-dir",
            str(tmp_path / "s"),
            "--model",
            str(tmp_path / "init.spore"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2, out.stderr
    return out.stderr


def test_insecure_and_bad_config_are_refused_at_start(tmp_path: Path) -> None:
    make_model(tmp_path / "init.spore")
    port = free_port()
    assert "`insecure` is refused" in _refused(
        ["--address", f"0.0.0.0:{port}", "--insecure"], tmp_path
    )
    assert "TLS is required" in _refused(["--address", f"0.0.0.0:{port}"], tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text('rounds = "three"\n')
    assert "`rounds` must be int" in _refused(["--config", str(bad)], tmp_path)
    bad.write_text("roudns = 3\n")
    assert "unknown key `roudns`" in _refused(["--config", str(bad)], tmp_path)
    bad.write_text('[strategy]\nname = "krum"\nnum_malicous = 1\n')
    assert "no option(s) ['num_malicous']" in _refused(["--config", str(bad)], tmp_path)
    bad.write_text("fraction = 1.5\n")
    assert "`fraction` must be in (0, 1]" in _refused(["--config", str(bad)], tmp_path)
