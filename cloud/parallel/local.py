"""The local backend: one process per worker on this machine, talking through shared memory.

Three shared blocks: the state (parameters and optimizer slots), one gradient row per
worker, and the step's batch. A step is two rounds over the workers' pipes: "grad" (each
writes its shard's scaled gradients into its row) and, once every row is in, "update"
(each worker sums the rows of the parameters it owns, in worker order, and updates them
and their slots in place). The update is thus split among the workers, as the gradient
is, and nothing but shard bounds and losses crosses the pipes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.cloud.errors import CloudError
from sporenet.cloud.parallel.replica import GradientModel, Replica, Update, combine
from sporenet.cloud.parallel.shared import Layout, SharedArrays


def _owners(sizes: Sequence[int], workers: int) -> list[int]:
    """Each parameter's updating worker: largest first onto the least loaded."""
    load = [0] * workers
    owner = [0] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        w = min(range(workers), key=load.__getitem__)
        owner[k] = w
        load[w] += sizes[k]
    return owner


def _serve(
    rank: int,
    conn: Any,
    spec: GradientModel,
    state_layout: Layout,
    grad_layout: Layout,
    names: list[str],
    slots: dict[str, list[str]],
    owned: list[str],
    update: Update,
    workers: int,
) -> None:
    """A worker's loop (the target of its process)."""
    state = SharedArrays.attach(state_layout)
    grads = SharedArrays.attach(grad_layout)
    batch: SharedArrays | None = None
    replica = Replica(spec, [state[n] for n in names])
    mine = [grads[f"{rank}:{n}"] for n in names]
    try:
        while True:
            msg = conn.recv()
            try:
                if msg[0] == "batch":
                    if batch is not None:
                        batch.close()
                    batch = SharedArrays.attach(msg[1])
                    conn.send(("ok", None))
                elif msg[0] == "grad":
                    _, lo, hi, share = msg
                    if hi == lo:
                        for g in mine:
                            g[...] = 0
                        conn.send(("ok", 0.0))
                    else:
                        x, y = batch["x"][lo:hi], batch["y"][lo:hi]  # type: ignore[index]
                        conn.send(("ok", replica.gradients(x, y, share, mine)))
                elif msg[0] == "update":
                    for n in owned:
                        total = combine([grads[f"{k}:{n}"] for k in range(workers)])
                        update.apply(state[n], total, msg[1], [state[s] for s in slots[n]])
                    conn.send(("ok", None))
                else:
                    break
            except Exception:  # reported to the engine, which raises it in fit
                conn.send(("error", traceback.format_exc()))
    finally:
        replica = None  # type: ignore[assignment]
        mine = []
        for block in (batch, grads, state):
            if block is not None:
                block.close()


class LocalBackend:
    """Worker processes over shared memory (see the module docstring)."""

    def __init__(
        self,
        *,
        spec: GradientModel,
        workers: int,
        names: list[str],
        slots: dict[str, list[str]],
        update: Update,
        initial: dict[str, np.ndarray],
    ) -> None:
        self.workers = workers
        self.spec = spec
        shapes = {n: tuple(np.shape(initial[n])) for n in initial}
        self._state = SharedArrays.create(
            [(n, shapes[n], np.asarray(initial[n]).dtype) for n in initial]
        )
        for n, value in initial.items():
            np.copyto(self._state[n], value)
        self.state = self._state.arrays
        self._grads = SharedArrays.create(
            [(f"{k}:{n}", shapes[n], np.float32) for k in range(workers) for n in names]
        )
        self._batch: SharedArrays | None = None
        owner = _owners([int(np.prod(shapes[n])) for n in names], workers)
        # spawn, not fork: a forked BLAS thread pool can hang the child.
        context = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        try:
            for rank in range(workers):
                parent, child = context.Pipe()
                owned = [n for n, w in zip(names, owner, strict=True) if w == rank]
                proc = context.Process(
                    target=_serve,
                    args=(
                        rank,
                        child,
                        spec,
                        self._state.layout,
                        self._grads.layout,
                        names,
                        slots,
                        owned,
                        update,
                        workers,
                    ),
                    daemon=True,
                    name=f"sporenet-data-parallel-{rank}",
                )
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def _round(self, messages: Sequence[tuple]) -> list[Any]:
        for conn, msg in zip(self._conns, messages, strict=True):
            conn.send(msg)
        replies = []
        for rank, conn in enumerate(self._conns):
            try:
                kind, value = conn.recv()
            except EOFError:
                raise CloudError(f"data-parallel worker {rank} exited") from None
            if kind == "error":
                raise CloudError(f"data-parallel worker {rank} failed:\n{value}")
            replies.append(value)
        return replies

    def _ensure_batch(self, x: np.ndarray, y: np.ndarray) -> SharedArrays:
        b = self._batch
        if (
            b is None
            or len(b["x"]) < len(x)
            or b["x"].shape[1:] != x.shape[1:]
            or b["y"].dtype != y.dtype
        ):
            if b is not None:
                b.close()
            b = self._batch = SharedArrays.create(
                [("x", x.shape, x.dtype), ("y", y.shape, y.dtype)]
            )
            self._round([("batch", b.layout)] * self.workers)
        return b

    def step(
        self, bounds: list[tuple[int, int]], x: np.ndarray, y: np.ndarray, lr: float
    ) -> list[float]:
        batch = self._ensure_batch(x, y)
        batch["x"][: len(x)] = x
        batch["y"][: len(y)] = y
        n = len(x)
        losses = self._round(
            [("grad", lo, hi, np.float32(hi - lo) / np.float32(n)) for lo, hi in bounds]
        )
        self._round([("update", float(lr))] * self.workers)
        return [float(v) for v in losses]

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self.state = {}
        for block in (self._batch, self._grads, self._state):
            if block is not None:
                block.close()
        self._batch = None
