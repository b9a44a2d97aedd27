"""Group commit: an accepted update is acknowledged once its batch is durable.

A fit phase folds each accepted update into its running sum at once, but writes nothing
for it: the sum is checkpointed once per batch (`checkpoint_every` updates, or after
`COMMIT_DELAY` seconds, whichever comes first, or when the phase closes), and only then
are the batch's uploads answered. An update whose server is killed before its batch's
checkpoint was never acknowledged, so its client sends it again to the restarted server,
which restores the checkpoint (without it) and folds it once: a `kill -9` loses no
acknowledged update and folds none twice, with one durable write per batch instead of a
journal record per update.

`GroupCommit` is shared by the round manager's threads (which fold and checkpoint under
the job's lock) and the event loop whose sessions wait for acknowledgement.
"""

from __future__ import annotations

import asyncio
import threading

#: How long an accepted update waits for its batch to fill before whoever waits on it
#: checkpoints the partial batch (seconds): the acknowledgement's added latency, bounded.
COMMIT_DELAY = 0.02


class GroupCommit:
    """Counts accepted and durable updates, and wakes the waiters a checkpoint covers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.accepted = 0  # updates folded so far (a sequence number per update)
        self.durable = 0  # of them, how many a checkpoint (or publication) holds
        self._error: BaseException | None = None
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def accept(self) -> int:
        """Count one folded update; its sequence number, to wait on."""
        with self._lock:
            self.accepted += 1
            return self.accepted

    @property
    def pending(self) -> int:
        """Folded updates no checkpoint holds yet."""
        return self.accepted - self.durable

    def made_durable(self) -> None:
        """Every update accepted so far is durable (call it after the checkpoint's write,
        under the job's lock, so no fold runs between the write and this)."""
        with self._lock:
            self.durable, self._error = self.accepted, None
            ready = [w for w in self._waiters if w[0] <= self.durable]
            self._waiters = [w for w in self._waiters if w[0] > self.durable]
        for _, loop, future in ready:
            _settle(loop, future, None)

    def failed(self, error: BaseException) -> None:
        """A checkpoint failed: its waiters are told (their clients send again; the
        folded updates stay in the sum and the next checkpoint holds them)."""
        with self._lock:
            ready, self._waiters = self._waiters, []
        for _, loop, future in ready:
            _settle(loop, future, error)

    async def wait(self, seq: int, timeout: float) -> bool:
        """Wait until update `seq` is durable, at most `timeout` seconds: whether it is.

        Raises the error of a checkpoint that failed meanwhile."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if seq <= self.durable:
                return True
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((seq, loop, future))
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            with self._lock:
                self._waiters = [w for w in self._waiters if w[2] is not future]
                return seq <= self.durable
        return True


def _settle(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], error: BaseException | None
) -> None:
    """Resolve `future` on its loop's thread (the checkpoint may run on another)."""

    def settle() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        settle()
    else:
        loop.call_soon_threadsafe(settle)
