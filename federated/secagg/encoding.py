"""Clipping and fixed-point encoding of float updates into the ring Z_{2^modulus_bits}.

A value x is clipped to [-c, c], scaled by s = (2^(q-1) - 1) / c and rounded
stochastically (floor(x·s + u), u ~ U[0, 1)), so the integer is an unbiased estimate of
x·s in [-(2^(q-1)-1), 2^(q-1)-1]; negatives are stored in two's complement mod 2^b.

Stated error: each coordinate of one client's encoding is off by less than one step
Δ = 1/s = c / (2^(q-1) - 1), with mean zero. The decoded sum of n clients therefore
differs from the sum of the clipped values by less than n·Δ per coordinate (typically
about sqrt(n)·Δ/2), plus float64 rounding: with at most 40 quantization bits that adds
under 2^-11 of a level per client, so the tested bound is n·Δ·(1 + 2^-10).
RoundParams guarantees the n-client sum cannot wrap the ring.
"""

from __future__ import annotations

import numpy as np

from sporenet.federated.secagg.config import RoundParams
from sporenet.federated.secagg.errors import ProtocolError
from sporenet.federated.secagg.prg import ring_dtype


class FixedPointCodec:
    """Encode one client's update / decode the ring sum, for one round's parameters."""

    def __init__(self, params: RoundParams) -> None:
        self.clipping_range = params.clipping_range
        self.max_level = 2 ** (params.quantization_bits - 1) - 1
        self.scale = self.max_level / params.clipping_range
        self.modulus_bits = params.modulus_bits
        self.dtype = ring_dtype(params.modulus_bits)
        self.ring_mask = (1 << params.modulus_bits) - 1

    @property
    def step(self) -> float:
        """Δ: the value of one quantization level (the per-client, per-coordinate error bound)."""
        return 1.0 / self.scale

    def sum_error_bound(self, num_clients: int) -> float:
        """Strict bound on |decoded sum - sum of clipped values| per coordinate."""
        return num_clients * self.step * (1 + 2**-10)

    def encode(self, update: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip, scale and stochastically round a float vector into ring elements."""
        x = np.array(update, dtype=np.float64).reshape(-1)  # a copy: never touch the caller's
        if not np.all(np.isfinite(x)):
            raise ProtocolError("an update to encode contains NaN or infinity")
        np.clip(x, -self.clipping_range, self.clipping_range, out=x)
        x *= self.scale
        x += rng.random(x.size)
        levels = np.floor(x).astype(np.int64)
        # floor(v + u) with |v| <= max_level stays in range; the clamp only absorbs the
        # last-ulp error of x·scale at the clipping bounds.
        np.clip(levels, -self.max_level, self.max_level, out=levels)
        return self.reduce(levels.astype(self.dtype))

    def reduce(self, ring: np.ndarray) -> np.ndarray:
        """Reduce wrap-around values of the ring dtype modulo 2^modulus_bits (in place)."""
        if self.modulus_bits not in (32, 64):
            np.bitwise_and(ring, self.dtype.type(self.ring_mask), out=ring)
        return ring

    def decode_sum(self, ring_sum: np.ndarray) -> np.ndarray:
        """Signed interpretation of a ring sum, divided by the scale: float64 values."""
        return self._signed(ring_sum).astype(np.float64) / self.scale

    def decode_bounded_sum(self, ring_sum: np.ndarray, num_clients: int) -> tuple[np.ndarray, int]:
        """`decode_sum` held to what `num_clients` clipped inputs can add up to.

        Each honest encoding is within [-max_level, max_level], so a sum outside
        num_clients·[-max_level, max_level] proves that some contributor's input was not
        clipped (a malicious client adding ring units to its masked vector). Those
        coordinates are clamped to the bound; returns (values, how many were clamped).
        """
        signed = self._signed(ring_sum)
        bound = num_clients * self.max_level
        outside = int(np.count_nonzero((signed > bound) | (signed < -bound)))
        if outside:
            np.clip(signed, -bound, bound, out=signed)
        return signed.astype(np.float64) / self.scale, outside

    def _signed(self, ring_sum: np.ndarray) -> np.ndarray:
        r = self.reduce(np.array(ring_sum, dtype=self.dtype))
        half = 1 << (self.modulus_bits - 1)
        if self.modulus_bits == 64:
            return r.view(np.int64)
        signed = r.astype(np.int64)
        signed[signed >= half] -= 1 << self.modulus_bits
        return signed
