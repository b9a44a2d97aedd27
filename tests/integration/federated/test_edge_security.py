"""Authentication and TLS on both hops: devices present tokens to their edge over TLS, each
edge signs its calls to the cloud with its own Ed25519 key over TLS, and the cloud knows
the edges by those identities. An edge whose key the cloud does not know exits 1."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated import Credentials
from sporenet.federated.common.auth import public_key_text
from sporenet.federated.server.status import read_status
from tests.integration.federated.edge_helpers import (
    EDGE_OF,
    SAMPLES,
    assert_every_device_has,
    fedavg_delta,
    join_all,
    run_devices_behind,
    serving,
    tier_logs,
)
from tests.integration.federated.helpers import make_model, self_signed_cert


def write_key(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return key


def secure_cloud(tmp_path: Path, keys: dict[str, Ed25519PrivateKey]) -> Path:
    cert, key = self_signed_cert()
    (tmp_path / "tls.pem").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    listed = ", ".join(f'{name} = "{public_key_text(k)}"' for name, k in keys.items())
    path = tmp_path / "cloud.toml"
    path.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 1\nmin_clients = 2\n'
        f'[tls]\ncert = "{tmp_path / "tls.pem"}"\nkey = "{tmp_path / "tls.key"}"\n'
        f"[auth]\ned25519 = {{ {listed} }}\n"
    )
    return path


def test_authenticated_tls_on_both_hops(tmp_path: Path, server_factory, edge_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    keys = {name: write_key(tmp_path / f"{name}.pem") for name in ("edge-a", "edge-b")}
    cloud = server_factory(["--config", str(secure_cloud(tmp_path, keys))]).start()
    tokens = {f"d{i}": f"token-{i}" for i in range(4)}
    edge_toml = tmp_path / "edge.toml"
    listed = ", ".join(f'{n} = "{t}"' for n, t in tokens.items())
    edge_toml.write_text(
        f'[tls]\ncert = "{tmp_path / "tls.pem"}"\nkey = "{tmp_path / "tls.key"}"\n'
        f"[auth]\ntokens = {{ {listed} }}\n"
    )
    edges = serving(
        [
            edge_factory(
                name,
                cloud.address,
                [
                    *("--config", str(edge_toml), "--min-clients", "2"),
                    *("--name", name, "--upstream-key", str(tmp_path / f"{name}.pem")),
                    *("--upstream-ca", str(tmp_path / "tls.pem")),
                ],
            )
            for name in keys
        ]
    )
    cert = (tmp_path / "tls.pem").read_bytes()
    threads, results, _ = run_devices_behind(
        edges,
        credentials=lambda i: Credentials(token=f"token-{i}", root_certificates=cert),
    )
    join_all(threads, 120, tier_logs(cloud, edges))

    delta = fedavg_delta(w0, SAMPLES, {"round": 1})
    assert_every_device_has(results, {k: w0[k] + delta[k] for k in w0})
    # The cloud knows the edges by their key ids, the edges their devices by token names.
    status = read_status(cloud.state_dir)
    assert status["rounds"][0]["num_results"] == 2
    assert sorted(e["client"] for e in cloud.events("client_registered")) == ["edge-a", "edge-b"]
    for e, edge in enumerate(edges):
        names = sorted(x["client"] for x in edge.events("client_registered"))
        assert names == [f"d{i}" for i in range(4) if EDGE_OF[i] == e]


def test_an_edge_the_cloud_cannot_authenticate_exits_1(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    known = {"edge-a": write_key(tmp_path / "edge-a.pem")}
    cloud = server_factory(["--config", str(secure_cloud(tmp_path, known))]).start()
    write_key(tmp_path / "stranger.pem")
    edge = edge_factory(
        "edge",
        cloud.address,
        [
            *("--name", "edge-a", "--upstream-key", str(tmp_path / "stranger.pem")),
            *("--upstream-ca", str(tmp_path / "tls.pem")),
        ],
    ).start()
    assert edge.proc is not None
    assert edge.proc.wait(120) == 1, edge.logs()
    assert "sporenet-edge: error: server refused the client: UNAUTHENTICATED" in edge.logs()
