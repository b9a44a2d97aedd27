"""The local backend: one process per worker on this machine, talking through shared memory.

Three shared blocks: the state (parameters and optimizer slots), one gradient row per
worker, and the step's batch. A step is one round over the workers' pipes: each worker
gets its shard's bounds, writes its scaled gradients into its row and answers with its
loss; once every answer is in, the driver sums the rows in worker order and updates the
parameters and slots in place, which the workers read at the next step. Nothing but shard
bounds and losses crosses the pipes, and the driver's wait is the step's one
synchronization: splitting the update among the workers would need a second one (a
barrier between the gradients and the update), which costs more than the update it
spreads, an elementwise pass over the parameters against the gradients' pass over the
batch. The Ray backend reduces and updates the same way, so both give the same model.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import connection
from typing import Any

import numpy as np

from sporenet.cloud.errors import CloudError
from sporenet.cloud.parallel.replica import GradientModel, Replica, Update, combine
from sporenet.cloud.parallel.shared import Layout, SharedArrays
from sporenet.lite.threads import BLAS


@dataclass(frozen=True)
class _WorkerSetup:
    """What a worker process is started with (pickled once, at spawn)."""

    rank: int
    spec: GradientModel
    state_layout: Layout
    grad_layout: Layout
    names: list[str]


class _Worker:
    """A worker's views of the shared blocks and its step: one shard's gradients."""

    def __init__(self, setup: _WorkerSetup) -> None:
        self.state = SharedArrays.attach(setup.state_layout)
        self.grads = SharedArrays.attach(setup.grad_layout)
        self.batch: SharedArrays | None = None
        self.replica: Replica | None = Replica(setup.spec, [self.state[n] for n in setup.names])
        self.mine = [self.grads[f"{setup.rank}:{n}"] for n in setup.names]

    def attach_batch(self, layout: Layout) -> None:
        if self.batch is not None:
            self.batch.close()
        self.batch = SharedArrays.attach(layout)

    def step(self, lo: int, hi: int, share: np.float32) -> float:
        """Write rows [lo, hi)'s gradients, scaled by `share`, into this worker's row;
        returns the shard's mean loss (0 for an empty shard, whose row is zeros)."""
        if hi == lo:
            for g in self.mine:
                g[...] = 0
            return 0.0
        if self.batch is None or self.replica is None:
            raise CloudError("a step came before the batch block")
        x, y = self.batch["x"][lo:hi], self.batch["y"][lo:hi]
        return self.replica.gradients(x, y, share, self.mine)

    def close(self) -> None:
        self.replica = None  # its plans hold views of the blocks
        self.mine = []
        for block in (self.batch, self.grads, self.state):
            if block is not None:
                block.close()


def _serve(setup: _WorkerSetup, conn: Any) -> None:
    """A worker's loop (the target of its process)."""
    BLAS.set(1)  # one core per worker: a second BLAS thread would compete with a peer
    worker = _Worker(setup)
    try:
        while True:
            msg = conn.recv()
            try:
                if msg[0] == "batch":
                    worker.attach_batch(msg[1])
                    conn.send(("ok", None))
                elif msg[0] == "step":
                    conn.send(("ok", worker.step(*msg[1:])))
                else:
                    break
            except Exception:  # reported to the engine, which raises it in fit
                conn.send(("error", traceback.format_exc()))
    finally:
        worker.close()


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
        self.names, self.slots, self.update = names, slots, update
        shapes = {n: tuple(np.shape(initial[n])) for n in initial}
        self._state = SharedArrays.create(
            [(n, shapes[n], np.asarray(initial[n]).dtype) for n in initial]
        )
        for n, value in initial.items():
            np.copyto(self._state[n], value)
        self.state = self._state.arrays
        self._grads = SharedArrays.create(
            [(f"{k}:{n}", shapes[n], np.dtype(np.float32)) for k in range(workers) for n in names]
        )
        # Per parameter: every worker's row, and the buffer their sum goes into.
        self._rows = {n: [self._grads[f"{k}:{n}"] for k in range(workers)] for n in names}
        self._sums = {n: np.empty(shapes[n], np.float32) for n in names}
        self._batch: SharedArrays | None = None
        # spawn, not fork: a forked BLAS thread pool can hang the child.
        context = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        try:
            for rank in range(workers):
                parent, child = context.Pipe()
                setup = _WorkerSetup(
                    rank=rank,
                    spec=spec,
                    state_layout=self._state.layout,
                    grad_layout=self._grads.layout,
                    names=names,
                )
                proc = context.Process(
                    target=_serve,
                    args=(setup, child),
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
        """Send each worker its message and collect the answers, in rank order; a worker
        that exits instead fails the step (its process sentinel wakes the wait)."""
        for rank, (conn, msg) in enumerate(zip(self._conns, messages, strict=True)):
            try:
                conn.send(msg)
            except OSError:  # its end of the pipe closed: the process is gone
                raise CloudError(f"data-parallel worker {rank} exited") from None
        answers: dict[int, tuple[str, Any]] = {}
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        conns = {id(conn): rank for rank, conn in enumerate(self._conns)}
        while len(answers) < len(self._conns):
            waiting = [c for r, c in enumerate(self._conns) if r not in answers]
            for ready in connection.wait([*waiting, *sentinels]):
                if isinstance(ready, int):  # a process sentinel: it exited
                    rank = sentinels[ready]
                    if rank not in answers and not self._conns[rank].poll():
                        raise CloudError(f"data-parallel worker {rank} exited")
                    continue
                rank = conns[id(ready)]
                try:
                    answers[rank] = self._conns[rank].recv()
                except EOFError:
                    raise CloudError(f"data-parallel worker {rank} exited") from None
        for rank in range(len(self._conns)):
            kind, value = answers[rank]
            if kind == "error":
                raise CloudError(f"data-parallel worker {rank} failed:\n{value}")
        return [answers[rank][1] for rank in range(len(self._conns))]

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
            [("step", lo, hi, np.float32(hi - lo) / np.float32(n)) for lo, hi in bounds]
        )
        for name in self.names:  # the all-reduce and the update, in place
            total = combine(self._rows[name], out=self._sums[name])
            self.update.apply(
                self.state[name], total, lr, [self.state[s] for s in self.slots[name]]
            )
        return [float(v) for v in losses]

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, in rank order (for monitoring their CPU time)."""
        return [proc.pid for proc in self._procs if proc.pid is not None]

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
        self.state, self._rows = {}, {}  # views of the blocks closed below
        for block in (self._batch, self._grads, self._state):
            if block is not None:
                block.close()
        self._batch = None
