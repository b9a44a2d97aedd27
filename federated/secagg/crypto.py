"""Key agreement and authenticated encryption for the protocol (all from `cryptography`).

- X25519 Diffie-Hellman, then HKDF-SHA256 bound to the round id, the purpose and the
  ordered pair of client indices, so one agreement yields distinct keys per use;
- ChaCha20-Poly1305 for the shares relayed by the server: the server routes ciphertexts it
  cannot read or alter undetected (sender, recipient and round are associated data).
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sporenet.federated.secagg.errors import DecryptionError, ProtocolError

KEY_BYTES = 32
NONCE_BYTES = 12
PURPOSE_ENCRYPTION = b"enc"
PURPOSE_MASK = b"mask"
_DOMAIN = b"sporenet/secagg/v1/"


def generate_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def load_private(data: bytes) -> X25519PrivateKey:
    if len(data) != KEY_BYTES:
        raise ProtocolError(f"an X25519 private key is {KEY_BYTES} bytes, found {len(data)}")
    return X25519PrivateKey.from_private_bytes(data)


def load_public(data: bytes) -> X25519PublicKey:
    if len(data) != KEY_BYTES:
        raise ProtocolError(f"an X25519 public key is {KEY_BYTES} bytes, found {len(data)}")
    return X25519PublicKey.from_public_bytes(data)


def agree(
    private: X25519PrivateKey,
    peer_public: bytes,
    *,
    purpose: bytes,
    round_id: bytes,
    a: int,
    b: int,
) -> bytes:
    """A 256-bit key shared by clients `a` and `b` (symmetric in a, b) for one purpose."""
    try:
        shared = private.exchange(load_public(peer_public))
    except ValueError as e:  # all-zero shared secret: a low-order (malicious) public key
        raise ProtocolError(f"key agreement between clients {a} and {b} failed: {e}") from None
    lo, hi = min(a, b), max(a, b)
    info = _DOMAIN + purpose + b"/" + round_id + lo.to_bytes(4, "big") + hi.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def _associated_data(round_id: bytes, sender: int, recipient: int) -> bytes:
    return _DOMAIN + b"share/" + round_id + sender.to_bytes(4, "big") + recipient.to_bytes(4, "big")


def encrypt(key: bytes, plaintext: bytes, *, round_id: bytes, sender: int, recipient: int) -> bytes:
    """nonce || ChaCha20-Poly1305(plaintext), bound to (round, sender, recipient)."""
    nonce = os.urandom(NONCE_BYTES)
    aad = _associated_data(round_id, sender, recipient)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, aad)


def decrypt(
    key: bytes, ciphertext: bytes, *, round_id: bytes, sender: int, recipient: int
) -> bytes:
    """Inverse of `encrypt`; DecryptionError if anything was altered or misrouted."""
    if len(ciphertext) < NONCE_BYTES + 16:
        raise DecryptionError(
            f"share ciphertext from client {sender} is truncated ({len(ciphertext)} bytes)"
        )
    aad = _associated_data(round_id, sender, recipient)
    try:
        return ChaCha20Poly1305(key).decrypt(
            ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], aad
        )
    except InvalidTag:
        raise DecryptionError(
            f"share ciphertext from client {sender} to client {recipient} failed authentication"
        ) from None
