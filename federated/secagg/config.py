"""Secure aggregation settings: validated once when built, resolved per round size.

`SecAggConfig` is what an operator writes (most fields default from the round size);
`RoundParams` is the fully resolved, JSON-serializable set a round runs with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sporenet.federated.secagg.errors import SecAggConfigError

MIN_MODULUS_BITS = 8
MAX_MODULUS_BITS = 64
MIN_QUANTIZATION_BITS = 2
#: Finer levels than this drown in float64 rounding (53-bit mantissa) and buy nothing.
MAX_QUANTIZATION_BITS = 40


def default_num_neighbours(num_clients: int) -> int:
    """Neighbours per client: the smallest even k >= 3·log2(n) (SecAgg+ needs k = O(log n))."""
    if num_clients <= 1:
        return 0
    k = math.ceil(3 * math.log2(num_clients))
    return k + (k % 2)


def default_threshold(num_neighbours: int) -> int:
    """The smallest secure threshold: a strict majority of a client's share holders.

    With 2t > k the server cannot collect t shares of a peer's self-mask seed *and* t
    shares of its key from disjoint honest holders (each reveals only one of the two).
    """
    return num_neighbours // 2 + 1


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """What an operator sets; `None` fields are derived from the number of clients.

    - `num_neighbours`: share holders / mask partners per client (even; default ~3·log2 n);
    - `threshold`: shares needed to reconstruct a secret (default k//2 + 1; must exceed k/2);
    - `clipping_range`: each coordinate is clipped to [-clipping_range, clipping_range];
    - `quantization_bits`: fixed-point bits per coordinate (default: the most the ring fits,
      at most 40);
    - `modulus_bits`: the ring is Z_{2^modulus_bits} (32 keeps uploads the size of float32).
    """

    enabled: bool = True
    num_neighbours: int | None = None
    threshold: int | None = None
    clipping_range: float = 1.0
    quantization_bits: int | None = None
    modulus_bits: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise SecAggConfigError(f"`enabled` must be a bool, found {self.enabled!r}")
        if self.num_neighbours is not None:
            _check_int("num_neighbours", self.num_neighbours, minimum=2)
            if self.num_neighbours % 2:
                raise SecAggConfigError(
                    "`num_neighbours` must be even (k/2 partners on each side of the ring "
                    f"graph), found {self.num_neighbours}"
                )
        if self.threshold is not None:
            _check_int("threshold", self.threshold, minimum=2)
            if self.num_neighbours is not None and 2 * self.threshold <= self.num_neighbours:
                raise SecAggConfigError(
                    f"`threshold` must be greater than num_neighbours/2 = {self.num_neighbours / 2}"
                    f" so a peer's two secrets cannot both be reconstructed, found {self.threshold}"
                )
            if self.num_neighbours is not None and self.threshold > self.num_neighbours:
                raise SecAggConfigError(
                    f"`threshold` must be at most num_neighbours={self.num_neighbours}, "
                    f"found {self.threshold}"
                )
        if not (
            isinstance(self.clipping_range, int | float)
            and math.isfinite(self.clipping_range)
            and self.clipping_range > 0
        ):
            raise SecAggConfigError(
                f"`clipping_range` must be a finite number > 0, found {self.clipping_range!r}"
            )
        _check_int(
            "modulus_bits", self.modulus_bits, minimum=MIN_MODULUS_BITS, maximum=MAX_MODULUS_BITS
        )
        if self.quantization_bits is not None:
            _check_int(
                "quantization_bits",
                self.quantization_bits,
                minimum=MIN_QUANTIZATION_BITS,
                maximum=min(self.modulus_bits - 1, MAX_QUANTIZATION_BITS),
            )

    def resolve(self, num_clients: int) -> RoundParams:
        """The round's parameters for `num_clients` sampled clients, validated for that size."""
        _check_int("num_clients", num_clients, minimum=2)
        k = (
            self.num_neighbours
            if self.num_neighbours is not None
            else default_num_neighbours(num_clients)
        )
        # A ring graph of degree >= n-1 is the complete graph (plain SecAgg).
        k = min(k, num_clients - 1)
        t = self.threshold if self.threshold is not None else default_threshold(k)
        if t > k:
            raise SecAggConfigError(
                f"`threshold`={t} exceeds the {k} neighbours each of {num_clients} clients has"
            )
        if 2 * t <= k:
            raise SecAggConfigError(
                f"`threshold` must be greater than half the {k} neighbours, found {t}"
            )
        # The sum of n values in [-(2^(q-1)-1), 2^(q-1)-1] must fit the signed ring.
        headroom = math.ceil(math.log2(num_clients + 1))
        q = self.quantization_bits
        if q is None:
            q = min(self.modulus_bits - headroom, MAX_QUANTIZATION_BITS)
            if q < MIN_QUANTIZATION_BITS:
                raise SecAggConfigError(
                    f"`modulus_bits`={self.modulus_bits} leaves fewer than {MIN_QUANTIZATION_BITS}"
                    f" quantization bits for {num_clients} clients"
                )
        if num_clients * (2 ** (q - 1) - 1) >= 2 ** (self.modulus_bits - 1):
            raise SecAggConfigError(
                f"`quantization_bits`={q} with {num_clients} clients needs modulus_bits >= "
                f"{q + headroom} so the sum cannot wrap, found modulus_bits={self.modulus_bits}"
            )
        return RoundParams(
            num_clients=num_clients,
            num_neighbours=k,
            threshold=t,
            clipping_range=float(self.clipping_range),
            quantization_bits=q,
            modulus_bits=self.modulus_bits,
        )


@dataclass(frozen=True, kw_only=True)
class RoundParams:
    """The resolved parameters of one secure round (sent to every client, persisted)."""

    num_clients: int
    num_neighbours: int
    threshold: int
    clipping_range: float
    quantization_bits: int
    modulus_bits: int

    def __post_init__(self) -> None:
        _check_int("num_clients", self.num_clients, minimum=2)
        _check_int("num_neighbours", self.num_neighbours, minimum=1, maximum=self.num_clients - 1)
        _check_int("threshold", self.threshold, minimum=1, maximum=self.num_neighbours)
        if 2 * self.threshold <= self.num_neighbours:
            raise SecAggConfigError(
                f"`threshold` must be greater than num_neighbours/2 = {self.num_neighbours / 2}, "
                f"found {self.threshold}"
            )
        if not (
            isinstance(self.clipping_range, float)
            and math.isfinite(self.clipping_range)
            and self.clipping_range > 0
        ):
            raise SecAggConfigError(
                f"`clipping_range` must be a finite float > 0, found {self.clipping_range!r}"
            )
        _check_int(
            "modulus_bits", self.modulus_bits, minimum=MIN_MODULUS_BITS, maximum=MAX_MODULUS_BITS
        )
        _check_int(
            "quantization_bits",
            self.quantization_bits,
            minimum=MIN_QUANTIZATION_BITS,
            maximum=min(self.modulus_bits - 1, MAX_QUANTIZATION_BITS),
        )
        if self.num_clients * (2 ** (self.quantization_bits - 1) - 1) >= 2 ** (
            self.modulus_bits - 1
        ):
            raise SecAggConfigError(
                f"`quantization_bits`={self.quantization_bits} with {self.num_clients} clients "
                f"overflows modulus_bits={self.modulus_bits}"
            )

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RoundParams:
        """Rebuild and re-validate (a persisted or received dict is untrusted input)."""
        try:
            return cls(**{f: d[f] for f in cls.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise SecAggConfigError(f"round parameters are incomplete or malformed: {e}") from None


def _check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SecAggConfigError(f"`{name}` must be an int, found {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise SecAggConfigError(f"`{name}` must be {bound}, found {value}")
