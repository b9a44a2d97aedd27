"""The edge's configuration (edge.toml, flags, [upstream]) and the cloud's refusals of an
edge: each bad setting gets a ConfigError naming the key, each refused job says why."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.common.auth import KEY_ID, NONCE, SIGNATURE, TIMESTAMP, signing_payload
from sporenet.federated.edge.cli import main
from sporenet.federated.edge.config import build_edge_config, load_edge_config
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import build_config
from sporenet.federated.server.hierarchy import edge_refusal, is_edge


def config(values: dict[str, Any], upstream: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    base = {"state_dir": "s", **values}
    return build_edge_config(base, {}, upstream if upstream is not None else {})


def test_a_minimal_edge_config_serves_devices_and_names_its_upstream() -> None:
    c = config(
        {"min_clients": 5, "fraction": 0.5, "secure_aggregation": {"enabled": True}},
        {"address": "127.0.0.1:8080", "name": "edge-1"},
    )
    assert c.server.min_clients == 5 and c.server.fraction == 0.5
    assert c.server.secure_aggregation is not None
    assert c.upstream.address == "127.0.0.1:8080" and c.upstream.name == "edge-1"
    assert c.upstream.linger == 10.0
    assert c.upstream.credentials().tls is False


def test_the_upstream_table_and_flags_combine_flags_winning() -> None:
    c = build_edge_config(
        {"state_dir": "s", "upstream": {"address": "127.0.0.1:1", "linger": 3}},
        {"min_clients": 3},
        {"address": "127.0.0.1:2", "name": None},
    )
    assert c.upstream.address == "127.0.0.1:2" and c.upstream.linger == 3.0
    assert c.server.min_clients == 3


@pytest.mark.parametrize("key", ["rounds", "model", "strategy", "fit_config", "evaluate_every"])
def test_settings_of_the_cloud_job_are_refused_naming_the_key(key: str) -> None:
    values = {"rounds": 3, "model": "m.spore", "strategy": "fedavg", "fit_config": {}}
    values["evaluate_every"] = 1
    with pytest.raises(ConfigError, match=f"`{key}` belong\\(s\\) to the cloud's job"):
        config({key: values[key]}, {"address": "127.0.0.1:1"})


def test_differential_privacy_at_the_edge_is_refused() -> None:
    with pytest.raises(ConfigError, match="`differential_privacy` belong"):
        config({"differential_privacy": {"enabled": True}}, {"address": "127.0.0.1:1"})


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ({}, r"`upstream.address` is required \(--upstream HOST:PORT\)"),
        ({"address": "cloud"}, "`upstream.address` must be HOST:PORT, got 'cloud'"),
        ({"address": "10.0.0.5:8080"}, "not loopback.*`upstream.root_certificates`"),
        ({"address": "127.0.0.1:1", "colour": "x"}, "unknown key `upstream.colour`"),
        ({"address": "127.0.0.1:1", "name": 3}, "`upstream.name` must be str, got 3"),
        ({"address": "127.0.0.1:1", "linger": -1.0}, "`upstream.linger` must be >= 0"),
        (
            {"address": "127.0.0.1:1", "token": "t", "ed25519_key": "k.pem", "name": "e"},
            "`upstream.token` or `upstream.ed25519_key`, not both",
        ),
        ({"address": "127.0.0.1:1", "ed25519_key": "k.pem"}, "needs `upstream.name`"),
        (
            {"address": "127.0.0.1:1", "certificate_chain": "c.pem"},
            "`upstream.certificate_chain` and `upstream.client_key` must be given together",
        ),
    ],
)
def test_bad_upstream_settings_name_the_key(upstream: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config({}, upstream)


def test_an_ed25519_key_file_signs_as_the_edge_name(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "edge.pem").write_bytes(pem)
    up = {"address": "127.0.0.1:1", "name": "edge-7", "ed25519_key": str(tmp_path / "edge.pem")}
    creds = config({}, up).upstream.credentials()
    assert creds.identity == "edge-7"
    meta = dict(creds.metadata("/m", audience="cloud:1"))
    assert meta[KEY_ID] == "edge-7"
    signed = signing_payload("/m", "edge-7", int(meta[TIMESTAMP]), meta[NONCE], audience="cloud:1")
    key.public_key().verify(base64.b64decode(meta[SIGNATURE]), signed)  # raises if not its key


def test_a_key_file_of_another_kind_or_missing_is_refused(tmp_path: Path) -> None:
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "ec.pem").write_bytes(other)
    up = {"address": "127.0.0.1:1", "name": "e", "ed25519_key": str(tmp_path / "ec.pem")}
    with pytest.raises(ConfigError, match="must hold an Ed25519 private key, found"):
        config({}, up).upstream.credentials()
    up["ed25519_key"] = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"`upstream\.ed25519_key`: cannot read"):
        config({}, up).upstream.credentials()


def test_a_config_file_is_read_and_a_bad_one_named(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text('min_clients = 4\n[upstream]\naddress = "127.0.0.1:9"\nname = "e"\n')
    c = load_edge_config(path, {"state_dir": str(tmp_path / "s")}, {})
    assert c.server.min_clients == 4 and c.upstream.name == "e"
    path.write_text("min_clients = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_edge_config(path, {"state_dir": "s"}, {})


def test_the_cli_exits_2_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--state-dir", str(tmp_path / "s")]) == 2
    assert "sporenet-edge: error: `upstream.address` is required" in capsys.readouterr().err
    assert main(["--upstream", "127.0.0.1:1", "--state-dir", "s", "--address", "0.0.0.0:1"]) == 2
    assert "TLS is required" in capsys.readouterr().err


def cloud(**values: Any):  # type: ignore[no-untyped-def]
    return build_config({"state_dir": "s", **values}, {})


def test_mean_based_jobs_take_edges() -> None:
    for name in ("fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad"):
        assert edge_refusal(cloud(strategy=name)) == ""
    local = {"enabled": True, "mode": "local", "noise_multiplier": 1.0, "clipping_norm": 1.0}
    assert edge_refusal(cloud(differential_privacy=local)) == ""
    assert is_edge({"role": "edge"}) and not is_edge({}) and not is_edge({"role": "phone"})


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "krum"])
def test_order_statistic_strategies_refuse_edges_saying_why(name: str) -> None:
    why = edge_refusal(cloud(strategy=name))
    assert f"strategy {name!r} needs every device's update" in why
    assert "an edge sends only its devices' weighted mean" in why


def test_central_dp_and_cloud_secure_aggregation_refuse_edges_saying_why() -> None:
    central = {"enabled": True, "mode": "central", "noise_multiplier": 1.0, "clipping_norm": 1.0}
    why = edge_refusal(cloud(differential_privacy=central))
    assert 'mode "central"' in why and 'Use mode = "local"' in why
    why = edge_refusal(cloud(secure_aggregation={"enabled": True}))
    assert "run secure aggregation at the edges" in why


def test_a_server_state_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "server-state"
    state.mkdir()
    (state / "state.db").write_bytes(b"")  # a server's job lives here
    assert main(["--upstream", "127.0.0.1:1", "--state-dir", str(state)]) == 2
    assert "holds a sporenet-server job, not an edge's" in capsys.readouterr().err
