"""Address helpers shared by the server and the client."""

from __future__ import annotations

import ipaddress

from sporenet.federated.errors import ConfigError


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6]:port"; refuses anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ConfigError(f"`address` must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP literals (the only places plaintext is allowed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
