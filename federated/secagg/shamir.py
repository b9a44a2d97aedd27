"""Shamir secret sharing over GF(p), p = 2^31 - 1, vectorized in NumPy.

Every product of two field elements is < 2^62, so all arithmetic runs in int64 without
Python integers. A 32-byte secret is cut into 3-byte chunks (each < 2^24 < p), and many
secrets are shared or reconstructed in one call: sharing is a Horner evaluation over an
(secrets, holders, chunks) array, reconstruction a Lagrange combination at x = 0.
"""

from __future__ import annotations

import os

import numpy as np

from sporenet.federated.secagg.errors import ReconstructionError, SecAggConfigError

PRIME = 2**31 - 1
CHUNK_BYTES = 3
SECRET_BYTES = 32
#: Field elements per 32-byte secret (the last chunk is zero-padded).
CHUNKS = -(-SECRET_BYTES // CHUNK_BYTES)
#: Bytes of one serialized share of one secret (uint32 little-endian per chunk).
SHARE_BYTES = 4 * CHUNKS


def secrets_to_field(secrets: np.ndarray) -> np.ndarray:
    """(m, 32) uint8 -> (m, CHUNKS) int64 field elements."""
    m = secrets.shape[0]
    padded = np.zeros((m, CHUNKS * CHUNK_BYTES), np.int64)
    padded[:, :SECRET_BYTES] = secrets
    p = padded.reshape(m, CHUNKS, CHUNK_BYTES)
    return p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)


def field_to_secrets(elements: np.ndarray) -> np.ndarray:
    """(m, CHUNKS) int64 -> (m, 32) uint8; raises if an element is not a valid chunk."""
    if np.any((elements < 0) | (elements >= 1 << (8 * CHUNK_BYTES))):
        raise ReconstructionError(
            "reconstructed field element is out of the chunk range: the shares are inconsistent"
        )
    out = np.stack([(elements >> (8 * i)) & 0xFF for i in range(CHUNK_BYTES)], axis=-1)
    return out.reshape(elements.shape[0], -1)[:, :SECRET_BYTES].astype(np.uint8)


def random_field(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform elements of GF(p) from the OS CSPRNG (31-bit draws, rejecting the value p)."""
    count = int(np.prod(shape))
    out = np.frombuffer(os.urandom(4 * count), np.uint32).astype(np.int64) & PRIME
    bad = out == PRIME  # 2^31 - 1 itself is not a field element: redraw (probability 2^-31)
    while np.any(bad):
        out[bad] = np.frombuffer(os.urandom(4 * int(bad.sum())), np.uint32).astype(np.int64) & PRIME
        bad = out == PRIME
    return out.reshape(shape)


def share(secrets: np.ndarray, xs: np.ndarray, threshold: int) -> np.ndarray:
    """Split each (32-byte) secret into one share per holder x; any `threshold` reconstruct.

    secrets: (m, 32) uint8; xs: (h,) distinct non-zero holder coordinates < p.
    Returns (m, h, CHUNKS) int64: share of secret i for holder xs[j].
    """
    xs = np.asarray(xs, np.int64)
    if threshold < 1 or threshold > xs.size:
        raise SecAggConfigError(
            f"`threshold` must be in [1, {xs.size}] for {xs.size} holders, found {threshold}"
        )
    if np.any((xs <= 0) | (xs >= PRIME)) or np.unique(xs).size != xs.size:
        raise SecAggConfigError("holder coordinates must be distinct and in [1, p)")
    constant = secrets_to_field(np.asarray(secrets, np.uint8))  # (m, c)
    m = constant.shape[0]
    coeffs = random_field((threshold - 1, m, CHUNKS))
    # Horner from the highest coefficient: acc = acc * x + a (each step stays < 2^62 + p).
    acc = np.zeros((m, xs.size, CHUNKS), np.int64)
    x = xs[None, :, None]
    for a in coeffs[::-1]:
        acc = (acc * x + a[:, None, :]) % PRIME
    return (acc * x + constant[:, None, :]) % PRIME


def _pow_mod(base: np.ndarray, exponent: int) -> np.ndarray:
    result = np.ones_like(base)
    b = base % PRIME
    while exponent:
        if exponent & 1:
            result = result * b % PRIME
        b = b * b % PRIME
        exponent >>= 1
    return result


def inverse(a: np.ndarray) -> np.ndarray:
    """Elementwise multiplicative inverse in GF(p) (Fermat: a^(p-2)); a must be non-zero."""
    return _pow_mod(np.asarray(a, np.int64), PRIME - 2)


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """(m, t) holder coordinates -> (m, t) Lagrange weights of each share at x = 0."""
    m, t = xs.shape
    num = np.ones((m, t), np.int64)
    den = np.ones((m, t), np.int64)
    for j in range(t):
        xj = xs[:, j : j + 1]
        mask = np.arange(t) != j
        num = np.where(mask, num * xj % PRIME, num)
        den = np.where(mask, den * ((xj - xs) % PRIME) % PRIME, den)
    if np.any(den == 0):
        raise ReconstructionError("two shares of one secret have the same holder coordinate")
    return num * inverse(den) % PRIME


def reconstruct(xs: np.ndarray, ys: np.ndarray, threshold: int) -> np.ndarray:
    """Recover m secrets from their first `threshold` shares each.

    xs: (m, s) holder coordinates, ys: (m, s, CHUNKS) shares, s >= threshold.
    Returns (m, 32) uint8. Fewer than `threshold` shares is an error: t-1 shares are
    consistent with every secret, so no answer would be meaningful.
    """
    xs = np.asarray(xs, np.int64)
    ys = np.asarray(ys, np.int64)
    if xs.ndim != 2 or ys.shape != (*xs.shape, CHUNKS):
        raise ReconstructionError(
            f"expected xs (m, s) and ys (m, s, {CHUNKS}), found {xs.shape} and {ys.shape}"
        )
    if xs.shape[1] < threshold:
        raise ReconstructionError(
            f"need {threshold} shares per secret to reconstruct, found {xs.shape[1]}"
        )
    if np.any((xs <= 0) | (xs >= PRIME)) or np.any((ys < 0) | (ys >= PRIME)):
        raise ReconstructionError("a share or holder coordinate is not a field element")
    return field_to_secrets(interpolate_at_zero(xs[:, :threshold], ys[:, :threshold]))


def interpolate_at_zero(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(m, t) coordinates and (m, t, CHUNKS) values -> (m, CHUNKS): each polynomial at 0."""
    weights = lagrange_at_zero(xs)
    acc = np.zeros((xs.shape[0], ys.shape[2]), np.int64)
    for i in range(xs.shape[1]):
        acc = (acc + weights[:, i : i + 1] * ys[:, i, :]) % PRIME
    return acc


def share_to_bytes(share_row: np.ndarray) -> bytes:
    """One holder's share of one secret, (CHUNKS,) int64 -> SHARE_BYTES bytes."""
    return share_row.astype("<u4").tobytes()


def share_from_bytes(data: bytes) -> np.ndarray:
    """Inverse of share_to_bytes; raises ReconstructionError on a wrong length."""
    if len(data) != SHARE_BYTES:
        raise ReconstructionError(f"a share is {SHARE_BYTES} bytes, found {len(data)}")
    return np.frombuffer(data, "<u4").astype(np.int64)
