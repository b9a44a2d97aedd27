"""A job's authentication and TLS, stored with the job so a restart cannot drop them.

A job started with `[auth]` or `[tls]` keeps them in the state database (tokens only as
their sha256 digests, TLS as the paths of its files). A restart that names neither gets
them back (`merge_stored`, before the configuration is built, so a non-loopback address
still finds its TLS); one that gives others uses those (keys and certificates can be
rotated). Nothing turns them off: a configuration built without them for a job that has
them (the Python API, an edge) is refused naming what is missing (`check_kept`), and so
is one that drops mutual TLS. A job that ran without them may start using them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import ServerConfig

META_KEY = "job_security"
TLS_FLAGS = ("tls.cert", "tls.key", "tls.client_ca")


def security_table(config: ServerConfig) -> dict[str, Any]:
    """What the state dir keeps of `config`'s `[auth]` and `[tls]`, as TOML tables."""
    out: dict[str, Any] = {}
    auth = config.auth
    if auth.enabled:
        digests = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in auth.tokens.items()}
        out["auth"] = {
            "token_sha256": {**auth.token_sha256, **digests},
            "ed25519": dict(auth.ed25519),
            "max_skew": auth.max_skew,
            **({"audience": list(auth.audience)} if auth.audience else {}),
        }
    tls = config.tls
    if tls.enabled:
        table = {"cert": str(tls.cert), "key": str(tls.key)}
        if tls.client_ca is not None:
            table["client_ca"] = str(tls.client_ca)
        out["tls"] = table
    return out


def kept(row: Any, summary: Any) -> dict[str, Any]:
    """The job's stored security settings: its row, or for a job from before they were
    stored, what its last configuration summary (`config` in the store) shows: the
    Ed25519 keys and TLS paths as they were, the token names only (their secrets were
    never kept)."""
    if isinstance(row, dict):
        return row
    if not isinstance(summary, dict):
        return {}
    out: dict[str, Any] = {}
    auth = summary.get("auth") or {}
    if auth.get("ed25519") or auth.get("tokens"):
        out["auth"] = {
            "token_sha256": {},
            "ed25519": dict(auth.get("ed25519") or {}),
            "max_skew": auth.get("max_skew", 300.0),
            "token_names": list(auth.get("tokens") or []),
        }
    tls = summary.get("tls") or {}
    if tls.get("cert") and tls.get("key"):
        out["tls"] = {k: tls[k] for k in ("cert", "key", "client_ca") if tls.get(k)}
    return out


def merge_stored(
    values: Mapping[str, Any], overrides: Mapping[str, Any], saved: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The TOML `values` with the job's stored `[auth]` and `[tls]` (`saved`) filled in
    where neither the file nor the flags (`overrides`) set them."""
    out = dict(values)
    if not saved:
        return out
    given_tls = any(overrides.get(k) is not None for k in TLS_FLAGS) or bool(out.get("tls"))
    if "tls" in saved and not given_tls:
        out["tls"] = dict(saved["tls"])
    auth = dict(out.get("auth") or {})
    identities = ("tokens", "token_sha256", "ed25519")
    stored_auth = {k: v for k, v in (saved.get("auth") or {}).items() if k != "token_names"}
    if any(stored_auth.get(k) for k in identities) and not any(auth.get(k) for k in identities):
        out["auth"] = {**stored_auth, **auth}
    return out


def check_kept(saved: Mapping[str, Any] | None, config: ServerConfig) -> None:
    """Refuse `config` when it drops authentication, TLS or mutual TLS the job has.

    Raises:
        ConfigError: naming each missing setting and what the job has.
    """
    if not saved:
        return
    missing = []
    auth = saved.get("auth")
    if auth and not config.auth.enabled:
        names = sorted(
            {*auth.get("token_sha256", {}), *auth.get("ed25519", {}), *auth.get("token_names", [])}
        )
        missing.append(f"`auth` (the job authenticates {len(names)} identities: {names[:5]})")
    tls = saved.get("tls")
    if tls and not config.tls.enabled:
        missing.append(f"`tls.cert` and `tls.key` (the job has {tls['cert']!r}, {tls['key']!r})")
    elif tls and tls.get("client_ca") and config.tls.client_ca is None:
        missing.append(f"`tls.client_ca` (the job requires mutual TLS: {tls['client_ca']!r})")
    if missing:
        raise ConfigError(
            f"state dir {str(config.state_dir)!r} holds a job started with "
            + "; ".join(missing)
            + ", which this configuration leaves out: restart with only --state-dir to "
            "keep them, or give them (new keys or certificates may replace the old)"
        )
