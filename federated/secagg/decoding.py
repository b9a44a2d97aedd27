"""Robust Shamir reconstruction: Reed-Solomon decoding that locates bad shares.

Shares of a secret with threshold t are the evaluations of a polynomial of degree < t, a
codeword of a Reed-Solomon code: with s shares, any e <= (s - t) // 2 wrong ones can be
located and left out (t + 2e shares are needed to correct e). Plain Lagrange
interpolation of t shares cannot even tell that one of them is wrong.

The decoder is syndrome based and vectorized over secrets and chunks like shamir.py:

1. syndromes S_i = sum_j w_j x_j^i y_j for i < s - t, with w_j = 1 / prod_{k != j}(x_j - x_k):
   all zero exactly when the shares lie on one polynomial of degree < t (the fast path:
   a few exact float64 matmuls, then the usual interpolation of t shares);
2. otherwise Berlekamp-Massey on the first 2e syndromes finds the error locator
   L(z) = prod_bad (1 - x_j z), and its roots among the holders' 1/x_j are the bad shares;
3. the shares left are checked again (their own syndromes must vanish) before the secret
   is interpolated from t of them, so a locator found for more than e errors is reported
   as uncorrectable, never trusted.

A secret whose shares cannot be decoded is reported per row (`ok` false) with how many
bad shares its share count could correct; the caller names whose secret it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sporenet.federated.secagg.errors import ReconstructionError
from sporenet.federated.secagg.shamir import (
    CHUNKS,
    PRIME,
    field_to_secrets,
    interpolate_at_zero,
    inverse,
)

_LOW_BITS = 16
_LOW_MASK = (1 << _LOW_BITS) - 1


@dataclass(frozen=True)
class Decoded:
    """What `decode` found for m secrets of s shares each."""

    #: (m, 32) uint8: the secrets (zeros in rows that are not `ok`).
    secrets: np.ndarray
    #: (m, s) bool: shares that disagree with the decoded polynomial.
    bad: np.ndarray
    #: (m,) bool: the row was decoded (its shares lie on one polynomial after leaving out
    #: at most `correctable` of them).
    ok: np.ndarray
    #: The most bad shares a row of s shares can have and still be decoded: (s - t) // 2.
    correctable: int


def correctable(shares: int, threshold: int) -> int:
    """Bad shares that `shares` shares of a threshold-`threshold` secret can locate."""
    return max(shares - threshold, 0) // 2


def _dot(weights: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(m, r, s) x (m, s, c) -> (m, c, r): sum_j weights[j] * ys[j] mod p, exactly.

    Both operands are split into 16-bit halves, so every partial product is < 2^32 and a
    sum of s < 2^21 of them is an exact float64: four BLAS matmuls instead of an int64 loop.
    """
    w_parts = [
        (weights & _LOW_MASK).astype(np.float64),
        (weights >> _LOW_BITS).astype(np.float64),
    ]
    y_parts = [(ys & _LOW_MASK).astype(np.float64), (ys >> _LOW_BITS).astype(np.float64)]
    acc = np.zeros((weights.shape[0], weights.shape[1], ys.shape[2]), np.int64)
    for i, wp in enumerate(w_parts):
        for j, yp in enumerate(y_parts):
            part = np.matmul(wp, yp).astype(np.int64) % PRIME  # (m, r, c)
            acc = (acc + (part << (_LOW_BITS * (i + j))) % PRIME) % PRIME
    return np.swapaxes(acc, 1, 2)


def _syndrome_weights(xs: np.ndarray, count: int, bad: np.ndarray | None) -> np.ndarray:
    """(m, count, s): w_j x_j^i for i < count over the shares not marked bad (zero there).

    w_j = 1 / prod_{k != j, k good}(x_j - x_k) are the dual code's column multipliers: with
    them sum_j w_j x_j^i f(x_j) = 0 for every polynomial f of degree < good - i - 1.
    """
    m, s = xs.shape
    den = np.ones((m, s), np.int64)
    for k in range(s):
        diff = (xs - xs[:, k : k + 1]) % PRIME  # x_j - x_k for every j
        diff[:, k] = 1
        if bad is not None:
            diff[bad[:, k]] = 1
        den *= diff
        den %= PRIME
    if np.any(den == 0):
        raise ReconstructionError("two shares of one secret have the same holder coordinate")
    w = inverse(den)
    if bad is not None:
        w = np.where(bad, 0, w)
    out = np.empty((m, count, s), np.int64)
    power = w
    for i in range(count):
        out[:, i, :] = power
        power = power * xs % PRIME
    return out


def _berlekamp_massey(syndromes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shortest linear recurrences of B sequences over GF(p), all in one batch.

    syndromes: (B, N). Returns (B, N + 1) connection polynomials C (C[:, 0] = 1) and their
    lengths L (B,), so that sum_{i<=L} C_i S_{n-i} = 0 for every L <= n < N.
    """
    b_count, n_total = syndromes.shape
    size = n_total + 1
    c = np.zeros((b_count, size), np.int64)
    c[:, 0] = 1
    prev = c.copy()
    length = np.zeros(b_count, np.int64)
    shift = np.ones(b_count, np.int64)
    last = np.ones(b_count, np.int64)  # the discrepancy when prev was saved
    cols = np.arange(size)
    for n in range(n_total):
        d = np.zeros(b_count, np.int64)
        for i in range(min(n, n_total - 1) + 1):
            d = (d + c[:, i] * syndromes[:, n - i]) % PRIME
        fix = d != 0
        if not np.any(fix):
            shift += 1
            continue
        coef = d * inverse(last) % PRIME
        src = cols[None, :] - shift[:, None]
        moved = np.where(src >= 0, np.take_along_axis(prev, np.clip(src, 0, None), axis=1), 0)
        updated = (c - coef[:, None] * moved % PRIME) % PRIME
        grow = fix & (2 * length <= n)
        prev = np.where(grow[:, None], c, prev)
        last = np.where(grow, d, last)
        length = np.where(grow, n + 1 - length, length)
        shift = np.where(grow, 1, shift + 1)
        c = np.where(fix[:, None], updated, c)
    return c, length


def _locate(xs: np.ndarray, syndromes: np.ndarray, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Bad shares per (row, chunk) from the first 2e syndromes.

    xs: (m, s); syndromes: (m, c, >= 2e). Returns bad (m, c, s) and found (m, c): whether
    the locator's degree is at most e and it has exactly that many roots among the holders.
    """
    m, c, _ = syndromes.shape
    s = xs.shape[1]
    flat = syndromes[:, :, : 2 * e].reshape(m * c, 2 * e)
    poly, length = _berlekamp_massey(flat)
    # Chien search over the holders: evaluate the locator at every 1/x_j (Horner).
    z = np.repeat(inverse(xs), c, axis=0)  # (m*c, s)
    value = np.zeros((m * c, s), np.int64)
    for i in range(poly.shape[1] - 1, -1, -1):
        value = (value * z + poly[:, i : i + 1]) % PRIME
    roots = value == 0
    found = (length <= e) & (roots.sum(axis=1) == length)
    return roots.reshape(m, c, s), found.reshape(m, c)


def decode(xs: np.ndarray, ys: np.ndarray, threshold: int) -> Decoded:
    """Recover m secrets from s >= threshold shares each, locating up to (s - t) // 2 bad ones.

    xs: (m, s) holder coordinates (distinct, non-zero), ys: (m, s, CHUNKS) shares. A share
    value outside the field is a bad share like any other wrong value.
    """
    xs = np.asarray(xs, np.int64)
    ys = np.asarray(ys, np.int64)
    if xs.ndim != 2 or ys.shape != (*xs.shape, CHUNKS):
        raise ReconstructionError(
            f"expected xs (m, s) and ys (m, s, {CHUNKS}), found {xs.shape} and {ys.shape}"
        )
    m, s = xs.shape
    t = threshold
    if s < t:
        raise ReconstructionError(f"need {t} shares per secret to reconstruct, found {s}")
    if np.any((xs <= 0) | (xs >= PRIME)):
        raise ReconstructionError("a holder coordinate is not a non-zero field element")
    out_of_field = np.any((ys < 0) | (ys >= PRIME), axis=2)
    ys = ys % PRIME
    e = correctable(s, t)
    bad = out_of_field.copy()
    located = np.ones(m, bool)
    dirty = np.any(out_of_field, axis=1)
    if s > t:
        syndromes = _dot(_syndrome_weights(xs, s - t, None), ys)  # (m, c, s - t)
        dirty |= np.any(syndromes != 0, axis=(1, 2))
        if np.any(dirty) and e > 0:
            roots, found = _locate(xs[dirty], syndromes[dirty], e)
            bad[dirty] |= np.any(roots, axis=1)
            located[dirty] = np.all(found, axis=1)
    clean = ~dirty
    ok = clean.copy()
    check = dirty & located & (bad.sum(axis=1) <= e)
    if np.any(check):
        # The shares left must lie on one polynomial: their own syndromes (over s - |bad|
        # holders, s - |bad| - t of them) vanish. Checks beyond a row's count are skipped.
        sub_bad = bad[check]
        left = s - sub_bad.sum(axis=1)
        residual = _dot(_syndrome_weights(xs[check], s - t, sub_bad), ys[check])
        needed = np.arange(s - t)[None, None, :] < (left - t)[:, None, None]
        ok[check] = ~np.any((residual != 0) & needed, axis=(1, 2))
    secrets = np.zeros((m, 32), np.uint8)
    if np.any(ok):
        # The first t good shares of each decoded row (a stable sort puts them first).
        order = np.argsort(bad[ok], axis=1, kind="stable")[:, :t]
        px = np.take_along_axis(xs[ok], order, axis=1)
        py = np.take_along_axis(ys[ok], order[:, :, None], axis=1)
        field = interpolate_at_zero(px, py)
        valid = np.all(field < 1 << 24, axis=1)
        ok[np.flatnonzero(ok)[~valid]] = False
        if np.any(valid):
            secrets[ok] = field_to_secrets(field[valid])
    bad[~ok] = False
    return Decoded(secrets, bad, ok, e)
