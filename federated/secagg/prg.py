"""Masks: a 256-bit seed expanded by AES-256-CTR into ring elements (the hot path).

Each seed is used for exactly one mask (self-mask seeds are fresh; pairwise seeds are
HKDF outputs bound to the round and the pair), so a fixed all-zero counter block is safe.
One mask of 100k uint32 costs ~0.1 ms with AES-NI.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from sporenet.federated.secagg.errors import ProtocolError

SEED_BYTES = 32
_COUNTER_BLOCK = bytes(16)


def ring_dtype(modulus_bits: int) -> np.dtype:
    """Smallest unsigned dtype whose wrap-around arithmetic is a multiple of 2^modulus_bits."""
    return np.dtype(np.uint32) if modulus_bits <= 32 else np.dtype(np.uint64)


@lru_cache(maxsize=4)
def _zeros(nbytes: int) -> bytes:
    return bytes(nbytes)


def expand(seed: bytes, length: int, dtype: np.dtype) -> np.ndarray:
    """`length` pseudorandom elements of `dtype` (uniform over its range) from `seed`."""
    if len(seed) != SEED_BYTES:
        raise ProtocolError(f"a mask seed is {SEED_BYTES} bytes, found {len(seed)}")
    dtype = np.dtype(dtype)
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(_COUNTER_BLOCK)).encryptor()
    stream = encryptor.update(_zeros(length * dtype.itemsize))
    return np.frombuffer(stream, dtype=dtype.newbyteorder("<"), count=length).astype(
        dtype, copy=False
    )


def add_mask(acc: np.ndarray, seed: bytes, sign: int) -> None:
    """acc += sign * PRG(seed), wrapping in acc's unsigned dtype (sign is +1 or -1)."""
    mask = expand(seed, acc.size, acc.dtype)
    if sign > 0:
        np.add(acc, mask, out=acc)
    else:
        np.subtract(acc, mask, out=acc)
