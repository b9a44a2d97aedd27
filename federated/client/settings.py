"""A client's settings as one value, checked when it is built (`Client` keeps them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sporenet.federated.common.auth import Credentials
from sporenet.federated.common.codec import COMPRESSIONS
from sporenet.federated.common.net import is_loopback, split_address
from sporenet.federated.errors import ConfigError

# How long `run()` retries before it gives up when no server answers: long enough to ride
# out a server restart or a network change, short enough that a device does not retry a
# wrong address forever.
GIVE_UP_AFTER = 600.0
UPLOAD_CONNECTIONS = ("separate", "shared")


def addresses_of(address: str | Sequence[str]) -> tuple[str, ...]:
    """The addresses `Client(address)` names: "host:port" or a list of them."""
    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses or not all(isinstance(a, str) for a in addresses):
        raise ConfigError(f"`address` must be 'host:port' or a list of them, got {address!r}")
    return tuple(addresses)


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """What `Client(...)` was asked for; see its docstring for each setting.

    Raises:
        ConfigError: a setting is out of range, or a non-loopback address without
            `root_certificates` in `credentials`.
    """

    addresses: tuple[str, ...]
    credentials: Credentials = field(default_factory=Credentials)
    name: str = ""
    compression: tuple[str, ...] = ()
    topk_ratio: float = 0.01
    poll_wait: float = 0.0
    max_backoff: float = 5.0
    give_up_after: float | None = GIVE_UP_AFTER
    failover_after: float = 30.0
    chunk_size: int = 512 << 10
    download_chunk_size: int = 0
    upload_connection: str = "separate"
    rpc_timeout: float = 60.0

    def __post_init__(self) -> None:
        for each in self.addresses:
            if not self.credentials.tls and not is_loopback(split_address(each)[0]):
                raise ConfigError(
                    "`credentials` need `root_certificates`: "
                    f"{each!r} is not loopback, so TLS is used"
                )
        self._check_retries()
        unknown = sorted(set(self.compression) - set(COMPRESSIONS))
        if unknown:
            raise ConfigError(f"unknown compression {unknown}; supported: {list(COMPRESSIONS)}")
        if not 0 < self.topk_ratio <= 1:
            raise ConfigError(f"`topk_ratio` must be in (0, 1], got {self.topk_ratio}")
        if self.poll_wait < 0 or self.max_backoff <= 0 or self.chunk_size < 1024:
            raise ConfigError(
                "`poll_wait` must be >= 0, `max_backoff` > 0 and `chunk_size` >= 1024"
            )
        if self.upload_connection not in UPLOAD_CONNECTIONS:
            raise ConfigError(
                "`upload_connection` must be 'separate' or 'shared', "
                f"got {self.upload_connection!r}"
            )
        if self.download_chunk_size < 0:
            raise ConfigError(
                "`download_chunk_size` must be >= 0 (0: the server's), "
                f"got {self.download_chunk_size}"
            )

    def _check_retries(self) -> None:
        if not self.failover_after > 0:
            raise ConfigError(f"`failover_after` must be > 0, got {self.failover_after}")
        if self.give_up_after is not None and not self.give_up_after > 0:
            raise ConfigError(
                "`give_up_after` must be > 0 seconds (None: retry forever), "
                f"got {self.give_up_after}"
            )
