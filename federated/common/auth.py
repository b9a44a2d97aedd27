"""Client authentication carried in gRPC call metadata.

Two schemes, either or both enabled on the server:
- pre-shared tokens: `authorization: Bearer <token>`; the token's name is the identity;
- Ed25519 signed requests: `x-spore-key-id`, `x-spore-timestamp` (unix ms), `x-spore-nonce`
  (random hex), `x-spore-audience` and `x-spore-signature` (base64 Ed25519 signature of
  "sporenet-v2\\n<audience>\\n<method>\\n<key id>\\n<timestamp>\\n<nonce>"). The audience is
  the server the request is for: the authority ("host:port") the client dialed, as gRPC
  names it. A request is refused when its audience is not one of the names the server
  answers to (so a request captured on the way to one server, or edge, cannot be replayed
  to another that trusts the same key), when its timestamp is more than `max_skew`
  seconds away from the server clock, when its nonce was already seen, or when it was
  signed before the server started (the nonce cache lives in memory, and this rule keeps
  pre-restart captures from being replayed).
The signature binds the method and the audience, not the message body: the body is
protected by TLS.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sporenet.federated.errors import AuthError, ConfigError, quote

KEY_ID, TIMESTAMP, NONCE, SIGNATURE, AUDIENCE = (
    "x-spore-key-id",
    "x-spore-timestamp",
    "x-spore-nonce",
    "x-spore-signature",
    "x-spore-audience",
)
_MAX_NONCE_LEN = 128
_MAX_AUDIENCE_LEN = 512


def signing_payload(
    method: str, key_id: str, timestamp_ms: int, nonce: str, *, audience: str
) -> bytes:
    """The bytes an Ed25519 request signature covers."""
    return f"sporenet-v2\n{audience}\n{method}\n{key_id}\n{timestamp_ms}\n{nonce}".encode()


def audience_of(service_url: str) -> str:
    """The audience of a call: the authority of gRPC's service URL
    ("<scheme>://<authority>/<package.Service>"), what the client dialed."""
    rest = service_url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def _split_audience(audience: str) -> tuple[str, str]:
    """(host, port) of "host:port", "[v6]:port" or a bare host (port "")."""
    if audience.startswith("["):
        host, _, rest = audience[1:].partition("]")
        return host.lower(), rest.removeprefix(":")
    host, sep, port = audience.rpartition(":")
    if not sep or not port.isdigit() or ":" in host:
        return audience.lower(), ""
    return host.lower(), port


class Audience:
    """The names a server answers to, as the `host:port` clients dial.

    `names` are hosts (or `host:port` entries, taken as they are); `port` is the port the
    server listens on. A signed request names one of them, or a bare host among them (a
    client that overrides its TLS target name signs that name without the port).
    """

    def __init__(self, names: Sequence[str], port: int | None) -> None:
        self._hosts: set[str] = set()
        self._exact: set[tuple[str, str]] = set()
        for name in names:
            host, given = _split_audience(name)
            if given:
                self._exact.add((host, given))
            else:
                self._hosts.add(host)
        self.port = str(port) if port is not None else ""

    def __contains__(self, audience: str) -> bool:
        host, port = _split_audience(audience)
        if (host, port) in self._exact:
            return True
        return host in self._hosts and port in (self.port, "")

    def __str__(self) -> str:
        def join(host: str, port: str) -> str:
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

        named = [join(h, self.port) for h in self._hosts]
        named += [join(h, p) for h, p in self._exact]
        return ", ".join(sorted(named))


def parse_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 of its 32 raw bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("Ed25519 public key must be base64 of 32 raw bytes") from None
    if len(raw) != 32:
        raise ConfigError(f"Ed25519 public key must be 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """base64 of the raw public key: what goes into the server's auth.ed25519 allow-list."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


# Requests dated more than this ahead of the server clock have their nonce kept on disk:
# a restart refuses requests signed before it, and takes longer than this to get there.
FUTURE_MARGIN_MS = 1000


class Authenticator:
    """Server side: turns call metadata into an authenticated identity or raises AuthError."""

    def __init__(
        self,
        *,
        tokens: Mapping[str, str] | None = None,
        ed25519: Mapping[str, str] | None = None,
        token_sha256: Mapping[str, str] | None = None,
        max_skew: float = 300.0,
        audience: Audience | None = None,
        now: float | None = None,
        nonce_file: Path | None = None,
    ) -> None:
        """`token_sha256`: tokens given by their sha256 hex digests (name -> digest), as a
        state dir keeps them. `audience`: the names this server answers to (set it with
        `bind` once the port is known; until then signed requests are refused).
        `nonce_file`: where the nonces of requests dated after their arrival are kept,
        so that a restart (which refuses only requests signed before it) still refuses
        their replay; None keeps them in memory only."""
        # Keep only token digests, compared in constant time.
        self._tokens = {
            hashlib.sha256(t.encode()).digest(): name for name, t in (tokens or {}).items()
        }
        for name, digest in (token_sha256 or {}).items():
            self._tokens[bytes.fromhex(digest)] = name
        self.audience = audience
        self._keys = {name: parse_public_key(k) for name, k in (ed25519 or {}).items()}
        self._max_skew_ms = int(max_skew * 1000)
        self._started_ms = int((time.time() if now is None else now) * 1000)
        self._nonces: dict[str, int] = {}  # nonce -> expiry (ms)
        self._lock = threading.Lock()
        self._nonce_file = nonce_file
        self._future: dict[str, int] = {}  # persisted: nonces dated after they arrived
        if nonce_file is not None and nonce_file.exists():
            try:
                saved = json.loads(nonce_file.read_text())
                self._future = {str(n): int(exp) for n, exp in saved.items()}
            except (OSError, ValueError, TypeError, AttributeError) as e:
                raise ConfigError(
                    f"nonce cache {str(nonce_file)!r} is unreadable ({e}); delete it only "
                    f"after waiting `auth.max_skew` ({max_skew} s) with the server stopped"
                ) from None
            self._nonces.update(self._future)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens or self._keys)

    def authenticate(
        self, metadata: Sequence[tuple[str, str | bytes]] | None, method: str
    ) -> str | None:
        """The caller's identity; None when authentication is disabled."""
        if not self.enabled:
            return None
        md = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (metadata or ())}
        auth = md.get("authorization", "")
        if auth and self._tokens:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise AuthError("authorization metadata must be 'Bearer <token>'")
            digest = hashlib.sha256(token.encode()).digest()
            for known, name in self._tokens.items():
                if hmac.compare_digest(known, digest):
                    return name
            raise AuthError("unknown token")
        if KEY_ID in md and self._keys:
            return self._check_signature(md, method)
        schemes = [
            s for s, on in (("Bearer token", self._tokens), ("Ed25519 signature", self._keys)) if on
        ]
        raise AuthError(f"request carries no credentials; the server expects: {', '.join(schemes)}")

    def _check_signature(self, md: Mapping[str, str], method: str) -> str:
        key_id = md[KEY_ID]
        key = self._keys.get(key_id)
        if key is None:
            raise AuthError(f"key id {quote(key_id)} is not on the allow-list")
        try:
            ts = int(md.get(TIMESTAMP, ""))
            signature = base64.b64decode(md.get(SIGNATURE, ""), validate=True)
        except (ValueError, binascii.Error):
            raise AuthError(
                f"{TIMESTAMP} must be unix milliseconds and {SIGNATURE} base64"
            ) from None
        nonce = md.get(NONCE, "")
        if not 16 <= len(nonce) <= _MAX_NONCE_LEN:
            raise AuthError(f"{NONCE} must be 16 to {_MAX_NONCE_LEN} characters, got {len(nonce)}")
        audience = md.get(AUDIENCE, "")
        if not audience or len(audience) > _MAX_AUDIENCE_LEN:
            raise AuthError(
                f"{AUDIENCE} must name the server the request is for (host:port), got "
                f"{quote(audience)}"
            )
        if self.audience is None or audience not in self.audience:
            names = str(self.audience) if self.audience is not None else "none yet"
            raise AuthError(
                f"request is signed for {quote(audience)}, not for this server ({names}; "
                "set `auth.audience` if clients reach it by another name)"
            )
        now_ms = int(time.time() * 1000)
        if abs(now_ms - ts) > self._max_skew_ms:
            raise AuthError(
                f"request timestamp is {(now_ms - ts) / 1000:.1f} s off the server clock"
            )
        if ts < self._started_ms:
            raise AuthError("request was signed before the server started (possible replay)")
        try:
            key.verify(signature, signing_payload(method, key_id, ts, nonce, audience=audience))
        except InvalidSignature:
            raise AuthError(f"bad signature for key id {quote(key_id)}") from None
        with self._lock:
            if nonce in self._nonces:
                raise AuthError("replayed request (nonce already used)")
            if len(self._nonces) > 4096:
                self._nonces = {n: exp for n, exp in self._nonces.items() if exp > now_ms}
            self._nonces[nonce] = ts + self._max_skew_ms
            if ts > now_ms + FUTURE_MARGIN_MS and self._nonce_file is not None:
                # A replay after a restart passes the restart rule (signed after it): keep it.
                self._future = {n: e for n, e in self._future.items() if e > now_ms}
                self._future[nonce] = ts + self._max_skew_ms
                tmp = self._nonce_file.with_name(self._nonce_file.name + ".tmp")
                tmp.write_text(json.dumps(self._future))
                os.replace(tmp, self._nonce_file)
        return key_id


class Credentials:
    """Client side: everything about how a client proves who it is and checks the server.

    At most one of a pre-shared `token` or an Ed25519 `key_id` + `private_key` (request
    signatures); for TLS, the server's `root_certificates` and, for mutual TLS, the
    client's `certificate_chain` and `client_key_pem` (all PEM bytes).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        key_id: str | None = None,
        private_key: Ed25519PrivateKey | None = None,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        client_key_pem: bytes | None = None,
    ) -> None:
        """Check the combination; ConfigError names what is missing or conflicting."""
        if token is not None and private_key is not None:
            raise ConfigError("give either `token` or `private_key`, not both")
        if (key_id is None) != (private_key is None):
            raise ConfigError("`key_id` and `private_key` must be given together")
        if (certificate_chain is None) != (client_key_pem is None):
            raise ConfigError("`certificate_chain` and `client_key_pem` must be given together")
        if certificate_chain is not None and root_certificates is None:
            raise ConfigError("a client certificate (mutual TLS) needs `root_certificates`")
        self._token, self._key_id, self._key = token, key_id, private_key
        self.root_certificates = root_certificates
        self._client_cert = (client_key_pem, certificate_chain)

    @property
    def identity(self) -> str | None:
        return self._key_id

    @property
    def tls(self) -> bool:
        """True when the connection is TLS (`root_certificates` given)."""
        return self.root_certificates is not None

    def metadata(self, method: str, *, audience: str) -> list[tuple[str, str]]:
        """Fresh metadata for one call of `method` to the server `audience` ("host:port"
        as dialed): a new timestamp and nonce every time."""
        if self._token is not None:
            return [("authorization", f"Bearer {self._token}")]
        if self._key is not None and self._key_id is not None:
            ts, nonce = int(time.time() * 1000), secrets.token_hex(16)
            payload = signing_payload(method, self._key_id, ts, nonce, audience=audience)
            sig = self._key.sign(payload)
            return [
                (KEY_ID, self._key_id),
                (TIMESTAMP, str(ts)),
                (NONCE, nonce),
                (AUDIENCE, audience),
                (SIGNATURE, base64.b64encode(sig).decode()),
            ]
        return []

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS (or, without `root_certificates`, gRPC's local credentials, which keep the
        loopback connection plaintext) with this client's metadata as call credentials,
        added to every call by gRPC."""
        if self.root_certificates is not None:
            key, chain = self._client_cert
            channel = grpc.ssl_channel_credentials(self.root_certificates, key, chain)
        else:
            channel = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        if self._token is None and self._key is None:
            return channel
        calls = grpc.metadata_call_credentials(_CallMetadata(self), name="sporenet")
        return grpc.composite_channel_credentials(channel, calls)


class _CallMetadata(grpc.AuthMetadataPlugin):
    """gRPC's hook for call credentials: the metadata of each call, signed for its method."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        # service_url is "<scheme>://<authority>/<package.Service>": the method's full name
        # is "/<package.Service>/<method>", what the server checks a signature against,
        # and the authority the server the call is for (its audience).
        service = context.service_url.rsplit("/", 1)[-1]
        method = f"/{service}/{context.method_name}"
        audience = audience_of(context.service_url)
        callback(tuple(self._credentials.metadata(method, audience=audience)), None)
