"""The local backend: one process per worker on this machine, talking through shared memory.

The driver is worker 0: it computes the first shard itself while N - 1 worker processes
compute the others, so N workers use N processes (on a machine of N cores, one each).
Three shared blocks: the state (parameters and optimizer slots), one gradient row per
worker process, and the step's batch. A step is one round over the workers' pipes: each
worker gets its shard's bounds, writes its scaled gradients into its row and answers with
its loss; meanwhile the driver computes shard 0; once every answer is in, the driver sums
the rows in worker order and updates the parameters and slots in place (Updater), which
the workers read at the next step. Nothing but shard bounds and losses crosses the pipes,
and the driver's wait is the step's one synchronization: splitting the update among the
workers would need a second one (a barrier between the gradients and the update), which
costs more than the update it spreads, an elementwise pass over the parameters against
the gradients' pass over the batch. The Ray backend reduces and updates the same way, so
both give the same model.
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
from sporenet.cloud.parallel.replica import GradientModel, Replica, Updater
from sporenet.cloud.parallel.shared import Layout, SharedArrays
from sporenet.lite.threads import BLAS


@dataclass(frozen=True)
class _WorkerSetup:
    """What a worker process is started with (pickled once, at spawn)."""

    rank: int
    spec: GradientModel
    state_layout: Layout
    grad_layout: Layout


def _row(grads: SharedArrays, rank: int, spec: GradientModel) -> list[np.ndarray]:
    """Worker `rank`'s gradient row: one array per parameter."""
    return [grads[f"{rank}:{name}"] for name, _ in spec.params]


class _Worker:
    """A worker's views of the shared blocks and its step: one shard's gradients."""

    def __init__(self, setup: _WorkerSetup) -> None:
        self.state = SharedArrays.attach(setup.state_layout)
        self.grads = SharedArrays.attach(setup.grad_layout)
        self.batch: SharedArrays | None = None
        self.replica: Replica | None = Replica(setup.spec, self.state.arrays)
        self.mine = _row(self.grads, setup.rank, setup.spec)

    def attach_batch(self, layout: Layout) -> None:
        if self.batch is not None:
            self.batch.close()
        self.batch = SharedArrays.attach(layout)

    def step(self, lo: int, hi: int, share: float) -> float:
        """Write rows [lo, hi)'s gradients, scaled by `share`, into this worker's row;
        returns the shard's mean loss (0 for an empty shard, whose row is zeros)."""
        if self.batch is None or self.replica is None:
            raise CloudError("a step came before the batch block")
        return _shard(self.replica, self.batch, lo, hi, share, self.mine)

    def close(self) -> None:
        self.replica = None  # its plans hold views of the blocks
        self.mine = []
        for block in (self.batch, self.grads, self.state):
            if block is not None:
                block.close()


def _shard(
    replica: Replica, batch: SharedArrays, lo: int, hi: int, share: float, row: list[np.ndarray]
) -> float:
    """Rows [lo, hi) of the batch block's gradients into `row` (zeros when empty)."""
    if hi == lo:
        for g in row:
            g[...] = 0
        return 0.0
    return replica.gradients(batch["x"][lo:hi], batch["y"][lo:hi], share, row)


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
    """The driver as worker 0 and worker processes over shared memory (see the module
    docstring)."""

    def __init__(
        self, *, spec: GradientModel, workers: int, initial: dict[str, np.ndarray]
    ) -> None:
        self.workers = workers
        self.spec = spec
        self._state = SharedArrays.create([(n, v.shape, v.dtype) for n, v in initial.items()])
        for n, value in initial.items():
            np.copyto(self._state[n], value)
        self.state = self._state.arrays
        self._grads = SharedArrays.create(
            [
                (f"{k}:{name}", initial[name].shape, np.dtype(np.float32))
                for k in range(1, workers)
                for name, _ in spec.params
            ]
        )
        self._rows = [
            [np.zeros(initial[name].shape, np.float32) for name, _ in spec.params],
            *(_row(self._grads, k, spec) for k in range(1, workers)),
        ]
        self._replica: Replica | None = Replica(spec, self.state)
        self._updater: Updater | None = Updater(spec, self.state)
        self._batch: SharedArrays | None = None
        # spawn, not fork: a forked BLAS thread pool can hang the child.
        context = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        try:
            for rank in range(1, workers):
                parent, child = context.Pipe()
                setup = _WorkerSetup(
                    rank=rank,
                    spec=spec,
                    state_layout=self._state.layout,
                    grad_layout=self._grads.layout,
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

    def _send(self, messages: Sequence[tuple]) -> None:
        """Send worker process j (rank j + 1) message j."""
        for j, (conn, msg) in enumerate(zip(self._conns, messages, strict=True)):
            try:
                conn.send(msg)
            except OSError:  # its end of the pipe closed: the process is gone
                raise CloudError(f"data-parallel worker {j + 1} exited") from None

    def _collect(self) -> list[Any]:
        """Every worker process's answer, in rank order; a worker that exits instead fails
        the step (its process sentinel wakes the wait)."""
        answers: dict[int, tuple[str, Any]] = {}
        sentinels = {proc.sentinel: j for j, proc in enumerate(self._procs)}
        conns = {id(conn): j for j, conn in enumerate(self._conns)}
        while len(answers) < len(self._conns):
            waiting = [c for j, c in enumerate(self._conns) if j not in answers]
            for ready in connection.wait([*waiting, *sentinels]):
                if isinstance(ready, int):  # a process sentinel: it exited
                    j = sentinels[ready]
                    if j not in answers and not self._conns[j].poll():
                        raise CloudError(f"data-parallel worker {j + 1} exited")
                    continue
                j = conns[id(ready)]
                try:
                    answers[j] = self._conns[j].recv()
                except EOFError:
                    raise CloudError(f"data-parallel worker {j + 1} exited") from None
        for j in range(len(self._conns)):
            kind, value = answers[j]
            if kind == "error":
                raise CloudError(f"data-parallel worker {j + 1} failed:\n{value}")
        return [answers[j][1] for j in range(len(self._conns))]

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
            self._send([("batch", b.layout)] * len(self._conns))
            self._collect()
        return b

    def step(
        self, bounds: list[tuple[int, int]], x: np.ndarray, y: np.ndarray, lr: float
    ) -> list[float]:
        if self._replica is None or self._updater is None:
            raise CloudError("the data-parallel backend is closed")
        batch = self._ensure_batch(x, y)
        batch["x"][: len(x)] = x
        batch["y"][: len(y)] = y
        n = len(x)
        self._send([("step", lo, hi, (hi - lo) / n) for lo, hi in bounds[1:]])
        lo, hi = bounds[0]
        first = _shard(self._replica, batch, lo, hi, (hi - lo) / n, self._rows[0])
        losses = [first, *self._collect()]
        self._updater.apply(self._rows, lr)  # the all-reduce and the update, in place
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
        self.state, self._rows = {}, []  # views of the blocks closed below
        self._replica = self._updater = None  # their plans hold views of the state
        for block in (self._batch, self._grads, self._state):
            if block is not None:
                block.close()
        self._batch = None
