"""Several server addresses: retry with backoff, fail over to the next, spot a TLS server.

`Failover` is a mixin of `Client`: it holds no state of its own and works on the client's
addresses, retry budgets and connections.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from sporenet.federated.client.reachability import Reachability
from sporenet.federated.common.net import speaks_tls
from sporenet.federated.errors import ConfigError, FederatedError

if TYPE_CHECKING:
    from sporenet.federated.client.secure import SecureTasks
    from sporenet.federated.client.transfers import PendingUpload, Transfers
    from sporenet.federated.common.auth import Credentials
    from sporenet.federated.common.buffers import BufferPool

log = logging.getLogger("sporenet.federated.client")


class Failover:
    """Retry, failover and TLS-hint steps of `Client.run()`."""

    addresses: list[str]
    address: str
    _at: int
    failover_after: float
    failovers: int
    give_up_after: float | None
    max_backoff: float
    _backoff: float
    _unreachable_since: float | None
    _here_since: float | None
    _tls_checked: bool
    _stop: threading.Event
    credentials: Credentials
    client_id: str | None
    _pending: PendingUpload | None
    _secure: SecureTasks
    _transfers: Transfers
    _buffers: BufferPool
    _disconnect: Callable[[], None]
    link: Reachability

    def _reached(self, *, answered: bool = True) -> None:
        """The server answered (or `run()` starts): the retry budgets start afresh."""
        self._backoff, self._unreachable_since, self._here_since = 0.1, None, None
        if answered:
            self.link.reached(self.address)

    def _unreachable(self, code: grpc.StatusCode, details: str) -> None:
        """A call failed in a way worth retrying: move to the next address once this one
        was unreachable for `failover_after` seconds, raise once every one was for
        `give_up_after`, and otherwise wait out a backoff with jitter."""
        now = time.monotonic()
        self._unreachable_since = self._unreachable_since or now
        self._here_since = self._here_since or now
        if self.give_up_after is not None and now - self._unreachable_since > self.give_up_after:
            where = " and ".join(self.addresses)
            raise FederatedError(
                f"server unreachable for {self.give_up_after:g} s at {where}: {details}"
            ) from None
        if len(self.addresses) > 1 and now - self._here_since > self.failover_after:
            self._fail_over(details)
            return
        delay = self._backoff * (0.5 + random.random())
        # Logged once per outage with the address and error, then summarised (reachability.py).
        self.link.failed(self.address, code.name, details, retry_in=delay)
        log.debug("server call failed (%s); retrying in %.2f s", code.name, delay)
        self._stop.wait(delay)
        self._backoff = min(self._backoff * 2, self.max_backoff)

    def _fail_over(self, details: str) -> None:
        """Move to the next address and register there: a task, model, update or secure
        round of the old server means nothing to the new one."""
        gone = self.address
        self._disconnect()
        self._at = (self._at + 1) % len(self.addresses)
        self.address = self.addresses[self._at]
        self.client_id, self._pending = None, None
        self._secure.reset()
        self._transfers.drop_models()
        if self._transfers.partial is not None:
            self._buffers.give(self._transfers.partial[1])
            self._transfers.partial = None
        self._tls_checked = False
        self._backoff, self._here_since = 0.1, None
        self.failovers += 1
        log.warning(
            "server %s unreachable for %g s (%s); moving to %s",
            gone,
            self.failover_after,
            details,
            self.address,
        )

    def _check_not_tls(self, code: grpc.StatusCode, details: str) -> None:
        """Raise ConfigError when a plaintext client's connection was closed because the
        server expects TLS (gRPC itself only says "Socket closed"); checked once."""
        if self.credentials.tls or self._tls_checked or code != grpc.StatusCode.UNAVAILABLE:
            return
        if "socket closed" not in details.lower():
            return
        self._tls_checked = True
        if speaks_tls(self.address):
            raise ConfigError(
                f"server at {self.address} closed the connection during the handshake: it"
                " expects TLS; pass Credentials(root_certificates=<the server's CA, PEM>)"
                f" (gRPC said: {details})"
            )
