"""The names a server answers to, which signed requests must name as their audience.

A request signed for one server must not be accepted by another that trusts the same
key (an edge beside another edge, a test server beside production). Clients sign the
authority they dial ("host:port"); the server accepts `auth.audience` when set, else the
host of its address (unless it listens on every interface), the loopback names when it
listens on loopback or every interface, and the DNS names and addresses of its TLS
certificate (what a TLS client must dial), each on the port it listens on.
"""

from __future__ import annotations

import socket
from pathlib import Path

from sporenet.federated.common.auth import Audience
from sporenet.federated.common.net import is_loopback, split_address
from sporenet.federated.server.config import ServerConfig

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def certificate_names(cert: Path) -> list[str]:
    """The DNS names and IP addresses a PEM certificate is valid for (its SANs, else CN)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    loaded = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    try:
        san = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [str(a.value) for a in loaded.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    names = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    names += [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    return names


def server_audience(config: ServerConfig, port: int) -> Audience:
    """The audience of the server `config` describes, listening on `port`."""
    if config.auth.audience:
        return Audience(config.auth.audience, port)
    host = split_address(config.address)[0].strip("[]")
    names: list[str] = []
    if host in WILDCARDS:
        names += [socket.gethostname(), socket.getfqdn(), *LOOPBACK_NAMES]
    else:
        names.append(host)
        if is_loopback(host):
            names += LOOPBACK_NAMES
    if config.tls.cert is not None:
        names += certificate_names(config.tls.cert)
    return Audience(names, port)
