"""A job's security settings are part of the job: a restart with only --state-dir keeps
its authentication and TLS; one that would drop them, or whose stored settings row is
gone while its privacy or secure state is there, is refused naming what is missing."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.errors import ConfigError
from sporenet.federated.server import job_settings
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.state import Store
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    auth_config,
    make_model,
    self_signed_cert,
    status_command,
)

REG = pb.RegisterRequest(client_name="x")


def _run(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sporenet.federated.server", "--address", "127.0.0.1:0"]
    return subprocess.run(
        [*cmd, "--state-dir", str(state_dir), *args], capture_output=True, text=True, timeout=120
    )


def _register(address: str, metadata: list[tuple[str, str]] | None = None) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            pb_grpc.FederatedStub(channel).Register(REG, metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_authentication_survives_a_restart_with_only_the_state_dir(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    config = auth_config(tmp_path, Ed25519PrivateKey.generate(), {"alice": "tok"}, min_clients=2)
    server = server_factory(["--config", str(config)]).start()
    assert server.terminate() == 0
    server.args = []  # as the refusal message advises: only --state-dir
    server.start()
    assert _register(server.address) == grpc.StatusCode.UNAUTHENTICATED
    assert _register(server.address, [("authorization", "Bearer nope")]) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # The token comes back from its digest: the state dir never held the secret.
    assert _register(server.address, [("authorization", "Bearer tok")]) == grpc.StatusCode.OK
    assert b'tok"' not in (server.state_dir / "state.db").read_bytes()
    assert server.terminate() == 0

    # The Python API (and an edge) build their configuration themselves: one without the
    # job's authentication is refused, naming it.
    bare = build_config({"state_dir": str(server.state_dir), "rounds": 1, "min_clients": 2}, {})
    with pytest.raises(ConfigError, match=r"`auth` \(the job authenticates 2 identities"):
        RoundManager(bare, metrics=Metrics(), logger=logging.getLogger("test"))


def test_tls_and_mutual_tls_survive_a_restart(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    cert, key = self_signed_cert()
    client_cert, client_key = self_signed_cert("client-1")
    for name, data in [("s.pem", cert), ("s.key", key), ("c.pem", client_cert)]:
        (tmp_path / name).write_bytes(data)
    tls = ["--tls-cert", str(tmp_path / "s.pem"), "--tls-key", str(tmp_path / "s.key")]
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), *tls, "--tls-client-ca", str(tmp_path / "c.pem")]
    ).start()
    assert server.terminate() == 0
    server.args = []
    server.start()
    assert _register(server.address) == grpc.StatusCode.UNAVAILABLE  # plaintext: refused
    creds = grpc.ssl_channel_credentials(cert, client_key, client_cert)
    with grpc.secure_channel(server.address, creds) as channel:
        pb_grpc.FederatedStub(channel).Register(REG, timeout=10)
    assert server.terminate() == 0
    assert status_command(server.state_dir)["config"]["tls"]["client_ca"] == str(tmp_path / "c.pem")
    # New certificates may replace the old, but not without the client CA.
    out = _run(server.state_dir, *tls)
    assert out.returncode == 2 and "`tls.client_ca` (the job requires mutual TLS" in out.stderr


def _drop_settings_row(state_dir: Path) -> None:
    with sqlite3.connect(state_dir / "state.db") as db:
        db.execute("DELETE FROM meta WHERE key = ?", (job_settings.META_KEY,))


def test_a_lost_settings_row_with_privacy_state_refuses_to_start(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    toml = tmp_path / "job.toml"
    toml.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 4\nmin_clients = 2\n'
        "[differential_privacy]\nenabled = true\nnoise_multiplier = 0.7\nclipping_norm = 2.0\n"
    )
    server = server_factory(["--config", str(toml)]).start()
    assert server.terminate() == 0
    _drop_settings_row(server.state_dir)
    out = _run(server.state_dir)
    assert out.returncode == 2, out.stderr
    assert "has no stored job settings" in out.stderr, out.stderr
    assert "`differential_privacy` (its privacy ledger: mode 'central'" in out.stderr
    assert "`rounds` = 3 (the job last ran with 4)" in out.stderr
    # Given again, they are recorded: the next restart needs only --state-dir.
    server.args = ["--config", str(toml)]
    server.start()
    assert server.terminate() == 0
    with sqlite3.connect(server.state_dir / "state.db") as db:
        (row,) = db.execute("SELECT value FROM meta WHERE key = ?", (job_settings.META_KEY,))
    assert json.loads(row[0])["differential_privacy"]["noise_multiplier"] == 0.7


def test_a_lost_settings_row_with_secure_state_refuses_to_start(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with store.transaction() as tx:
        tx.set_secure_state(1, b"the state of a secure round in progress")
    config = build_config({"state_dir": str(tmp_path)}, {})
    with pytest.raises(ConfigError, match=r"`secure_aggregation` \(the job ran secure rounds\)"):
        job_settings.check_resumed(store, config)
    assert store.get_meta(job_settings.META_KEY) is None  # nothing recorded
    store.close()
