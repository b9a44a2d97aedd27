"""The protocol's messages and their wire form.

Control messages are small JSON documents (bytes as base64); the masked input, which is
the only large message, is a short header followed by the raw little-endian ring vector,
so a 32-bit ring uploads exactly as many bytes as a float32 update plus ~40.
The daemon carries each message as an opaque `bytes` field.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.federated.secagg.config import RoundParams
from sporenet.federated.secagg.errors import ProtocolError


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError(f"{what} must be a base64 string, found {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ProtocolError(f"{what} is not valid base64") from None


def _load(data: bytes, kind: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"{kind} message is not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("type") != kind:
        found = doc.get("type") if isinstance(doc, dict) else type(doc).__name__
        raise ProtocolError(f"expected a {kind} message, found {found!r}")
    return doc


def _int(doc: dict[str, Any], key: str, kind: str) -> int:
    v = doc.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"{kind}.{key} must be an int, found {v!r}")
    return v


def _bytes_map(doc: dict[str, Any], key: str, kind: str) -> dict[int, bytes]:
    raw = doc.get(key, {})
    if not isinstance(raw, dict):
        raise ProtocolError(f"{kind}.{key} must be an object")
    try:
        return {int(k): unb64(v, f"{kind}.{key}[{k}]") for k, v in raw.items()}
    except ValueError:
        raise ProtocolError(f"{kind}.{key} keys must be client indices") from None


def _int_list(doc: dict[str, Any], key: str, kind: str) -> tuple[int, ...]:
    raw = doc.get(key, [])
    if not isinstance(raw, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in raw
    ):
        raise ProtocolError(f"{kind}.{key} must be a list of client indices")
    return tuple(raw)


def _dump(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, **body}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class RoundSetup:
    """Server -> every sampled client: the public description of the secure round."""

    round_id: bytes
    graph_seed: bytes
    params: RoundParams
    vector_length: int
    client: int

    def to_bytes(self) -> bytes:
        return _dump(
            "RoundSetup",
            {
                "round_id": b64(self.round_id),
                "graph_seed": b64(self.graph_seed),
                "params": self.params.to_dict(),
                "vector_length": self.vector_length,
                "client": self.client,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> RoundSetup:
        d = _load(data, "RoundSetup")
        if not isinstance(d.get("params"), dict):
            raise ProtocolError("RoundSetup.params must be an object")
        return cls(
            unb64(d.get("round_id"), "RoundSetup.round_id"),
            unb64(d.get("graph_seed"), "RoundSetup.graph_seed"),
            RoundParams.from_dict(d["params"]),
            _int(d, "vector_length", "RoundSetup"),
            _int(d, "client", "RoundSetup"),
        )


@dataclass(frozen=True)
class AdvertiseKeys:
    """Client -> server: its two X25519 public keys (share encryption, mask agreement)."""

    client: int
    enc_public: bytes
    mask_public: bytes

    def to_bytes(self) -> bytes:
        return _dump(
            "AdvertiseKeys",
            {
                "client": self.client,
                "enc_public": b64(self.enc_public),
                "mask_public": b64(self.mask_public),
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> AdvertiseKeys:
        d = _load(data, "AdvertiseKeys")
        return cls(
            _int(d, "client", "AdvertiseKeys"),
            unb64(d.get("enc_public"), "enc_public"),
            unb64(d.get("mask_public"), "mask_public"),
        )


@dataclass(frozen=True)
class KeysBroadcast:
    """Server -> client: the public keys of its neighbours that advertised."""

    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return _dump(
            "KeysBroadcast", {"keys": {str(k): [b64(e), b64(m)] for k, (e, m) in self.keys.items()}}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> KeysBroadcast:
        d = _load(data, "KeysBroadcast")
        raw = d.get("keys")
        if not isinstance(raw, dict):
            raise ProtocolError("KeysBroadcast.keys must be an object")
        keys: dict[int, tuple[bytes, bytes]] = {}
        for k, pair in raw.items():
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError(f"KeysBroadcast.keys[{k}] must be [enc, mask]")
            try:
                keys[int(k)] = (unb64(pair[0], "enc key"), unb64(pair[1], "mask key"))
            except ValueError:
                raise ProtocolError("KeysBroadcast.keys keys must be client indices") from None
        return cls(keys)


@dataclass(frozen=True)
class ShareKeys:
    """Client -> server: encrypted shares, one ciphertext per neighbour, and a commitment
    (SHA-256) to its self-mask seed so the server can verify its reconstruction."""

    client: int
    ciphertexts: dict[int, bytes]
    self_mask_digest: bytes

    def to_bytes(self) -> bytes:
        return _dump(
            "ShareKeys",
            {
                "client": self.client,
                "ciphertexts": {str(k): b64(v) for k, v in self.ciphertexts.items()},
                "self_mask_digest": b64(self.self_mask_digest),
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ShareKeys:
        d = _load(data, "ShareKeys")
        return cls(
            _int(d, "client", "ShareKeys"),
            _bytes_map(d, "ciphertexts", "ShareKeys"),
            unb64(d.get("self_mask_digest"), "ShareKeys.self_mask_digest"),
        )


@dataclass(frozen=True)
class SharesDelivery:
    """Server -> client: the ciphertexts its neighbours addressed to it (sender -> bytes)."""

    ciphertexts: dict[int, bytes]

    def to_bytes(self) -> bytes:
        return _dump(
            "SharesDelivery", {"ciphertexts": {str(k): b64(v) for k, v in self.ciphertexts.items()}}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SharesDelivery:
        return cls(_bytes_map(_load(data, "SharesDelivery"), "ciphertexts", "SharesDelivery"))


_MASKED_MAGIC = b"SAMI"
_MASKED_HEADER = struct.Struct("<4sIBI")  # magic, client, dtype size, length


@dataclass(frozen=True)
class MaskedInput:
    """Client -> server: the masked, encoded update (uniform over the ring on its own), and
    the neighbours whose relayed shares failed to decrypt (`refused`: it holds none of
    their shares). The refused list follows the vector: count, then the indices (u32)."""

    client: int
    vector: np.ndarray
    refused: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        v = np.ascontiguousarray(self.vector)
        header = _MASKED_HEADER.pack(_MASKED_MAGIC, self.client, v.dtype.itemsize, v.size)
        trailer = b""
        if self.refused:
            trailer = struct.pack(f"<I{len(self.refused)}I", len(self.refused), *self.refused)
        return header + v.astype(v.dtype.newbyteorder("<"), copy=False).tobytes() + trailer

    @classmethod
    def from_bytes(cls, data: bytes) -> MaskedInput:
        if len(data) < _MASKED_HEADER.size:
            raise ProtocolError(f"MaskedInput is truncated ({len(data)} bytes)")
        magic, client, itemsize, length = _MASKED_HEADER.unpack_from(data)
        if magic != _MASKED_MAGIC or itemsize not in (4, 8):
            raise ProtocolError("not a MaskedInput message")
        end = _MASKED_HEADER.size + itemsize * length
        refused: tuple[int, ...] = ()
        if len(data) >= end + 4:
            (count,) = struct.unpack_from("<I", data, end)
            if len(data) == end + 4 + 4 * count:
                refused = struct.unpack_from(f"<{count}I", data, end + 4)
                end = len(data)
        if len(data) != end:
            raise ProtocolError(
                f"MaskedInput declares {length} elements of {itemsize} bytes "
                f"but carries {len(data) - _MASKED_HEADER.size} bytes"
            )
        dtype = np.dtype(f"<u{itemsize}")
        vector = np.frombuffer(data, dtype, count=length, offset=_MASKED_HEADER.size)
        return cls(client, vector, tuple(refused))


@dataclass(frozen=True)
class UnmaskRequest:
    """Server -> surviving client: for which neighbours it wants key shares (they dropped)
    and for which self-mask shares (they uploaded). The two lists must be disjoint."""

    dropped: tuple[int, ...]
    survivors: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return _dump(
            "UnmaskRequest", {"dropped": list(self.dropped), "survivors": list(self.survivors)}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskRequest:
        d = _load(data, "UnmaskRequest")
        return cls(
            _int_list(d, "dropped", "UnmaskRequest"), _int_list(d, "survivors", "UnmaskRequest")
        )


@dataclass(frozen=True)
class UnmaskResponse:
    """Client -> server: its shares of dropped peers' keys and survivors' self-mask seeds."""

    client: int
    key_shares: dict[int, bytes]
    self_mask_shares: dict[int, bytes]

    def to_bytes(self) -> bytes:
        return _dump(
            "UnmaskResponse",
            {
                "client": self.client,
                "key_shares": {str(k): b64(v) for k, v in self.key_shares.items()},
                "self_mask_shares": {str(k): b64(v) for k, v in self.self_mask_shares.items()},
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskResponse:
        d = _load(data, "UnmaskResponse")
        return cls(
            _int(d, "client", "UnmaskResponse"),
            _bytes_map(d, "key_shares", "UnmaskResponse"),
            _bytes_map(d, "self_mask_shares", "UnmaskResponse"),
        )


ClientMessage = AdvertiseKeys | ShareKeys | MaskedInput | UnmaskResponse
ServerMessage = KeysBroadcast | SharesDelivery | UnmaskRequest
