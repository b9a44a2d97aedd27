"""The edge's configuration: how it serves its devices and how it reaches the cloud.

Example `edge.toml` (every server key about serving devices applies, see
server/config.py; the job itself, its model, rounds and strategy, is the cloud's):

    address = "0.0.0.0:9000"
    state_dir = "edge-state"
    min_clients = 20          # fewest device updates an edge round reports
    fraction = 0.5            # of the edge's live devices, per cloud round
    round_timeout = 120       # then it reports what it has, or withdraws
    [tls]                     # towards the devices
    cert = "edge.pem"
    key = "edge.key"
    [auth]                    # the devices' identities
    tokens = { phone-1 = "s3cret" }
    [secure_aggregation]      # SecAgg+ among this edge's devices
    enabled = true
    max_weight = 1000         # sample weighting (FedAvg) inside the secure sum

    [upstream]                # the cloud, and who this edge is to it
    address = "cloud.example:8080"
    name = "edge-eu-1"
    token = "edge-secret"     # or: ed25519_key = "edge-id.pem" (PKCS8 PEM; key id = name)
    root_certificates = "cloud-ca.pem"
    certificate_chain = "edge-client.pem"   # mutual TLS (optional)
    client_key = "edge-client.key"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from sporenet.federated.common.auth import Credentials
from sporenet.federated.common.net import is_loopback, split_address
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import ServerConfig, build_config, read_toml

#: Settings of the cloud's job, which an edge follows and may not set.
CLOUD_KEYS = (
    "model",
    "rounds",
    "strategy",
    "fit_config",
    "evaluate_every",
    "differential_privacy",
    "job",
)
#: [upstream] key -> accepted type.
UPSTREAM_KEYS: dict[str, type] = {
    "address": str,
    "name": str,
    "token": str,
    "ed25519_key": str,
    "root_certificates": str,
    "certificate_chain": str,
    "client_key": str,
    "linger": float,
}


@dataclass(frozen=True, kw_only=True)
class UpstreamConfig:
    """`[upstream]`: the cloud's address and this edge's identity there."""

    address: str
    name: str = ""
    token: str | None = None
    ed25519_key: Path | None = None
    root_certificates: Path | None = None
    certificate_chain: Path | None = None
    client_key: Path | None = None
    #: The longest the edge keeps serving after the cloud's job ended, for its devices to
    #: fetch the final model; it exits 0 sooner once every device it knows was told.
    linger: float = 10.0

    def __post_init__(self) -> None:
        try:
            host, _ = split_address(self.address)
        except ConfigError:
            raise ConfigError(
                f"`upstream.address` must be HOST:PORT, got {self.address!r}"
            ) from None
        if self.token is not None and self.ed25519_key is not None:
            raise ConfigError("give `upstream.token` or `upstream.ed25519_key`, not both")
        if self.ed25519_key is not None and not self.name:
            raise ConfigError("`upstream.ed25519_key` needs `upstream.name` (the key id)")
        if (self.certificate_chain is None) != (self.client_key is None):
            raise ConfigError(
                "`upstream.certificate_chain` and `upstream.client_key` must be given together"
            )
        if self.root_certificates is None and not is_loopback(host):
            raise ConfigError(
                f"`upstream.address` {self.address!r} is not loopback, so the cloud is reached "
                "over TLS: set `upstream.root_certificates` (--upstream-ca)"
            )
        if not self.linger >= 0:
            raise ConfigError(f"`upstream.linger` must be >= 0 seconds, got {self.linger!r}")

    def credentials(self) -> Credentials:
        """The edge's credentials towards the cloud (files read here)."""
        key: Ed25519PrivateKey | None = None
        if self.ed25519_key is not None:
            loaded = load_pem_private_key(_read(self.ed25519_key, "ed25519_key"), password=None)
            if not isinstance(loaded, Ed25519PrivateKey):
                raise ConfigError(
                    f"`upstream.ed25519_key` {str(self.ed25519_key)!r} must hold an Ed25519 "
                    f"private key, found {type(loaded).__name__}"
                )
            key = loaded
        return Credentials(
            token=self.token,
            key_id=self.name if key is not None else None,
            private_key=key,
            root_certificates=_maybe_read(self.root_certificates, "root_certificates"),
            certificate_chain=_maybe_read(self.certificate_chain, "certificate_chain"),
            client_key_pem=_maybe_read(self.client_key, "client_key"),
        )


def _read(path: Path, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"`upstream.{key}`: cannot read {str(path)!r}: {e.strerror}") from None


def _maybe_read(path: Path | None, key: str) -> bytes | None:
    return None if path is None else _read(path, key)


@dataclass(frozen=True, kw_only=True)
class EdgeConfig:
    """The whole edge: its device-facing server settings and its upstream."""

    server: ServerConfig
    upstream: UpstreamConfig


def _upstream(table: Any, overrides: Mapping[str, Any]) -> UpstreamConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"`upstream` must be a table, got {table!r}")
    values = dict(table)
    values.update({k: v for k, v in overrides.items() if v is not None})
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        kind = UPSTREAM_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"unknown key `upstream.{key}`; known keys: {sorted(UPSTREAM_KEYS)}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"`upstream.{key}` must be {kind.__name__}, got {value!r}")
        is_path = key in ("ed25519_key", "root_certificates", "certificate_chain", "client_key")
        kwargs[key] = Path(str(value)) if is_path else value
    if "address" not in kwargs:
        raise ConfigError("`upstream.address` is required (--upstream HOST:PORT)")
    return UpstreamConfig(**kwargs)


def build_edge_config(
    file_values: Mapping[str, Any],
    overrides: Mapping[str, Any],
    upstream_overrides: Mapping[str, Any],
) -> EdgeConfig:
    """A checked EdgeConfig from parsed TOML values and flags (None = not given).

    Raises:
        ConfigError: a bad value, naming its key; or a key of the cloud's job.
    """
    values = dict(file_values)
    upstream = values.pop("upstream", {})
    cloud = sorted(k for k in values if k in CLOUD_KEYS)
    if cloud:
        raise ConfigError(
            f"{', '.join(f'`{k}`' for k in cloud)} belong(s) to the cloud's job, which the "
            "edge follows: set them on the cloud server (the edge takes its model, rounds, "
            "strategy and training config from each cloud task)"
        )
    server = build_config(values, overrides)
    if server.differential_privacy is not None:  # cannot happen: refused above
        raise ConfigError("`differential_privacy` belongs to the cloud's job")
    return EdgeConfig(server=server, upstream=_upstream(upstream, upstream_overrides))


def load_edge_config(
    path: Path | None, overrides: Mapping[str, Any], upstream_overrides: Mapping[str, Any]
) -> EdgeConfig:
    """Read `path` (TOML) if given and apply the flags (and the device-facing `[auth]` and
    `[tls]` kept in the state dir, where neither gives them)."""
    from sporenet.federated.server.job_settings import with_stored_security

    values = with_stored_security(read_toml(path), overrides)
    return build_edge_config(values, overrides, upstream_overrides)
