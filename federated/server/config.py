"""The daemon's configuration: a TOML file, overridden by command-line flags, checked once.

Example `server.toml`:

    address = "127.0.0.1:8080"
    model = "init.spore"
    state_dir = "state"
    rounds = 10
    min_clients = 2
    fraction = 0.5
    round_timeout = 120
    max_fruitless_reselections = 3  # reselections without a new update before the job fails
    read_timeout = 20     # an upload silent this long loses its receiving slot
    min_upload_rate = 16384  # bytes/s an upload averages after read_timeout, or loses it
    keep_serving = false  # true: keep serving status and downloads after the job ends

    [strategy]
    name = "fedprox"
    proximal_mu = 0.01

    [fit_config]          # forwarded to every client's train(weights, config)
    lr = 0.05

    [tls]
    cert = "server.pem"
    key = "server.key"
    client_ca = "ca.pem"  # optional: mutual TLS

    [auth]
    tokens = { alice = "s3cret" }
    ed25519 = { device-7 = "<base64 raw 32-byte public key>" }

    [storage]
    keep_models = 3       # model versions kept: the newest 3 plus v00000; 0 keeps all

    [secure_aggregation]  # SecAgg+: the server learns only the sum of the fit updates
    enabled = true        # off by default (or --secure)
    neighbours = 8        # share holders per client; default ~3·log2(cohort), even
    threshold = 5         # shares to reconstruct; default neighbours//2 + 1
    clipping_range = 1.0  # each update coordinate is clipped to [-c, c]
    quantization_bits = 24  # fixed-point bits; default: the most the modulus fits
    modulus_bits = 32     # the ring Z_2^32
    max_weight = 100      # optional: weight clients by min(samples, max_weight); default plain mean
    stage_timeout = 60    # seconds a key/share/unmask stage waits at most (masked input,
                          # where clients train, has round_timeout)
    retries = 2           # runs of a failed round, each with a new cohort, before the job fails

    [job]                 # how updates become versions: synchronous rounds (the default)
    mode = "async"        # or buffered asynchronous aggregation (FedBuff; or --async)
    concurrency = 20      # devices training at once
    buffer_size = 10      # updates folded into one buffer; a full buffer publishes a version
    max_staleness = 8     # updates trained on a version older than this are refused
    [job.staleness]       # how an update tau versions old is weighted (strategies/staleness)
    name = "polynomial"   # constant, polynomial ((1 + tau) ** -exponent) or hinge
    exponent = 0.5

    [differential_privacy]  # keys: sporenet.federated.privacy.config
    enabled = true
    mode = "central"      # the server clips each update to clipping_norm and adds noise
    noise_multiplier = 1.0
    clipping_norm = 1.0
    delta = 1e-5
    epsilon_budget = 8.0  # optional: finish the job before a round would exceed it

Every bad value is refused with a `ConfigError` that names the key.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from sporenet.federated.common.net import is_loopback, split_address
from sporenet.federated.errors import ConfigError
from sporenet.federated.privacy.config import DPConfig, dp_config_from_table
from sporenet.federated.secagg.config import SecAggConfig
from sporenet.federated.secagg.errors import SecAggConfigError


@dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """`[tls]`: the server's certificate and key (PEM files); `client_ca` makes clients
    present a certificate it signed (mutual TLS)."""

    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("`tls.cert` and `tls.key` must be given together")
        if self.client_ca is not None and self.cert is None:
            raise ConfigError("`tls.client_ca` (mutual TLS) needs `tls.cert` and `tls.key`")
        for key in ("cert", "key", "client_ca"):
            p = getattr(self, key)
            if p is not None and not Path(p).is_file():
                raise ConfigError(f"`tls.{key}`: no such file {str(p)!r}")

    @property
    def enabled(self) -> bool:
        return self.cert is not None


@dataclass(frozen=True, kw_only=True)
class AuthConfig:
    """`[auth]`: pre-shared tokens (name -> token, or name -> its sha256 hex digest in
    `token_sha256`, as the state dir keeps them) and Ed25519 keys (key id -> base64 raw
    public key); signed requests may be `max_skew` seconds off the server's clock and
    must name this server as their audience: one of `audience` ("host:port" or a host,
    on the listening port), by default the address it listens on, the loopback names
    when it listens there or on every interface, and the names of its TLS certificate."""

    tokens: dict[str, str] = field(default_factory=dict)
    token_sha256: dict[str, str] = field(default_factory=dict)
    ed25519: dict[str, str] = field(default_factory=dict)
    max_skew: float = 300.0
    audience: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """True when clients must authenticate."""
        return bool(self.tokens or self.token_sha256 or self.ed25519)

    def __post_init__(self) -> None:
        if not self.max_skew > 0:
            raise ConfigError(f"`auth.max_skew` must be > 0, got {self.max_skew!r}")
        object.__setattr__(self, "audience", tuple(self.audience))
        for name in self.audience:
            if not isinstance(name, str) or not name or len(name) > 255:
                raise ConfigError(
                    f"`auth.audience` entries must be host or host:port, got {name!r}"
                )
        for name, digest in self.token_sha256.items():
            if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
                raise ConfigError(f"`auth.token_sha256.{name}` must be 64 hex digits")
        for table in ("tokens", "ed25519"):
            for name, value in getattr(self, table).items():
                if not isinstance(value, str) or not value:
                    raise ConfigError(f"`auth.{table}.{name}` must be a non-empty string")
        from sporenet.federated.common.auth import parse_public_key

        for name, key in self.ed25519.items():
            try:
                parse_public_key(key)
            except ConfigError as e:
                raise ConfigError(f"`auth.ed25519.{name}`: {e}") from None


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True)
class StrategyConfig:
    """`[strategy]`: the strategy's name and its options (its constructor's arguments)."""

    name: str = "fedavg"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SecureConfig:
    """`[secure_aggregation]`, when enabled: the SecAgg+ protocol's settings and the
    server's (`max_weight`: weight clients by min(samples, max_weight), None for the plain
    mean; `stage_timeout`: a key, share or unmask stage closes after it at the latest;
    `retries`: runs of a failed round, each with a new cohort, before the job fails)."""

    protocol: SecAggConfig = field(default_factory=SecAggConfig)
    max_weight: float | None = None
    stage_timeout: float = 60.0
    retries: int = 2

    def __post_init__(self) -> None:
        if not self.stage_timeout > 0:
            raise ConfigError(
                f"`secure_aggregation.stage_timeout` must be > 0, got {self.stage_timeout!r}"
            )
        if self.retries < 0:
            raise ConfigError(f"`secure_aggregation.retries` must be >= 0, got {self.retries!r}")


class JobMode(StrEnum):
    """How a job turns updates into model versions."""

    SYNC = "sync"  # rounds: a sampled cohort, a deadline, one version per round
    ASYNC = "async"  # buffered asynchronous aggregation (FedBuff): one version per buffer


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """`[job]`: synchronous rounds, or buffered asynchronous aggregation (`mode = "async"`:
    `concurrency` devices train at once, each on the version it downloaded; an update
    `tau` versions old (at most `max_staleness`) is scaled by the `staleness` weight and
    folded into the buffer; `buffer_size` updates publish the next version)."""

    mode: JobMode = JobMode.SYNC
    concurrency: int = 10
    buffer_size: int = 5
    max_staleness: int = 10
    staleness: str = "polynomial"
    staleness_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            ("concurrency", self.concurrency >= 1, "must be >= 1"),
            ("buffer_size", self.buffer_size >= 1, "must be >= 1"),
            ("max_staleness", self.max_staleness >= 0, "must be >= 0"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ConfigError(f"`job.{key}` {rule}, got {getattr(self, key)!r}")
        from sporenet.federated.strategies.staleness import make_staleness

        make_staleness(self.staleness, self.staleness_options)  # fails here, not at a buffer

    @property
    def is_async(self) -> bool:
        return self.mode == JobMode.ASYNC


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything the daemon needs to run a job; see the module docstring for the file form."""

    state_dir: Path
    address: str = "127.0.0.1:8080"
    model: Path | None = None
    rounds: int = 3
    min_clients: int = 2  # fewest accepted updates a fit round aggregates
    # Live clients needed before a fit round starts (0 = min_clients); it gates the start
    # only: the round still selects `fraction` of the live clients.
    min_available: int = 0
    # The share of live clients a fit round selects: ceil(fraction * live), at least
    # min_clients (and DP's sampling rate q is that cohort over the live clients).
    fraction: float = 1.0
    wait_timeout: float = 0.0  # give up (job failed) after this long without min_clients; 0 = never
    round_timeout: float = 600.0  # per-phase deadline
    # A fit phase short of min_clients at its deadline reselects and extends it; after this
    # many reselections in a row that brought no new update (every client refused or gone),
    # the job fails with a reason instead of waiting forever.
    max_fruitless_reselections: int = 3
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0  # a selected client silent this long has dropped out
    resume_grace: float = 10.0  # after a restart, clients get at least this long to reconnect
    evaluate_every: int = 0  # 0 = no evaluation rounds
    evaluate_fraction: float = 1.0
    max_update_norm: float | None = None
    max_update_bytes: int | None = None  # default: 2 × model size + 1 MiB
    chunk_size: int = 512 << 10
    max_workers: int = 128  # threads for the calls beside the sessions (register, reports, secure)
    # Streams moving payload at once, split between downloads and uploads (an upload being
    # received holds its update in memory); this, not the number of clients, bounds the
    # server's transfer memory.
    max_transfers: int = 8
    # Bytes of updates the upload receiving slots may hold at once (each slot holds one
    # update); fewer slots than max_transfers gives them when updates are large, one at
    # least. The model's float bytes count as one update's size.
    max_upload_memory: int = 256 << 20
    long_poll: float = 10.0  # longest a session's poll is held
    # Longest an upload in progress may go without a chunk before it loses its receiving
    # slot (a stalled or hostile peer must not pin the slots).
    read_timeout: float = 20.0
    # An upload must average this many bytes per second once it has had `read_timeout`
    # seconds with its slot, or it loses the slot (and resumes from what arrived): a
    # trickle must not hold a slot for as long as its declared size at a byte a second.
    min_upload_rate: float = 16384.0
    checkpoint_every: int = 16  # updates folded between aggregate checkpoints
    # `[storage] keep_models`: model versions kept on disk, the newest N (at least 2: a
    # download of the one before the latest may be in flight) plus v00000, the initial
    # model; 0 keeps every version. Optimizer state is kept for the latest version only.
    keep_models: int = 3
    seed: int = 0
    metrics_port: int | None = None
    insecure: bool = False
    log_level: str = "info"
    # Once the job is finished or failed and its clients were told, the daemon exits
    # (0 finished, 1 failed); with keep_serving it goes on answering status and downloads.
    keep_serving: bool = False
    # The TOML tables, one object each.
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    fit_config: dict[str, Any] = field(default_factory=dict)  # sent to every train()
    tls: TLSConfig = field(default_factory=TLSConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    secure_aggregation: SecureConfig | None = None  # None: off; see federated/README.md
    job: JobConfig = field(default_factory=JobConfig)  # `[job]`: sync rounds or async buffers
    differential_privacy: DPConfig | None = None  # None: off; see federated/README.md

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("rounds", self.rounds >= 1, "must be >= 1"),
            ("min_clients", self.min_clients >= 1, "must be >= 1"),
            ("min_available", self.min_available >= 0, "must be >= 0 (0 means min_clients)"),
            ("fraction", 0.0 < self.fraction <= 1.0, "must be in (0, 1]"),
            ("evaluate_fraction", 0.0 < self.evaluate_fraction <= 1.0, "must be in (0, 1]"),
            ("wait_timeout", self.wait_timeout >= 0, "must be >= 0 (0 waits forever)"),
            ("round_timeout", self.round_timeout > 0, "must be > 0"),
            ("max_fruitless_reselections", self.max_fruitless_reselections >= 1, "must be >= 1"),
            ("heartbeat_interval", self.heartbeat_interval > 0, "must be > 0"),
            (
                "heartbeat_timeout",
                self.heartbeat_timeout > self.heartbeat_interval,
                "must be greater than heartbeat_interval",
            ),
            ("resume_grace", self.resume_grace >= 0, "must be >= 0"),
            ("evaluate_every", self.evaluate_every >= 0, "must be >= 0"),
            (
                "max_update_norm",
                self.max_update_norm is None or self.max_update_norm > 0,
                "must be > 0 (leave it out for no bound)",
            ),
            (
                "max_update_bytes",
                self.max_update_bytes is None or self.max_update_bytes > 0,
                "must be > 0 (leave it out for the default)",
            ),
            ("chunk_size", 1024 <= self.chunk_size <= (3 << 20), "must be in [1 KiB, 3 MiB]"),
            ("max_workers", self.max_workers >= 4, "must be >= 4"),
            ("max_transfers", self.max_transfers >= 1, "must be >= 1"),
            ("max_upload_memory", self.max_upload_memory > 0, "must be > 0"),
            ("long_poll", self.long_poll >= 0, "must be >= 0"),
            (
                "read_timeout",
                0 < self.read_timeout <= 3600 and math.isfinite(self.read_timeout),
                "must be in (0, 3600] seconds",
            ),
            ("min_upload_rate", self.min_upload_rate > 0, "must be > 0 bytes per second"),
            ("checkpoint_every", self.checkpoint_every >= 1, "must be >= 1"),
            (
                "keep_models",
                self.keep_models == 0 or self.keep_models >= 2,
                "(`storage.keep_models`) must be 0 (keep every version) or >= 2",
            ),
            (
                "metrics_port",
                self.metrics_port is None or 0 <= self.metrics_port < 65536,
                "must be a port number",
            ),
            (
                "log_level",
                self.log_level in ("debug", "info", "warning", "error"),
                "must be one of debug, info, warning, error",
            ),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ConfigError(f"`{key}` {rule}, got {getattr(self, key)!r}")
        host = split_address(self.address)[0]
        if not is_loopback(host):
            if self.insecure:
                raise ConfigError(
                    f"`insecure` is refused on the non-loopback address {self.address!r}: "
                    "configure tls.cert and tls.key"
                )
            if not self.tls.enabled:
                raise ConfigError(
                    f"`address` {self.address!r} is not loopback, so TLS is required: "
                    "set tls.cert and tls.key (--tls-cert/--tls-key)"
                )
        from sporenet.federated.strategies import make_strategy

        make_strategy(self.strategy.name, self.strategy.options)  # fails here, not in round 1
        if self.secure_aggregation is not None:
            self._check_secure(self.secure_aggregation)
        if self.differential_privacy is not None:
            self._check_dp(self.differential_privacy)
        if self.job.is_async:
            self._check_async()

    @property
    def models_kept(self) -> int:
        """Model versions kept on disk (0: all): `keep_models`, and in an async job at
        least the versions a device may still be training on (max_staleness + 2)."""
        if self.keep_models == 0 or not self.job.is_async:
            return self.keep_models
        return max(self.keep_models, self.job.max_staleness + 2)

    def _check_async(self) -> None:
        """What buffered asynchronous jobs do not combine with (yet), and why."""
        if self.secure_aggregation is not None:
            if self.differential_privacy is not None:
                raise ConfigError(
                    '`job.mode` "async" with both `secure_aggregation` and '
                    "`differential_privacy` is not supported yet: the noise of a secure "
                    "buffer is not built; drop one of them or run in sync mode"
                )
            if self.job.buffer_size < 2:
                raise ConfigError(
                    "`job.buffer_size` must be >= 2 with secure aggregation (a buffer is one "
                    f"SecAgg+ instance among its members), got {self.job.buffer_size}"
                )
            try:
                self.secure_aggregation.protocol.resolve(self.job.buffer_size)
            except SecAggConfigError as e:
                raise ConfigError(
                    f"`secure_aggregation`: with buffer_size={self.job.buffer_size} (each "
                    f"buffer's SecAgg+ instance): {_secagg_key(e)}"
                ) from None
        if self.evaluate_every:
            raise ConfigError(
                '`evaluate_every` must be 0 with `job.mode` "async": an evaluate phase would '
                f"stop every device's training between buffers, got {self.evaluate_every}"
            )

    def _check_secure(self, sa: SecureConfig) -> None:
        """Secure rounds need a mean-based strategy and a cohort the protocol can run with."""
        from sporenet.federated.secagg.session import _check_max_weight
        from sporenet.federated.strategies import make_strategy

        strategy = make_strategy(self.strategy.name, self.strategy.options)
        if strategy.needs_individual_updates:
            raise ConfigError(
                f"`strategy` {self.strategy.name!r} needs every individual update (order statistics"
                " or distances), which secure aggregation hides: use fedavg, fedavgm, fedprox,"
                " fedadam, fedyogi or fedadagrad with `secure_aggregation.enabled`"
            )
        try:
            _check_max_weight(sa.max_weight)
        except SecAggConfigError as e:
            raise ConfigError(f"`secure_aggregation.max_weight`: {e}") from None
        if self.min_clients < 2:
            raise ConfigError(
                f"`min_clients` must be >= 2 with secure aggregation, got {self.min_clients}"
            )
        # Every cohort a round may select must be able to run the protocol: from min_clients
        # up to the number of identities that can authenticate (MAX_COHORT_CHECKED when
        # any client may join), since a later round can select more clients than the first.
        identities = len(self.auth.tokens) + len(self.auth.token_sha256) + len(self.auth.ed25519)
        largest = max(self.min_clients, identities or MAX_COHORT_CHECKED)
        for n in range(self.min_clients, largest + 1):
            try:
                sa.protocol.resolve(n)
            except SecAggConfigError as e:
                where = f"min_clients={n}" if n == self.min_clients else f"a cohort of {n}"
                raise ConfigError(
                    f"`secure_aggregation`: with {where} (rounds may select "
                    f"{self.min_clients} to {largest} clients): {_secagg_key(e)}"
                ) from None

    def _check_dp(self, dp: DPConfig) -> None:
        """DP replaces the strategy's aggregator by a clipped, noised mean."""
        from sporenet.federated.strategies import make_strategy

        strategy = make_strategy(self.strategy.name, self.strategy.options)
        if dp.mode != "local" and strategy.needs_individual_updates:
            raise ConfigError(
                f"`strategy` {self.strategy.name!r} aggregates by order statistics or distances,"
                " which differential privacy's clipped, noised mean replaces: use fedavg, fedavgm,"
                " fedprox, fedadam, fedyogi or fedadagrad with `differential_privacy.enabled`"
            )
        if dp.mode == "central" and self.secure_aggregation is not None:
            raise ConfigError(
                '`differential_privacy.mode` "central" needs every individual update to clip'
                ' it, which secure aggregation hides: use mode = "distributed" with'
                " secure aggregation"
            )
        if dp.mode == "local" and self.secure_aggregation is not None:
            raise ConfigError(
                '`differential_privacy.mode` "local" with secure aggregation adds far more noise'
                ' than needed: use mode = "distributed" (each client adds a share of the noise)'
            )
        if dp.mode == "distributed":
            if self.secure_aggregation is None:
                raise ConfigError(
                    '`differential_privacy.mode` "distributed" needs secure aggregation (each'
                    " client adds only a share of the noise, safe only when the server sees"
                    ' just the sum): set `secure_aggregation.enabled` or use mode = "central"'
                )
            if self.secure_aggregation.max_weight is not None:
                raise ConfigError(
                    "`secure_aggregation.max_weight` is not supported with `differential_privacy"
                    '.mode` "distributed": the noise is sized for the plain mean'
                )


# The largest cohort checked at start when any client may join (no [auth] identities).
MAX_COHORT_CHECKED = 1000

# secagg's own names -> the keys of the [secure_aggregation] table.
_SECAGG_KEYS = {
    "neighbours": "num_neighbours",
    "threshold": "threshold",
    "clipping_range": "clipping_range",
    "quantization_bits": "quantization_bits",
    "modulus_bits": "modulus_bits",
}
_SECAGG_EXTRA: dict[str, tuple[str, tuple[type[Any], ...]]] = {
    "enabled": ("enabled", (bool,)),
    "max_weight": ("max_weight", (int, float)),
    "stage_timeout": ("stage_timeout", (int, float)),
    "retries": ("retries", (int,)),
}
_SECAGG_TYPES: dict[str, tuple[type[Any], ...]] = {
    "neighbours": (int,),
    "threshold": (int,),
    "clipping_range": (int, float),
    "quantization_bits": (int,),
    "modulus_bits": (int,),
}


def _secagg_key(error: SecAggConfigError) -> str:
    """secagg's message with its field names spelled as the config file's keys."""
    text = str(error)
    for key, name in _SECAGG_KEYS.items():
        text = text.replace(f"`{name}`", f"`secure_aggregation.{key}`")
    return text


def _secure_config(table: Any, enable: bool | None) -> SecureConfig | None:
    """The `[secure_aggregation]` table (and the --secure flag); None when disabled."""
    if not isinstance(table, dict):
        raise ConfigError(f"`secure_aggregation` must be a table, got {table!r}")
    out: dict[str, Any] = {}
    sa: dict[str, Any] = {}
    enabled = False
    for key, value in table.items():
        types = _SECAGG_TYPES.get(key) or (_SECAGG_EXTRA[key][1] if key in _SECAGG_EXTRA else None)
        if types is None:
            known = sorted([*_SECAGG_KEYS, *_SECAGG_EXTRA])
            raise ConfigError(f"unknown key `secure_aggregation.{key}`; known keys: {known}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"`secure_aggregation.{key}` must be {names}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"`secure_aggregation.{key}` must be finite, got {value!r}")
        if key == "enabled":
            enabled = value
        elif key in _SECAGG_EXTRA:
            out[_SECAGG_EXTRA[key][0]] = value
        else:
            sa[_SECAGG_KEYS[key]] = value
    if enable is not None:
        enabled = enable
    if not enabled:
        return None
    try:
        return SecureConfig(protocol=SecAggConfig(**sa), **out)
    except SecAggConfigError as e:
        raise ConfigError(_secagg_key(e)) from None


# TOML key -> (dataclass field, accepted Python types). Tables are flattened here.
_TOP: dict[str, tuple[str, tuple[type[Any], ...]]] = {
    "address": ("address", (str,)),
    "model": ("model", (str,)),
    "state_dir": ("state_dir", (str,)),
    "rounds": ("rounds", (int,)),
    "min_clients": ("min_clients", (int,)),
    "min_available": ("min_available", (int,)),
    "fraction": ("fraction", (int, float)),
    "wait_timeout": ("wait_timeout", (int, float)),
    "round_timeout": ("round_timeout", (int, float)),
    "max_fruitless_reselections": ("max_fruitless_reselections", (int,)),
    "heartbeat_interval": ("heartbeat_interval", (int, float)),
    "heartbeat_timeout": ("heartbeat_timeout", (int, float)),
    "resume_grace": ("resume_grace", (int, float)),
    "evaluate_every": ("evaluate_every", (int,)),
    "evaluate_fraction": ("evaluate_fraction", (int, float)),
    "max_update_norm": ("max_update_norm", (int, float)),
    "max_update_bytes": ("max_update_bytes", (int,)),
    "chunk_size": ("chunk_size", (int,)),
    "max_workers": ("max_workers", (int,)),
    "max_transfers": ("max_transfers", (int,)),
    "max_upload_memory": ("max_upload_memory", (int,)),
    "long_poll": ("long_poll", (int, float)),
    "read_timeout": ("read_timeout", (int, float)),
    "min_upload_rate": ("min_upload_rate", (int, float)),
    "checkpoint_every": ("checkpoint_every", (int,)),
    "storage.keep_models": ("keep_models", (int,)),
    "seed": ("seed", (int,)),
    "metrics_port": ("metrics_port", (int,)),
    "insecure": ("insecure", (bool,)),
    "log_level": ("log_level", (str,)),
    "keep_serving": ("keep_serving", (bool,)),
    "tls.cert": ("tls.cert", (str,)),
    "tls.key": ("tls.key", (str,)),
    "tls.client_ca": ("tls.client_ca", (str,)),
    "auth.tokens": ("auth.tokens", (dict,)),
    "auth.ed25519": ("auth.ed25519", (dict,)),
    "auth.max_skew": ("auth.max_skew", (int, float)),
    "auth.audience": ("auth.audience", (list,)),
    "auth.token_sha256": ("auth.token_sha256", (dict,)),
}
#: Tables read on their own (not flattened into _TOP keys).
_TABLES = ("strategy", "fit_config", "secure_aggregation", "differential_privacy", "job")
#: `[job]` keys -> accepted types (its `staleness` sub-table is read on its own).
_JOB_KEYS: dict[str, tuple[type[Any], ...]] = {
    "mode": (str,),
    "concurrency": (int,),
    "buffer_size": (int,),
    "max_staleness": (int,),
}
_PATHS = {"model", "state_dir", "tls.cert", "tls.key", "tls.client_ca"}
_FLOATS = {k for k, (_, types) in _TOP.items() if float in types}


def _flatten(raw: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("tls", "auth", "storage") and isinstance(value, dict):
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat


def _job_config(table: Any, overrides: Mapping[str, Any]) -> JobConfig:
    """The `[job]` table with its flags (`--async`, `--concurrency`, `--buffer-size`,
    `--max-staleness`, `--staleness`)."""
    if not isinstance(table, dict):
        raise ConfigError(f"`job` must be a table, got {table!r}")
    table = dict(table)
    staleness = table.pop("staleness", {})
    if isinstance(staleness, str):
        staleness = {"name": staleness}
    if not isinstance(staleness, dict):
        raise ConfigError(f"`job.staleness` must be a table or a name, got {staleness!r}")
    staleness = dict(staleness)
    if overrides.get("async") is not None:
        table["mode"] = JobMode.ASYNC if overrides["async"] else JobMode.SYNC
    for key in ("concurrency", "buffer_size", "max_staleness"):
        if overrides.get(key) is not None:
            table[key] = overrides[key]
    if overrides.get("staleness") is not None:
        staleness = {"name": overrides["staleness"]}
    out: dict[str, Any] = {}
    for key, value in table.items():
        types = _JOB_KEYS.get(key)
        if types is None:
            known = sorted([*_JOB_KEYS, "staleness"])
            raise ConfigError(f"unknown key `job.{key}`; known keys: {known}")
        if not isinstance(value, types) or isinstance(value, bool):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"`job.{key}` must be {names}, got {value!r}")
        out[key] = value
    if "mode" in out:
        try:
            out["mode"] = JobMode(out["mode"])
        except ValueError:
            modes = [m.value for m in JobMode]
            raise ConfigError(f"`job.mode` must be one of {modes}, got {out['mode']!r}") from None
    name = staleness.pop("name", JobConfig.staleness)
    if not isinstance(name, str):
        raise ConfigError(f"`job.staleness.name` must be str, got {name!r}")
    return JobConfig(**out, staleness=name, staleness_options=staleness)


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> ServerConfig:
    """A checked ServerConfig from parsed TOML values plus flag overrides (None = not given)."""
    raw = dict(file_values)
    strategy_table = raw.pop("strategy", {})
    if isinstance(strategy_table, str):
        strategy_table = {"name": strategy_table}
    if not isinstance(strategy_table, dict):
        raise ConfigError(f"`strategy` must be a table or a name, got {strategy_table!r}")
    fit_config = raw.pop("fit_config", {})
    if not isinstance(fit_config, dict):
        raise ConfigError(f"`fit_config` must be a table, got {fit_config!r}")
    secure = _secure_config(raw.pop("secure_aggregation", {}), overrides.get("secure"))
    dp = dp_config_from_table(raw.pop("differential_privacy", {}))
    job = _job_config(raw.pop("job", {}), overrides)
    flat = _flatten(raw)
    flat.update({k: v for k, v in overrides.items() if v is not None and k in _TOP})
    kwargs: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {"tls": {}, "auth": {}}
    value: Any
    for key, value in flat.items():
        if key not in _TOP:
            raise ConfigError(f"unknown key `{key}`; known keys: {sorted([*_TOP, *_TABLES])}")
        attr, types = _TOP[key]
        # bool is an int in Python; refuse `rounds = true`.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"`{key}` must be {names}, got {value!r}")
        if key in _FLOATS and not math.isfinite(value):
            raise ConfigError(f"`{key}` must be finite, got {value!r}")
        value = Path(value) if attr in _PATHS else value
        table, _, sub = attr.rpartition(".")
        if table:
            tables[table][sub] = value
        else:
            kwargs[attr] = value
    strategy_table = dict(strategy_table)
    if overrides.get("strategy") is not None:
        strategy_table = {"name": overrides["strategy"]}
    name = strategy_table.pop("name", "fedavg")
    kwargs["strategy"] = StrategyConfig(name=name, options=strategy_table)
    kwargs["fit_config"] = fit_config
    kwargs["tls"] = TLSConfig(**tables["tls"])
    kwargs["auth"] = AuthConfig(**tables["auth"])
    kwargs["secure_aggregation"] = secure
    kwargs["differential_privacy"] = dp
    kwargs["job"] = job
    if "state_dir" not in kwargs:
        raise ConfigError("`state_dir` is required (--state-dir or state_dir in the config file)")
    try:
        return ServerConfig(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e)) from None


def read_toml(path: Path | None) -> dict[str, Any]:
    """The config file's table: {} when no file is given, ConfigError when it is missing or
    not TOML."""
    if path is None:
        return {}
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {e}") from None


def load_config(path: Path | None, overrides: Mapping[str, Any]) -> ServerConfig:
    """Read `path` (TOML) if given and apply `overrides` (flag values; None = not given)."""
    return build_config(read_toml(path), overrides)
