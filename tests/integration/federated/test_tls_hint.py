"""A plaintext client against a TLS server is told that TLS is expected, not "Socket
closed". A real `sporenet-server` with a self-signed certificate, made in the test."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client, ConfigError
from sporenet.federated.common.net import speaks_tls
from tests.integration.federated.helpers import make_model, self_signed_cert


def test_a_plaintext_client_is_told_the_server_expects_tls(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    cert, key = self_signed_cert()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    make_model(tmp_path / "init.spore")
    tls = ["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")]
    server = server_factory(["--model", str(tmp_path / "init.spore"), *tls]).start()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        raise AssertionError("a plaintext client must not get a task")

    client = Client(server.address, train=train, give_up_after=60)
    with pytest.raises(ConfigError) as info:
        client.run()
    client.close()
    message = str(info.value)
    assert f"server at {server.address} closed the connection during the handshake" in message
    assert "expects TLS" in message and "root_certificates" in message
    assert speaks_tls(server.address)
    assert server.terminate() == 0


def test_a_plaintext_server_is_not_mistaken_for_tls() -> None:
    plain = grpc.server(futures.ThreadPoolExecutor(1))
    port = plain.add_insecure_port("127.0.0.1:0")
    plain.start()
    try:
        assert not speaks_tls(f"127.0.0.1:{port}")
    finally:
        plain.stop(None)
