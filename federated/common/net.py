"""Address helpers shared by the server and the client."""

from __future__ import annotations

import ipaddress
import socket
import ssl

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


def speaks_tls(address: str, timeout: float = 5.0) -> bool:
    """True when the server at `address` answers a TLS handshake (its certificate is not
    checked: this only tells a plaintext client why the server closed its connection)."""
    host, port = split_address(address)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError as e:
        # A TLS alert (mutual TLS wants a client certificate) is still a TLS server; a
        # plaintext one answers the ClientHello with bytes that are no TLS record.
        return "ALERT" in str(e).upper()
    except OSError:
        return False
