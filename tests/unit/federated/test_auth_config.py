"""Authenticator (tokens, Ed25519 signatures, replay and clock rules) and config checks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.common.auth import (
    TIMESTAMP,
    Audience,
    Authenticator,
    Credentials,
    public_key_text,
)
from sporenet.federated.errors import AuthError, ConfigError
from sporenet.federated.server.config import build_config, load_config

METHOD = "/sporenet.federated.v1.Federated/GetTask"


def test_tokens() -> None:
    auth = Authenticator(tokens={"alice": "t1"})
    assert auth.authenticate([("authorization", "Bearer t1")], METHOD) == "alice"
    with pytest.raises(AuthError, match="unknown token"):
        auth.authenticate([("authorization", "Bearer t2")], METHOD)
    with pytest.raises(AuthError, match="'Bearer <token>'"):
        auth.authenticate([("authorization", "Basic t1")], METHOD)
    with pytest.raises(AuthError, match="no credentials"):
        auth.authenticate([], METHOD)
    assert Authenticator().authenticate([], METHOD) is None  # disabled


def test_signatures_replays_and_clock() -> None:
    key = Ed25519PrivateKey.generate()
    here = Audience(["server.example"], 8443)
    auth = Authenticator(
        ed25519={"dev": public_key_text(key)}, max_skew=60, now=time.time() - 5, audience=here
    )
    creds = Credentials(key_id="dev", private_key=key)
    md = creds.metadata(METHOD, audience="server.example:8443")
    assert auth.authenticate(md, METHOD) == "dev"
    with pytest.raises(AuthError, match="replayed"):
        auth.authenticate(md, METHOD)
    with pytest.raises(AuthError, match="bad signature"):
        auth.authenticate(creds.metadata("/other", audience="server.example:8443"), METHOD)
    fresh = creds.metadata(METHOD, audience="server.example:8443")
    tampered = [(k, str(int(v) + 1) if k == TIMESTAMP else v) for k, v in fresh]
    with pytest.raises(AuthError, match="bad signature"):
        auth.authenticate(tampered, METHOD)
    with pytest.raises(AuthError, match="not on the allow-list"):
        auth.authenticate(
            Credentials(key_id="x", private_key=key).metadata(METHOD, audience="x:1"), METHOD
        )
    # Signed for another server (another port, another host): refused before anything else.
    for other in ("server.example:8444", "edge.example:8443"):
        with pytest.raises(AuthError, match="not for this server"):
            auth.authenticate(creds.metadata(METHOD, audience=other), METHOD)
    # A client that overrides its TLS target name signs the bare host.
    assert auth.authenticate(creds.metadata(METHOD, audience="server.example"), METHOD) == "dev"
    # A server restarted after the request was signed refuses it (its nonce cache is gone).
    restarted = Authenticator(
        ed25519={"dev": public_key_text(key)}, max_skew=60, now=time.time() + 1, audience=here
    )
    with pytest.raises(AuthError, match="before the server started"):
        restarted.authenticate(creds.metadata(METHOD, audience="server.example:8443"), METHOD)


def test_credentials_need_consistent_arguments() -> None:
    with pytest.raises(ConfigError, match="together"):
        Credentials(key_id="x")
    with pytest.raises(ConfigError, match="either"):
        Credentials(token="t", key_id="x", private_key=Ed25519PrivateKey.generate())


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    base = {"state_dir": str(tmp_path)}
    assert build_config(base, {}).rounds == 3
    cases = [
        ({"rounds": 0}, "`rounds` must be >= 1, got 0"),
        ({"rounds": True}, "`rounds` must be int, got True"),
        ({"min_clients": "2"}, "`min_clients` must be int"),
        ({"heartbeat_timeout": 1.0}, "`heartbeat_timeout` must be greater than heartbeat_interval"),
        ({"round_timeout": float("inf")}, "`round_timeout` must be finite"),
        ({"address": "nohost"}, "`address` must be host:port"),
        ({"address": "10.0.0.1:80"}, "TLS is required"),
        ({"tls": {"cert": "x.pem"}}, "must be given together"),
        ({"tls": {"cert": "x.pem", "key": "y.key"}}, "`tls.cert`: no such file"),
        ({"auth": {"ed25519": {"d1": "abc"}}}, "`auth.ed25519.d1`"),
        ({"auth": {"tokens": {"a": ""}}}, "`auth.tokens.a` must be a non-empty string"),
        ({"strategy": {"name": "median", "beta": 1}}, "no option(s) ['beta']"),
        ({"fit_config": 3}, "`fit_config` must be a table"),
        ({"colour": "blue"}, "unknown key `colour`"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError) as info:
            build_config({**base, **extra}, {})
        assert message in str(info.value), (extra, str(info.value))
    with pytest.raises(ConfigError, match="`state_dir` is required"):
        build_config({}, {})
    with pytest.raises(ConfigError, match="`insecure` is refused"):
        build_config({**base, "address": "0.0.0.0:1"}, {"insecure": True})


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        f'state_dir = "{tmp_path}"\nrounds = 5\n[strategy]\nname = "fedprox"\nproximal_mu = 0.5\n'
        "[fit_config]\nlr = 0.1\n"
    )
    cfg = load_config(path, {"rounds": 7, "min_clients": None})
    assert (cfg.rounds, cfg.min_clients, cfg.strategy.name) == (7, 2, "fedprox")
    assert cfg.strategy.options == {"proximal_mu": 0.5} and cfg.fit_config == {"lr": 0.1}
    assert load_config(path, {"strategy": "median"}).strategy.options == {}
    path.write_text("rounds = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, {})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", {})


def test_the_config_is_nested_like_the_toml_tables_and_errors_name_keys_as_written(
    tmp_path: Path,
) -> None:
    cfg = build_config(
        {"state_dir": str(tmp_path), "auth": {"tokens": {"a": "t"}, "max_skew": 5}}, {}
    )
    assert cfg.auth.tokens == {"a": "t"} and cfg.auth.max_skew == 5
    assert cfg.tls.cert is None and not cfg.tls.enabled
    with pytest.raises(ConfigError, match=r"`auth.max_skew` must be > 0, got 0"):
        build_config({"state_dir": str(tmp_path), "auth": {"max_skew": 0}}, {})
