"""The aggregation stage of a round: between "collect" (validated updates arrive one by one)
and "publish" (the strategy turns the aggregate into the next global model).

The round loop talks to an `Aggregator` only through this protocol, so a secure variant
(sporenet.federated.secagg: the server only ever learns the masked sum) slots in by
implementing the same five members. An update here is always a *delta*: the client's
trained weights minus the global weights of the round, one float array per tensor name.

Memory: `WeightedMeanAggregator` keeps one float64 running sum per tensor, so its size does
not depend on how many clients report (FedAvg, FedProx, FedAdam/FedYogi/FedAdagrad).
`BufferedAggregator` keeps every update until `result()` because order statistics need
them all (median, trimmed mean, Krum): its memory grows linearly with the number of
clients in the round.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from sporenet.federated.errors import AggregationError

Weights = dict[str, np.ndarray]
#: Tensor name -> (shape, dtype) of the global model: what every update must match.
Template = Mapping[str, tuple[tuple[int, ...], np.dtype]]
#: A reduction over all buffered updates: (updates, sample weights) -> aggregated delta.
Reducer = Callable[[Sequence[Weights], np.ndarray], Weights]


def template_of(weights: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The (shape, dtype) template of a set of named weights."""
    return {
        name: (tuple(int(d) for d in a.shape), np.dtype(a.dtype)) for name, a in weights.items()
    }


def check_new_client(clients: Container[str], client_id: str, weight: float) -> None:
    """Refuse a non-positive or non-finite weight and a client already folded in."""
    if not weight > 0 or not np.isfinite(weight):
        raise AggregationError(
            f"client {client_id!r}: weight must be a finite number > 0, got {weight}"
        )
    if client_id in clients:
        raise AggregationError(f"client {client_id!r} was already folded into this aggregate")


def restore_sums(sums: dict[str, np.ndarray], snapshot: Mapping[str, np.ndarray]) -> None:
    """Load running sums from an aggregate checkpoint (keys "sum/<tensor>"), in place,
    refusing a checkpoint whose tensors or shapes differ from the model's."""
    for n in sums:
        key = f"sum/{n}"
        if key not in snapshot or snapshot[key].shape != sums[n].shape:
            raise AggregationError(f"aggregate checkpoint does not match the model at tensor {n!r}")
        sums[n] = np.array(snapshot[key], np.float64)


@runtime_checkable
class Aggregator(Protocol):
    """Folds validated client updates into one aggregated delta.

    `snapshot`/`restore` let the server checkpoint the aggregate so a round survives a
    server restart; a snapshot holds only arrays (saved with `numpy.savez`, no pickle).
    """

    def add(self, client_id: str, update: Weights, weight: float) -> None:
        """Fold in one client's update with its weight (its number of samples). The
        arrays of `update` may be views of a receive buffer the server reuses once `add`
        returns: copy what is kept."""

    def result(self) -> Weights:
        """The aggregated delta, one array per template tensor, in the template's dtype."""

    @property
    def clients(self) -> list[str]:
        """Ids of the clients folded in so far, in order."""

    def snapshot(self) -> dict[str, np.ndarray]:
        """The aggregate's state as named arrays."""

    def restore(self, snapshot: Mapping[str, np.ndarray]) -> None:
        """Replace the state with one produced by `snapshot` on an aggregator of the same kind."""


#: Elements per block of a running-sum fold (a 512 KiB float64 scratch buffer).
FOLD_BLOCK = 1 << 16


def fold_into(acc: np.ndarray, update: np.ndarray, weight: float, scratch: np.ndarray) -> None:
    """acc += weight * update in float64, block by block through `scratch`.

    Equivalent to `acc += np.multiply(update, weight, dtype=np.float64)` without a
    model-sized float64 temporary (whose allocation and page faults cost more than the
    arithmetic), and the blocks stay in cache.
    """
    dst, src = acc.reshape(-1), np.asarray(update).reshape(-1)
    if dst.size <= FOLD_BLOCK:  # most tensors: one block, no loop
        tmp = scratch[: dst.size]
        np.multiply(src, weight, out=tmp, dtype=np.float64)
        np.add(dst, tmp, out=dst)
        return
    for start in range(0, dst.size, FOLD_BLOCK):
        stop = min(start + FOLD_BLOCK, dst.size)
        tmp = scratch[: stop - start]
        np.multiply(src[start:stop], weight, out=tmp, dtype=np.float64)
        dst[start:stop] += tmp


class WeightedMeanAggregator:
    """Running sample-weighted mean: sum(w_i * u_i) / sum(w_i), O(model) memory."""

    def __init__(self, template: Template) -> None:
        self._template = dict(template)
        self._sums = {n: np.zeros(shape, np.float64) for n, (shape, _) in self._template.items()}
        self._total = 0.0
        self._clients: list[str] = []
        self._seen: set[str] = set()  # the same ids: a fleet-sized list is slow to search
        self._scratch = np.empty(FOLD_BLOCK, np.float64)

    def add(self, client_id: str, update: Weights, weight: float) -> None:
        check_new_client(self._seen, client_id, weight)
        for name, acc in self._sums.items():
            fold_into(acc, update[name], weight, self._scratch)
        self._total += float(weight)
        self._clients.append(client_id)
        self._seen.add(client_id)

    def result(self) -> Weights:
        if not self._clients:
            raise AggregationError("no updates were aggregated")
        # Divided in float64 and written straight in the template's dtype: equal to
        # (acc / total).astype(dtype) without a model-sized float64 temporary.
        return {
            n: np.divide(
                acc, self._total, out=np.empty(acc.shape, self._template[n][1]), casting="same_kind"
            )
            for n, acc in self._sums.items()
        }

    @property
    def clients(self) -> list[str]:
        return list(self._clients)

    @property
    def total_weight(self) -> float:
        return self._total

    def snapshot(self) -> dict[str, np.ndarray]:
        state = {f"sum/{n}": a for n, a in self._sums.items()}
        state["meta/total"] = np.array(self._total, np.float64)
        state["meta/clients"] = np.array(self._clients, dtype=np.str_)
        return state

    def restore(self, snapshot: Mapping[str, np.ndarray]) -> None:
        restore_sums(self._sums, snapshot)
        self._total = float(snapshot["meta/total"])
        self._clients = [str(c) for c in snapshot["meta/clients"].tolist()]
        self._seen = set(self._clients)


class BufferedAggregator:
    """Keeps every update and applies `reducer` at the end (memory grows with clients)."""

    def __init__(self, template: Template, reducer: Reducer) -> None:
        self._template = dict(template)
        self._reducer = reducer
        self._updates: list[Weights] = []
        self._weights: list[float] = []
        self._clients: list[str] = []

    def add(self, client_id: str, update: Weights, weight: float) -> None:
        check_new_client(self._clients, client_id, weight)
        self._updates.append({n: np.array(update[n], copy=True) for n in self._template})
        self._weights.append(float(weight))
        self._clients.append(client_id)

    def result(self) -> Weights:
        if not self._updates:
            raise AggregationError("no updates were aggregated")
        out = self._reducer(self._updates, np.asarray(self._weights, np.float64))
        return {
            n: np.asarray(out[n]).astype(self._template[n][1], copy=False) for n in self._template
        }

    @property
    def clients(self) -> list[str]:
        return list(self._clients)

    def snapshot(self) -> dict[str, np.ndarray]:
        state: dict[str, np.ndarray] = {}
        for n, (shape, dtype) in self._template.items():
            state[f"stack/{n}"] = (
                np.stack([u[n] for u in self._updates])
                if self._updates
                else np.zeros((0, *shape), dtype)
            )
        state["meta/weights"] = np.asarray(self._weights, np.float64)
        state["meta/clients"] = np.array(self._clients, dtype=np.str_)
        return state

    def restore(self, snapshot: Mapping[str, np.ndarray]) -> None:
        clients = [str(c) for c in snapshot["meta/clients"].tolist()]
        updates: list[Weights] = [{} for _ in clients]
        for n in self._template:
            stack = snapshot.get(f"stack/{n}")
            if stack is None or stack.shape[0] != len(clients):
                raise AggregationError(
                    f"aggregate checkpoint does not match the model at tensor {n!r}"
                )
            for i in range(len(clients)):
                updates[i][n] = np.array(stack[i])
        self._updates = updates
        self._weights = [float(w) for w in snapshot["meta/weights"].tolist()]
        self._clients = clients
