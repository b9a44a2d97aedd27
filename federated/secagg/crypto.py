"""Key agreement and authenticated encryption for the protocol (all from `cryptography`).

- X25519 Diffie-Hellman, then HKDF-SHA256 bound to the round id, the purpose and the
  ordered pair of client indices, so one agreement yields distinct keys per use;
- ChaCha20-Poly1305 for the shares relayed by the server: the server routes ciphertexts it
  cannot read or alter undetected (sender, recipient and round are associated data).

A public key on a point of small order makes every shared secret computed with it all
zeros (RFC 7748 section 6.1), whatever the other side's private key: a client that
advertises one would have its peers encrypt shares and derive masks under a key anyone
can compute. `check_public` refuses them by name before any agreement is attempted.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sporenet.federated.secagg.errors import DecryptionError, InvalidKeyError, ProtocolError

KEY_BYTES = 32
NONCE_BYTES = 12
PURPOSE_ENCRYPTION = b"enc"
PURPOSE_MASK = b"mask"
_DOMAIN = b"sporenet/secagg/v1/"
_FIELD_PRIME = 2**255 - 19
#: u-coordinates (mod 2^255 - 19) of the small-order points (order dividing 8) of
#: Curve25519 and its twist: with X25519's clamped scalars (multiples of 8) each gives the
#: all-zero shared secret. The same values as libsodium's blocklist; X25519 ignores bit 255
#: and reduces u mod p, so all 14 encodings of them (p and p + 1 too) are caught.
LOW_ORDER_U: frozenset[int] = frozenset(
    {
        0,
        1,
        325606250916557431795983626356110631294008115727848805560023387167927233504,
        39382357235489614581723060781553021112529911719440698176882885853963445705823,
        _FIELD_PRIME - 1,
    }
)


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


def low_order(data: bytes) -> bool:
    """Whether a 32-byte X25519 public key is a small-order point (all-zero secrets)."""
    u = int.from_bytes(data, "little") & ((1 << 255) - 1)
    return u % _FIELD_PRIME in LOW_ORDER_U


def check_public(data: bytes, what: str) -> None:
    """Refuse a public key that is not 32 bytes or is a low-order point; `what` names it."""
    if len(data) != KEY_BYTES:
        raise InvalidKeyError(f"{what} must be {KEY_BYTES} bytes, found {len(data)}")
    if low_order(data):
        raise InvalidKeyError(
            f"{what} is a low-order X25519 point ({data.hex()[:16]}...): every shared "
            "secret with it is all zeros"
        )


def load_public(data: bytes) -> X25519PublicKey:
    check_public(data, "an X25519 public key")
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
    check_public(peer_public, f"the public key of client {b} (agreeing with client {a})")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:  # all-zero shared secret: a low-order point the list missed
        raise InvalidKeyError(f"key agreement between clients {a} and {b} failed: {e}") from None
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
