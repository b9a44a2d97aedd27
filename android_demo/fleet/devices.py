"""Virtual devices: a group of them in one process, each a participant of the federated job.

A `DeviceGroup` holds many devices cheaply. A device between rounds is its identity, the
indices of its data partition, its traits and random state, and one coroutine on the
process's shared event loop (session_stream.TransportLoop) whose calls (a unary Poll when
idle, a Session stream while it works) are multiplexed with the others' over a few
connections (shared.ChannelPool). What a device
needs only while it takes part is shared or pooled: the round's global weights are one
read-only copy per model version (shared.ModelCache); training runs in a small pool of
worker threads, each with one `LiteLearner` (one lite Trainer, planned once) whose data
is set to the device's partition for its turn; an update is encoded into a pooled buffer
only when one of a few upload turns is free, and the buffer is given back once sent.

Compute time is the host's time for that training, stretched by the device's speed
multiplier; network time is latency plus bytes over the device's bandwidth (both slept
when the profile simulates time).

Availability: a device with online_fraction < 1 alternates online periods (exponential,
mean `mean_online_s`) and offline ones; offline, its session is closed. A dropout (while
training, or before its update is sent) makes the device vanish for the rest of that
round: its session is closed without an update, and the server sees a silent client.

Secure aggregation: a device answers secure rounds and secure async buffers with the
client SDK's own steps (federated/client/secure.py's SecureTasks: its SecAgg+ session,
the update it holds for a buffer), trains at a round's masked-input stage or at a
buffer's training task, and may drop out while training or before its masked update is
sent; a device that vanished has lost its secrets, so it sits out the rest of that round.

The job ends for the group when one device is sent DONE; the devices still online are
then told too, as phones would be, each saying it holds the final model (the group's
one download), so the server, which exits once every live client was told, need not
wait out the heartbeat timeout for them.

The group records, per round, when it first saw the round's global weights (the model
published by the round before), how many of its devices trained and dropped out, and the
payload bytes they moved; `run` returns those records (plain data, so a Ray actor can
return them too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from sporenet import lite
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet.participant import Participant, weights_of
from sporenet.android_demo.fleet.profile import DeviceTraits
from sporenet.android_demo.fleet.shared import ChannelPool, ModelCache
from sporenet.federated.aggregation import template_of
from sporenet.federated.client.client import FATAL, RETRYABLE
from sporenet.federated.client.secure import SecureTasks, trained_delta
from sporenet.federated.client.session_stream import TransportLoop
from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.codec import encode_raw
from sporenet.federated.common.wire import SECURE_BUFFER_KEY, SECURE_WEIGHT_KEY
from sporenet.federated.errors import (
    AuthError,
    FederatedError,
    MalformedMessageError,
    TransferError,
)
from sporenet.lite import WeightsReader
from sporenet.proto import federated_pb2 as pb

log = logging.getLogger("sporenet.android_demo.fleet")

TRAIN_WORKERS = 1  # threads training devices, each with its own Trainer (`--workers`)
UPLOAD_TURNS = 16  # devices encoding and sending an update at once (each holds a payload)
# Once one device saw the job end, the others online have this long to poll and be told
# too (the server exits when every live client was told); the rest are then stopped.
DONE_GRACE_S = 10.0


def batch_rng(seed: int, device: int, round: int) -> np.random.Generator:
    """The random state a device's local training in `round` draws its batches from."""
    return np.random.default_rng([seed, 3, device, round])


class DeviceDropout(Exception):
    """A virtual device vanished in round `round` (raised while it serves a task)."""

    def __init__(self, message: str, round: int) -> None:
        super().__init__(message)
        self.round = round


@dataclass
class RoundRecord:
    """What one group saw of one round."""

    first_seen: float = float("inf")  # time.time() the round's global weights arrived
    trained: int = 0
    dropped_train: int = 0
    dropped_upload: int = 0
    bytes: int = 0
    devices: list[int] = field(default_factory=list)  # indices of the devices that uploaded


@dataclass
class GroupReport:
    """A group's records: per round, the global weights it first saw, and the end."""

    rounds: dict[int, RoundRecord] = field(default_factory=dict)
    weights: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    final: dict[str, np.ndarray] | None = None
    done_time: float = float("inf")
    offline_periods: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Device:
    """One virtual device: who it is and what it holds between rounds."""

    index: int
    rows: np.ndarray  # indices into the group's data
    traits: DeviceTraits
    rng: np.random.Generator
    secure: SecureTasks | None = None  # its secure round or held buffer update, if any


class DeviceGroup:
    """Many virtual devices in one process, sharing connections, models and Trainers."""

    def __init__(
        self,
        model: bytes,
        x: np.ndarray,
        y: np.ndarray,
        partitions: list[np.ndarray],
        traits: list[DeviceTraits],
        *,
        first_index: int = 0,
        trainable: set[str] | None = None,
        simulate_time: bool = True,
        seed: int = 0,
        lr: float = 0.05,
        epochs: int = 1,
        batch_size: int = 32,
        workers: int = TRAIN_WORKERS,
        upload_turns: int = UPLOAD_TURNS,
        poll_wait: float = 5.0,
        rpc_timeout: float = 600.0,
        give_up_after: float = 120.0,
        chunk_size: int = 512 << 10,
    ) -> None:
        if len(partitions) != len(traits):
            raise AppError(f"{len(partitions)} partitions for {len(traits)} devices")
        if workers < 1 or upload_turns < 1:
            raise AppError(
                f"`workers` and `upload_turns` must be >= 1, got {workers} and {upload_turns}"
            )
        self.model_bytes = len(model)
        self.base = lite.parse(model)
        # What secure rounds mask: the trainable weights, as the model cache reads them.
        self.template = template_of(WeightsReader(trainable_only=True).read(model))
        self.update_bytes = sum(
            int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            for shape, dtype in self.template.values()
        )
        self.x, self.y = x, y
        self.learner_args: dict[str, Any] = {
            "trainable": trainable,
            "lr": lr,
            "epochs": epochs,
            "batch_size": batch_size,
        }
        self.devices = [
            Device(first_index + k, rows, t, np.random.default_rng([seed, 2, first_index + k]))
            for k, (rows, t) in enumerate(zip(partitions, traits, strict=True))
        ]
        self.simulate_time, self.seed = simulate_time, seed
        self.workers, self.upload_turns = workers, upload_turns
        self.poll_wait, self.rpc_timeout = poll_wait, rpc_timeout
        self.give_up_after, self.chunk_size = give_up_after, chunk_size
        self.report = GroupReport()
        self._learners = threading.local()  # one LiteLearner per worker thread
        self._latest_round = 0
        # Made on the transport loop, by `_run`: set when the job ended, when a new round began.
        self._done: asyncio.Event
        self._progress: asyncio.Event

    # ---- training, on the worker threads
    def _learner(self) -> Any:
        from sporenet.federated.client.lite_client import LiteLearner

        learner = getattr(self._learners, "learner", None)
        if learner is None:
            first = self.devices[0].rows
            learner = LiteLearner(self.base, self.x[first], self.y[first], **self.learner_args)
            self._learners.learner = learner
        return learner

    def _train_on(
        self, device: Device, weights: Mapping[str, np.ndarray], config: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], int, dict[str, float], float]:
        """Train on the device's partition: (new weights, samples, metrics, seconds).
        The batch order is drawn from (seed, device, round), so a peer replaying the
        same cohorts (benchmarks/federated_learning.py) trains the very same updates."""
        learner = self._learner()
        learner.x, learner.y = self.x[device.rows], self.y[device.rows]
        learner.x_eval, learner.y_eval = learner.x, learner.y
        learner.rng = batch_rng(self.seed, device.index, int(config.get("round", 0)))
        start = time.perf_counter()
        new, samples, metrics = learner.train(weights, config)
        return new, samples, metrics, time.perf_counter() - start

    def _evaluate_on(
        self, device: Device, weights: Mapping[str, np.ndarray], config: dict[str, Any]
    ) -> tuple[float, int, dict[str, float]]:
        learner = self._learner()
        learner.x_eval, learner.y_eval = self.x[device.rows], self.y[device.rows]
        return learner.evaluate(weights, config)

    # ---- one task, on the loop
    def _record(self, rnd: int) -> RoundRecord:
        record = self.report.rounds.get(rnd)
        if record is None:
            record = self.report.rounds[rnd] = RoundRecord()
        return record

    def _saw_round(self, rnd: int) -> None:
        if rnd > self._latest_round:
            self._latest_round = rnd
            self._progress.set()
            self._progress = asyncio.Event()

    def _round_of(self, task: pb.Task) -> tuple[int, RoundRecord]:
        """The task's round and its record; the round is seen (begun) now."""
        rnd = int(json.loads(task.config_json or "{}").get("round", 0))
        record = self._record(rnd)
        record.first_seen = min(record.first_seen, time.time())
        self._saw_round(rnd)
        return rnd, record

    @contextlib.asynccontextmanager
    async def _heartbeats(
        self, p: Participant, task: pb.Task
    ) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """Heartbeats for `task` while the block runs; it may stop them early with the
        function it is given, which returns once the beat being written is done (a beat
        among an upload's chunks would break the upload)."""
        stop = asyncio.Event()
        beats = asyncio.ensure_future(p.heartbeats(task.task_id, stop))

        async def stopped() -> None:
            stop.set()
            await beats

        try:
            yield stopped
        finally:
            stop.set()
            if not beats.done():
                beats.cancel()

    async def _train(
        self, device: Device, p: Participant, task: pb.Task, rnd: int, record: RoundRecord
    ) -> tuple[Mapping[str, np.ndarray], dict[str, np.ndarray], int, dict[str, float]]:
        """Download (from the group's cache) and train on the task's model: (global
        weights, new weights, samples, metrics); compute and download time are slept as
        the device's traits say. DeviceDropout if the device vanishes while training."""
        weights = await self.models.weights(task, p.session(), p.client_id)
        if rnd not in self.report.weights:
            self.report.weights[rnd] = weights_of(weights)
        traits = device.traits
        if device.rng.random() < traits.dropout_train:
            record.dropped_train += 1
            raise DeviceDropout(
                f"device {device.index} dropped out while training round {rnd}", rnd
            )
        config = json.loads(task.config_json or "{}")
        loop = asyncio.get_running_loop()
        new, samples, metrics, compute = await loop.run_in_executor(
            self._pool, self._train_on, device, weights, config
        )
        if self.simulate_time:
            wire = 2 * traits.latency_s
            if traits.bandwidth_bps > 0:
                wire += self.model_bytes / traits.bandwidth_bps
            await asyncio.sleep(compute * max(0.0, traits.speed - 1.0) + wire)
        return weights, new, samples, metrics

    async def _send(self, device: Device, record: RoundRecord, rnd: int, size: int) -> None:
        """The time an update of `size` bytes takes to leave the device (slept), or
        DeviceDropout if the device vanishes before it is sent."""
        traits = device.traits
        if self.simulate_time:
            wire = 2 * traits.latency_s
            if traits.bandwidth_bps > 0:
                wire += size / traits.bandwidth_bps
            await asyncio.sleep(wire)
        if device.rng.random() < traits.dropout_upload:
            record.dropped_upload += 1
            record.bytes += self.model_bytes
            raise DeviceDropout(
                f"device {device.index} dropped out before uploading round {rnd}", rnd
            )

    async def _fit(self, device: Device, p: Participant, task: pb.Task) -> None:
        rnd, record = self._round_of(task)
        async with self._heartbeats(p, task) as stop_beats:
            weights, new, samples, metrics = await self._train(device, p, task, rnd, record)
            up = sum(int(np.asarray(v).nbytes) for v in new.values())
            await self._send(device, record, rnd, up)
            record.bytes += self.model_bytes + up
            async with self._upload_turns:
                # The server hears from the device while it waits for a receiving slot.
                await stop_beats()
                trained = {k: np.asarray(new[k], dtype=w.dtype) for k, w in weights.items()}
                payload = encode_raw(trained, weights, alloc=self._buffers.take)
                del new, trained
                try:
                    # The next poll rides with the update (the session stays open).
                    await p.upload(task, payload, samples, metrics, then_poll=self.models.held)
                finally:
                    if isinstance(payload, memoryview):
                        self._buffers.give(payload)
            # Counted once accepted: an update refused (its round closed, too stale) is not.
            record.trained += 1
            record.devices.append(device.index)

    # ---- secure aggregation: the client SDK's steps (SecureTasks), sent by the device
    def _secure_of(self, device: Device) -> SecureTasks:
        if device.secure is None:
            device.secure = SecureTasks()
        return device.secure

    async def _buffer_fit(self, device: Device, p: Participant, task: pb.Task) -> None:
        """A secure async buffer's training task: train (once), hold the update, say READY."""
        tasks = self._secure_of(device)
        rnd, record = self._round_of(task)
        trained = None
        if not tasks.holds(task):
            async with self._heartbeats(p, task):
                weights, new, samples, metrics = await self._train(device, p, task, rnd, record)
            trained = trained_delta(weights, new, samples, metrics)
            del new
            record.bytes += self.model_bytes  # the update counts once masked for a buffer
        await p.submit_secure(tasks.ready(task, p.client_id, trained))

    async def _secure_fit(self, device: Device, p: Participant, task: pb.Task) -> None:
        """One stage of a secure round or buffer; a round trains at its masked input."""
        tasks = self._secure_of(device)
        if tasks.sitting_out(task):
            p.close()
            await asyncio.sleep(max(task.retry_after_ms / 1000.0, 0.5))
            return
        config = json.loads(task.config_json or "{}")
        in_buffer = SECURE_WEIGHT_KEY in config
        if in_buffer:  # the buffer's round began with its training tasks
            rnd = int(config.get("round", 0))
            record = self._record(rnd)
        else:
            rnd, record = self._round_of(task)
        trained = None
        if tasks.needs_training(task):
            async with self._heartbeats(p, task):
                weights, new, samples, metrics = await self._train(device, p, task, rnd, record)
            trained = trained_delta(weights, new, samples, metrics)
            del new
        masking = task.secure_stage == pb.SECURE_MASKED_INPUT
        if masking:
            await self._send(device, record, rnd, self.update_bytes)
        reply = tasks.answer(task, p.client_id, lambda: self.template, trained)
        if masking and not reply.withdraws:
            record.trained += 1
            record.devices.append(device.index)
            record.bytes += len(reply.body) + (0 if in_buffer else self.model_bytes)
        await p.submit_secure(reply)

    async def _evaluate(self, device: Device, p: Participant, task: pb.Task) -> None:
        weights = await self.models.weights(task, p.session(), p.client_id)
        config = json.loads(task.config_json or "{}")
        loss, samples, metrics = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._evaluate_on, device, weights, config
        )
        await p.report_evaluation(task, loss, samples, metrics)

    # ---- one device's life
    async def _serve(self, device: Device, p: Participant) -> dict[str, np.ndarray]:
        """Serve tasks until the job ends (its final weights); retries as a Client does."""
        loop = asyncio.get_running_loop()
        backoff, unreachable_since = 0.1, None
        while True:
            try:
                if not p.client_id:
                    await p.register()
                asked, held = loop.time(), self.models.held
                task = await p.poll(held)
                backoff, unreachable_since = 0.1, None
                final = await self._serve_task(device, p, task, asked, held)
                if final is not None:
                    return final
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                p.close()
                if code == grpc.StatusCode.NOT_FOUND:
                    p.client_id = ""  # the server forgot it: register again
                    continue
                if code in FATAL:
                    raise AuthError(f"server refused the device: {code.name}") from None
                if code not in RETRYABLE:
                    log.warning(
                        "device %d: task failed: %s: %s", device.index, code.name, e.details()
                    )
                    await asyncio.sleep(0.05)
                    continue
                now = loop.time()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > self.give_up_after:
                    raise TransferError(
                        f"server unreachable for {self.give_up_after:g} s ({code.name})"
                    ) from None
                await asyncio.sleep(backoff * (0.5 + device.rng.random()))
                backoff = min(backoff * 2, 5.0)
            except (TransferError, MalformedMessageError) as e:
                log.info("device %d: %s; retrying", device.index, e)
                p.close()
                await asyncio.sleep(0.1)

    async def _serve_task(
        self, device: Device, p: Participant, task: pb.Task, asked: float, held: str
    ) -> dict[str, np.ndarray] | None:
        """Do one task (polled at loop time `asked`, holding model `held`); the job's
        final weights once it is DONE."""
        if task.type == pb.TASK_FIT:
            if json.loads(task.config_json or "{}").get(SECURE_BUFFER_KEY):
                await self._buffer_fit(device, p, task)
            else:
                await self._fit(device, p, task)
        elif task.type == pb.TASK_SECURE_FIT:
            await self._secure_fit(device, p, task)
        elif task.type == pb.TASK_EVALUATE:
            await self._evaluate(device, p, task)
        elif task.type == pb.TASK_DONE:
            final = await self.models.weights(task, p.session(), p.client_id)
            if task.model_sha256 != held:
                await self._acknowledge(p, task)
            return final
        else:  # nothing to do: idle, the device holds no stream
            p.close()
            if asyncio.get_running_loop().time() - asked < self.poll_wait / 2:
                await asyncio.sleep(task.retry_after_ms / 1000.0 * (0.5 + device.rng.random()))
        return None

    async def _acknowledge(self, p: Participant, task: pb.Task) -> None:
        """Poll once more, saying the device now holds the final model: the server counts
        a device as told the job ended only when it has that model (a download of its own
        counts, one from the group's cache does not). Best effort: the job is over."""
        with contextlib.suppress(grpc.RpcError, FederatedError):
            await p.poll(task.model_sha256)

    async def _away(self, seconds: float) -> None:
        """Stay offline for `seconds`, or until the job ended."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._done.wait()

    def _online_for(self, device: Device) -> float:
        t = device.traits
        return (
            math.inf if t.online_fraction >= 1 else float(device.rng.exponential(t.mean_online_s))
        )

    def _offline_for(self, device: Device) -> float:
        t = device.traits
        mean_off = t.mean_online_s * (1 - t.online_fraction) / t.online_fraction
        return float(device.rng.exponential(mean_off)) if mean_off > 0 else 0.0

    async def _wait_for_round_after(self, gone: int, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._latest_round <= gone and not self._done.is_set():
                    await self._progress.wait()

    async def _live(self, device: Device, channel: grpc.aio.Channel) -> None:
        """Come and go as the device's traits say until the job ends."""
        while not self._done.is_set():
            online = self._online_for(device)
            p = Participant(
                channel,
                f"device-{device.index}",
                poll_wait=self.poll_wait,
                rpc_timeout=self.rpc_timeout,
                chunk_size=self.chunk_size,
            )
            period = asyncio.timeout(None if math.isinf(online) else online)
            try:
                async with period:
                    final = await self._serve(device, p)
            except TimeoutError:
                if not period.expired():
                    raise
                self.report.offline_periods += 1
                p.close()
                await self._away(self._offline_for(device))
                continue
            except DeviceDropout as exc:  # gone for the rest of its round, or rejoin_after_s
                p.close()
                device.secure = None  # a vanished device's secrets are gone with it
                await self._wait_for_round_after(exc.round, device.traits.rejoin_after_s)
                continue
            finally:
                p.close()
            if self.report.final is None:
                self.report.final = weights_of(final)
            self.report.done_time = min(self.report.done_time, time.time())
            self._done.set()
            self._progress.set()
            return

    async def _device(self, k: int, device: Device) -> None:
        try:
            await self._live(device, self._channels.channel(k))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported, the other devices go on
            log.warning("device %d failed: %r", device.index, exc)
            self.report.errors.append(f"device {device.index}: {type(exc).__name__}: {exc}")

    async def _run(self, address: str, timeout: float) -> GroupReport:
        self._done, self._progress = asyncio.Event(), asyncio.Event()
        self._channels = ChannelPool(address, len(self.devices))
        self.models = ModelCache(chunk_size=self.chunk_size, rpc_timeout=self.rpc_timeout)
        self._upload_turns = asyncio.Semaphore(self.upload_turns)
        self._buffers = BufferPool(limit=self.upload_turns)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="fleet-train")
        lives = [asyncio.ensure_future(self._device(k, d)) for k, d in enumerate(self.devices)]
        everyone = asyncio.gather(*lives)
        finished = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait(
                (everyone, finished), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not self._done.is_set() and not everyone.done():
                self.report.errors.append(f"the job did not end within {timeout:g} s")
            elif not everyone.done():  # the devices still online poll once more
                await asyncio.wait((everyone,), timeout=DONE_GRACE_S)
        finally:
            finished.cancel()
            for life in lives:
                life.cancel()
            await asyncio.gather(everyone, return_exceptions=True)
            await self._channels.close()
            self._pool.shutdown(wait=False)
        return self.report

    def run(self, address: str, *, timeout: float = 3600.0) -> GroupReport:
        """Run every device until the server's job ends (or `timeout`); the group's report."""
        return TransportLoop.shared().run(self._run(address, timeout))
