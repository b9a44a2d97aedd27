"""The SecAgg+ communication graph: each client's mask partners and share holders.

A random Harary graph (Bell et al. 2020): clients are placed on a ring in an order
drawn from the round's public seed, and each is joined to the k/2 nearest on either side.
Anyone holding the seed derives the same graph, so clients check the server's claims.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _ring(num_clients: int, num_neighbours: int, seed: bytes) -> tuple[np.ndarray, np.ndarray]:
    # The order only needs to be unpredictable before the seed is drawn, not secret,
    # so a NumPy generator seeded from a hash of the public seed is enough.
    entropy = int.from_bytes(hashlib.sha256(b"sporenet/secagg/graph/" + seed).digest(), "big")
    order = np.random.Generator(np.random.PCG64(entropy)).permutation(num_clients)
    half = num_neighbours // 2
    offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
    return order, offsets


def neighbour_graph(num_clients: int, num_neighbours: int, seed: bytes) -> list[tuple[int, ...]]:
    """neighbours[i]: the sorted client indices paired with client i (k per client)."""
    if num_neighbours >= num_clients - 1:
        everyone = tuple(range(num_clients))
        return [everyone[:i] + everyone[i + 1 :] for i in range(num_clients)]
    order, offsets = _ring(num_clients, num_neighbours, seed)
    position = np.empty(num_clients, np.int64)
    position[order] = np.arange(num_clients)
    around = order[(position[:, None] + offsets[None, :]) % num_clients]
    return [tuple(sorted(int(v) for v in row)) for row in around]


def neighbours_of(
    client: int, num_clients: int, num_neighbours: int, seed: bytes
) -> tuple[int, ...]:
    """One row of `neighbour_graph` (what a client computes for itself)."""
    if num_neighbours >= num_clients - 1:
        return tuple(v for v in range(num_clients) if v != client)
    order, offsets = _ring(num_clients, num_neighbours, seed)
    position = int(np.flatnonzero(order == client)[0])
    return tuple(sorted(int(v) for v in order[(position + offsets) % num_clients]))
