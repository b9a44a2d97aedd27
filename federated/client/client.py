"""The client SDK: register, fetch the model, train with a user callable, upload the update.

    def train(weights, config):
        new = {k: w - config.get("lr", 0.1) * grad(k, w) for k, w in weights.items()}
        return new, num_samples, {"loss": 0.42}

    final = Client("127.0.0.1:8080", train=train, name="phone-1").run()

The client heartbeats while `train` runs (so long local training is not mistaken for a
dropout), retries with exponential backoff and jitter when the server is unreachable
(including across a server restart), resumes interrupted downloads and uploads from the
last byte received, and re-sends an update it already computed instead of training
again. Updates are deltas (trained minus global weights), optionally compressed with
int8 quantization and/or top-k sparsification; with compression, what was not sent is
carried into the next round (error feedback).

An idle client polls with a unary `Poll` (federated.proto), answered at once with its task
or with the pause, chosen and jittered by the server, before it asks again: it holds no
stream, which would cost the server as much memory again as its connection. While it
works on a task it talks over one `Session` stream: the model's chunks, its update (sent
once the server grants a receiving slot) and heartbeats, authenticated once when the
stream opens; the stream closes when the client is idle again. The sessions of every
client in a process run as coroutines on one shared event loop
(session_stream.TransportLoop); `run()`, `train` and `evaluate` stay on the caller's
thread, which hands the loop a whole exchange at a time. After each update the client
moves to a new connection, because the server's gRPC keeps receive buffers per
connection. Registration, polls, evaluation reports and secure-aggregation messages are
single calls over the same connection.

The bytes themselves (models held, resumable downloads, pooled buffers, chunked and
checksummed uploads) are moved by the client's `Transfers` (transfers.py); client-side
differential privacy is in dp.py.

When the server runs secure aggregation, a fit round arrives as TASK_SECURE_FIT tasks,
one per protocol stage: the client answers each with a `SecureClientSession` (one per
round), trains once when the masked-input stage comes, and sends only the masked update
(compression does not apply); secure.py's `SecureTasks` says what to send for each
stage, the client sends it. A reply lost to a failure is resent byte for byte. With
distributed differential privacy on the server, the task config carries
`dp_noise_multiplier`, `dp_clipping_norm` and `dp_min_clients`: the client clips its delta
and adds its share of the Gaussian noise before masking (privacy/distributed.py); with
local DP (`dp_local_noise_multiplier`), all of the noise before any upload (privacy/local.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import grpc
import numpy as np

from sporenet.federated.aggregation import Template, Weights, template_of
from sporenet.federated.client.dp import asks_client_dp, privatize
from sporenet.federated.client.failover import Failover
from sporenet.federated.client.reachability import Reachability, text_report
from sporenet.federated.client.secure import SecureReply, SecureTasks, Trained, trained_delta
from sporenet.federated.client.session_stream import SessionStream, TransportLoop
from sporenet.federated.client.settings import GIVE_UP_AFTER, ClientSettings, addresses_of
from sporenet.federated.client.transfers import PendingUpload, Transfers
from sporenet.federated.common.auth import Credentials
from sporenet.federated.common.codec import decode_update, encode_raw, encode_update
from sporenet.federated.common.wire import (
    SECURE_BUFFER_KEY,
    SessionReplyField,
    SessionRequestField,
    method_path,
)
from sporenet.federated.errors import (
    AuthError,
    ConfigError,
    JobFailedError,
    MalformedMessageError,
    TransferError,
)
from sporenet.lite import WeightsReader, read_weights
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc

TrainFn = Callable[
    [Weights, dict[str, Any]], tuple[Mapping[str, np.ndarray], int, Mapping[str, float]]
]
EvaluateFn = Callable[[Weights, dict[str, Any]], tuple[float, int, Mapping[str, float]]]

# Transient failures: wait and try again. Anything else is reported and, if fatal, raised.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.OUT_OF_RANGE,  # upload offset mismatch: ask the server where to resume
}
FATAL = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
# After a task, the next poll may be held this long (seconds): what follows a task (the
# next secure stage, the next round) is heard of at once instead of after a pause.
FOLLOW_UP_WAIT = 2.0
log = logging.getLogger("sporenet.federated.client")


class Client(Failover):
    """One federated client: `run()` serves tasks until the job is done."""

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        train: TrainFn,
        evaluate: EvaluateFn | None = None,
        credentials: Credentials | None = None,
        name: str = "",
        compression: tuple[str, ...] | list[str] = (),
        topk_ratio: float = 0.01,
        poll_wait: float = 0.0,
        max_backoff: float = 5.0,
        give_up_after: float | None = GIVE_UP_AFTER,
        failover_after: float = 30.0,
        chunk_size: int = 512 << 10,
        download_chunk_size: int = 0,
        upload_connection: str = "separate",
        rpc_timeout: float = 60.0,
    ) -> None:
        """A client of the `sporenet-server` (or edge) at `address`; nothing connects
        until `run()`.

        Args:
            address: "host:port" of the server (TLS unless it is a loopback address), or
                several: the client uses the first and, when it stays unreachable for
                `failover_after` seconds, moves to the next (after the last, the first
                again) and registers there.
            train: `train(weights, config) -> (new_weights, num_samples, metrics)`, called
                with a copy of the global weights and the task's config each fit round.
            evaluate: `evaluate(weights, config) -> (loss, num_samples, metrics)` for
                evaluation rounds (None: the client sits them out).
            credentials: authentication and TLS settings (default: none, loopback only).
            name: a stable name the server registers this client under (ignored when the
                server authenticates clients: the identity is the name).
            compression: update compressions to apply: "int8", "topk" or both.
            topk_ratio: the fraction of values "topk" keeps.
            poll_wait: seconds the server may hold a poll while there is nothing to do
                (default 0: answered at once, then the client waits the pause the
                server suggests; a held poll costs the server memory per client).
            max_backoff: the longest pause between retries while the server is away.
            give_up_after: seconds without reaching any server after which `run()`
                raises (default 600; None: retry forever). Meanwhile the first failure
                is logged as a warning naming the address and the error, then a summary
                every 30 s, and `status()` reports it.
            failover_after: seconds the current address may stay unreachable before the
                client moves to the next one (with several addresses).
            chunk_size: bytes per upload message.
            download_chunk_size: bytes per download message (0: the server's choice).
            upload_connection: "separate" moves to a new connection after each upload
                (the server then frees that connection's buffers), "shared" keeps one.
            rpc_timeout: seconds before an unanswered call is retried.

        Raises:
            ConfigError: a setting is out of range, or a non-loopback address without
                `root_certificates` in `credentials`.
        """
        self.settings = settings = ClientSettings(
            addresses=addresses_of(address),
            credentials=credentials or Credentials(),
            name=name,
            compression=tuple(compression),
            topk_ratio=topk_ratio,
            poll_wait=poll_wait,
            max_backoff=max_backoff,
            give_up_after=give_up_after,
            failover_after=failover_after,
            chunk_size=chunk_size,
            download_chunk_size=download_chunk_size,
            upload_connection=upload_connection,
            rpc_timeout=rpc_timeout,
        )
        self.train, self.evaluate = train, evaluate
        self._init_link(settings)
        self._init_transport(settings)
        self._init_rounds()

    def _init_link(self, s: ClientSettings) -> None:
        """The addresses, the retry and failover state, what `status()` reports."""
        self.addresses, self._at = list(s.addresses), 0
        self.address = self.addresses[0]  # the one in use
        self.failover_after, self.failovers = s.failover_after, 0
        # Retry state: the next backoff, since when no server answered, since when this one.
        self._backoff = 0.1
        self._unreachable_since: float | None = None
        self._here_since: float | None = None
        self.link = Reachability(self.address, report=text_report(log))
        self.name, self.credentials = s.name, s.credentials
        self.compression, self.topk_ratio = s.compression, s.topk_ratio
        self.poll_wait, self.max_backoff = s.poll_wait, s.max_backoff
        self.give_up_after = s.give_up_after
        self._stop = threading.Event()
        self._worked = False  # whether the last poll brought a task (see _poll_wait)
        self._tls_checked = False  # whether a closed connection was checked for TLS
        self.client_id: str | None = None
        self._heartbeat_interval = 5.0

    def _init_transport(self, s: ClientSettings) -> None:
        """The shared event loop, the channel and session, the client's Transfers."""
        # Uploads go in `chunk_size` messages; downloads use the server's chunks.
        self.chunk_size, self.rpc_timeout = s.chunk_size, s.rpc_timeout
        self.download_chunk_size = s.download_chunk_size
        self.upload_connection = s.upload_connection
        # Sessions run on the process's shared event loop, over an asyncio channel of their own.
        self._transport = TransportLoop.shared()
        self._aio_channel: grpc.aio.Channel | None = None
        self._session: SessionStream | None = None
        # Models held, a download in progress, and the buffers models and updates share.
        self._transfers = Transfers(
            run=self._in_session,
            open_session=self._open_session,
            client_id=lambda: self.client_id or "",
            chunk_size=s.chunk_size,
            download_chunk_size=s.download_chunk_size,
            rpc_timeout=s.rpc_timeout,
        )
        self._buffers = self._transfers.buffers

    def _init_rounds(self) -> None:
        """What carries over between tasks: parsed weights, the pending update, the
        compression residual, the open secure round, the results."""
        # Each round's model differs from the last only in its weights: parsed once.
        # The federated weights: the model's trainable tensors (every float constant when
        # none is flagged); train() and evaluate() get those, and the update carries them.
        self._weights_reader = WeightsReader(trainable_only=True)
        self._pending: PendingUpload | None = None
        self._residual: Weights = {}
        # The open secure round, a secure buffer's held update (secure.py).
        self._secure = SecureTasks()
        self.rounds_trained = 0
        self.final_model: bytes | None = None

    # -- plumbing ------------------------------------------------------------------------

    def _aio(self) -> grpc.aio.Channel:
        """The sessions' channel, opened if needed (call it on the transport loop)."""
        if self._aio_channel is None:
            self._aio_channel = self._new_aio_channel()
        return self._aio_channel

    def _new_aio_channel(self) -> grpc.aio.Channel:
        # One connection per client, even when a simulation runs many in one process: gRPC
        # would otherwise share one HTTP/2 connection, whose stream limit (100 by default)
        # then queues polls and transfers behind each other.
        options = [("grpc.use_local_subchannel_pool", 1)]
        # gRPC's own reconnection backoff grows to 120 s, and calls fail at once while it
        # waits: cap it at `max_backoff` so a restarted server (or edge) is reached as
        # soon as the client's own retries say.
        backoff_ms = int(self.max_backoff * 1000)
        options += [
            ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ]
        creds = self.credentials.channel_credentials()
        return grpc.aio.secure_channel(self.address, creds, options=options)

    def close(self) -> None:
        """Close the client's connections."""
        self._disconnect()

    def _disconnect(self) -> None:
        self._drop_session()
        channel, self._aio_channel = self._aio_channel, None
        if channel is not None:
            self._transport.spawn(channel.close())

    def _open_session(self) -> SessionStream:
        """The open Session stream, opened (authenticated) anew after any failure; call it
        on the transport loop."""
        if self._session is None or self._session.closed:
            self._session = SessionStream(self._aio(), method_path("Session"))
        return self._session

    def _drop_session(self) -> None:
        """Close the session: after a failed exchange its next replies are out of step."""
        session, self._session = self._session, None
        if session is not None:
            self._transport.call(session.close)

    def _in_session(self, exchange: Any) -> Any:
        """Run the coroutine `exchange` on the transport loop and wait for its result."""
        return self._transport.run(exchange)

    def stop(self) -> None:
        """Ask `run()` to return at its next step."""
        self._stop.set()

    def status(self) -> dict[str, Any]:
        """The link to the server as JSON: `state` (connecting, connected, unreachable),
        `address`, `error` (gRPC's status and details of the last failed call),
        `unreachable_since` (unix time), `attempts` and `retry_in` (seconds)."""
        return {**self.link.status(), "client_id": self.client_id, "failovers": self.failovers}

    def _call(self, method: str, request: Any, timeout: float) -> Any:
        """A unary or client-streaming call, over the session's connection: a second
        connection per client would cost the server memory for every client of the fleet."""
        return self._transport.run(self._call_on_loop(method, request, timeout))

    async def _call_on_loop(self, method: str, request: Any, timeout: float) -> Any:
        call = getattr(pb_grpc.FederatedStub(self._aio()), method)
        return await call(request, timeout=timeout)

    def _register(self) -> None:
        request = pb.RegisterRequest(client_name=self.name, compression=list(self.compression))
        reply = self._call("Register", request, self.rpc_timeout)
        self.client_id = reply.client_id
        self._heartbeat_interval = max(reply.heartbeat_interval_ms / 1000.0, 0.05)
        log.info("registered as %s", self.client_id)

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> Weights | None:
        """Serve tasks until the job ends.

        Args:
            stop: set it (from another thread) to make `run()` return at its next step.

        Returns:
            The job's final global weights, or None when stopped first.

        Raises:
            AuthError: the server refused this client's credentials.
            JobFailedError: the job failed on the server (the message gives its reason,
                e.g. that every update of this client was refused).
            FederatedError: the server stayed unreachable for `give_up_after` seconds.
            ConfigError: `train` returned weights without some of the model's tensors,
                or the server expects TLS and `credentials` have no `root_certificates`.
        """
        if stop is not None:
            self._stop = stop
        self._reached(answered=False)
        while not self._stop.is_set():
            try:
                if self.client_id is None:
                    self._register()
                asked, wait = time.monotonic(), self._poll_wait()
                task = self._get_task(wait)
                self._reached()
                self._worked = task.type != pb.TASK_WAIT
                if task.type == pb.TASK_FIT:
                    self._fit(task)
                elif task.type == pb.TASK_EVALUATE:
                    self._evaluate(task)
                elif task.type == pb.TASK_SECURE_FIT:
                    self._secure_fit(task)
                elif task.type == pb.TASK_DONE:
                    return self._done(task)
                else:
                    self._idle(task, wait, time.monotonic() - asked)
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                if code == grpc.StatusCode.NOT_FOUND:
                    log.warning(
                        "server does not know this client (%s); registering again", e.details()
                    )
                    self.client_id = None
                    continue
                if code in FATAL:
                    raise AuthError(
                        f"server refused the client: {code.name}: {e.details()}"
                    ) from None
                if code not in RETRYABLE:
                    # INVALID_ARGUMENT / FAILED_PRECONDITION: this task is lost, ask for the next.
                    log.warning("task failed: %s: %s", code.name, e.details())
                    self._pending = None
                    self._stop.wait(0.05)
                    continue
                self._check_not_tls(code, e.details() or "")
                self._unreachable(code, e.details() or "")
            except (TransferError, MalformedMessageError) as e:
                log.warning("%s; retrying", e)
                self._drop_session()
                self._stop.wait(0.1)
        return None

    def _poll_wait(self) -> float:
        """How long the next poll may be held: `poll_wait`, or after a task at least
        FOLLOW_UP_WAIT, since the next one (a secure stage, the next round) often follows
        within seconds; only clients that just worked hold a call that long, not the
        idle fleet."""
        return max(self.poll_wait, FOLLOW_UP_WAIT) if self._worked else self.poll_wait

    def _idle(self, task: pb.Task, wait: float, held: float) -> None:
        """Nothing to do: close the task stream (it would cost the server memory until the
        next task) and, unless the poll was held a while, wait the server's pause."""
        self._drop_session()
        if not wait or held < wait / 2:
            # Jittered by the server; here too for a server that suggests none.
            self._stop.wait(task.retry_after_ms / 1000.0 or 0.5 + random.random())

    def _done(self, task: pb.Task) -> Weights:
        """The job's final weights; JobFailedError with the server's reason if it failed."""
        if json.loads(task.config_json or "{}").get("job_status") == "failed":
            raise JobFailedError(f"the server's job failed: {task.reason}")
        try:
            self.final_model = bytes(self._model_bytes(task))
        finally:
            self._drop_session()  # the job is over: no stream stays open
        log.info("job done (%s)", task.reason)
        return {k: np.array(v) for k, v in read_weights(self.final_model).items()}

    def _get_task(self, wait: float | None = None) -> pb.Task:
        """The next task, by a unary Poll held up to `wait` seconds (default `poll_wait`):
        an idle client holds no stream, which would cost the server as much memory again
        as its connection. The task's model then comes over a Session, opened for it."""
        wait = self.poll_wait if wait is None else wait
        request = pb.TaskRequest(
            client_id=self.client_id or "",
            wait_ms=int(wait * 1000),
            held_model_sha256=self._transfers.held_sha256(),
        )
        return cast(pb.Task, self._call("Poll", request, wait + self.rpc_timeout))

    async def _poll_in_session(self, request: pb.TaskRequest, timeout: float) -> pb.Task:
        """Poll, and receive the task's model when the server sends it along."""
        session = self._open_session()
        await session.send(SessionRequestField.POLL, request.SerializeToString())
        _, body = await session.receive((SessionReplyField.TASK,), timeout)
        task = pb.Task.FromString(bytes(body))
        if request.send_model and task.model_sha256 not in ("", request.held_model_sha256):
            await self._transfers.download_in_session(task, requested=True)
        return task

    # -- tasks -------------------------------------------------------------------------------

    def _model_bytes(self, task: pb.Task) -> memoryview:
        """The task's model, downloaded once (resuming a partial download) and checked."""
        return self._transfers.model_bytes(task)

    def _drop_models(self) -> None:
        """Forget the models held; their buffers serve the next download or update."""
        self._transfers.drop_models()

    def _start_heartbeats(self, task_id: str) -> Callable[[], None]:
        """Heartbeat over the session every interval until the returned function is called.

        That function returns only once the beats have stopped, a beat being written
        included, so no heartbeat frame can land between the chunks of the upload
        that follows.
        """
        stop = asyncio.Event()
        beats = self._transport.spawn(self._heartbeats_in_session(task_id, stop))

        def stop_and_wait() -> None:
            self._transport.call(stop.set)
            try:
                beats.result(timeout=max(4 * self._heartbeat_interval, 5.0))
            except concurrent.futures.TimeoutError:  # a write stuck that long: end it
                beats.cancel()
            except Exception as e:  # a failed beat is not fatal: the upload finds out
                log.debug("heartbeat ended with %r", e)

        return stop_and_wait

    async def _heartbeats_in_session(self, task_id: str, stop: asyncio.Event) -> None:
        """Heartbeats over the session every interval until `stop` is set."""
        request = pb.HeartbeatRequest(client_id=self.client_id or "", task_id=task_id)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat_interval):
                    await stop.wait()
            if stop.is_set():
                return
            # The main loop handles failures; a missed beat is not fatal.
            with contextlib.suppress(grpc.RpcError, TransferError):
                await self._open_session().send(
                    SessionRequestField.HEARTBEAT, request.SerializeToString()
                )

    def _fit(self, task: pb.Task) -> None:
        if json.loads(task.config_json or "{}").get(SECURE_BUFFER_KEY):
            self._buffer_fit(task)
            return
        pending = self._pending
        if pending is None or pending.task_id != task.task_id:
            pending = self._train(task)
            self._pending = pending
        # else: computed before a failure: send it again (from where it stopped), no retraining
        self._upload(pending)
        self._pending = None
        if isinstance(pending.payload, memoryview):
            self._buffers.give(pending.payload)
        self._drop_models()  # the next task needs a newer model
        self.rounds_trained += 1

    def _run_train(self, task: pb.Task) -> tuple[Weights, dict, Weights, int, Any]:
        """Call the user's train() on the task's model while heartbeating; returns the
        global weights, the task config, the new weights, the sample count, the metrics."""
        global_weights = self._weights_reader.read(self._model_bytes(task))
        config = json.loads(task.config_json or "{}")
        stop_heartbeats = self._start_heartbeats(task.task_id)
        try:
            new, num_samples, metrics = self.train(
                {k: v.copy() for k, v in global_weights.items()}, config
            )
        finally:
            stop_heartbeats()
        missing = sorted(set(global_weights) - set(new))
        if missing:
            raise ConfigError(f"train() returned weights without tensors {missing}")
        return global_weights, config, new, num_samples, metrics

    def _train(self, task: pb.Task) -> PendingUpload:
        # Read-only views into the model bytes: train() gets its own copies below.
        global_weights, config, new, num_samples, metrics = self._run_train(task)
        trained = {k: np.asarray(new[k], dtype=w.dtype) for k, w in global_weights.items()}
        payload: bytes | bytearray | memoryview
        if not self.compression and not asks_client_dp(config):
            # The common case: the delta is computed straight into the upload buffer.
            payload = encode_raw(trained, global_weights, alloc=self._buffers.take)
        else:
            payload = self._encode_delta(
                privatize(config, {k: trained[k] - w for k, w in global_weights.items()})
            )
        return PendingUpload(
            task.task_id,
            f"{task.task_id}-{os.urandom(6).hex()}",
            payload,
            int(num_samples),
            json.dumps({k: float(v) for k, v in dict(metrics).items()}),
        )

    def _encode_delta(self, delta: Weights) -> bytes:
        """The upload of a (privatized) delta, compressed with error feedback if asked."""
        if self.compression:
            for k, d in delta.items():
                d += self._residual.get(k, 0.0)
            payload = encode_update(delta, compression=self.compression, topk_ratio=self.topk_ratio)
            sent = decode_update(payload, template_of(delta))
            self._residual = {k: delta[k] - sent[k] for k in delta}
            return payload
        return encode_update(delta)

    def _train_delta(self, task: pb.Task) -> Trained:
        """Train on the task's model (heartbeating); (delta, samples, metrics JSON)."""
        global_weights, _config, new, num_samples, metrics = self._run_train(task)
        return trained_delta(global_weights, new, num_samples, metrics)

    # -- secure tasks (secure.py says what to send; these send it) ---------------------------

    def _secure_fit(self, task: pb.Task) -> None:
        """Answer one stage of a secure round; train (once) at the masked-input stage."""
        if self._secure.sitting_out(task):
            self._stop.wait(max(task.retry_after_ms / 1000.0, 0.5))
            return
        trained = None
        if self._secure.needs_training(task):
            trained = self._train_delta(task)
            self.rounds_trained += 1

        def template() -> Template:
            return template_of(self._weights_reader.read(self._model_bytes(task)))

        reply = self._secure.answer(task, self.client_id or "", template, trained)
        self._submit_secure(reply)
        if reply.ends_round:
            self._drop_models()  # the next task needs a newer model

    def _buffer_fit(self, task: pb.Task) -> None:
        """A secure buffer's training task: train on its version (once), hold the update
        and say READY; the secure stages follow when the buffer's instance forms."""
        trained = None
        if not self._secure.holds(task):
            trained = self._train_delta(task)
            self.rounds_trained += 1
        self._submit_secure(self._secure.ready(task, self.client_id or "", trained))
        self._drop_models()  # the secure stages carry the current model

    def _withdraw(self, task: pb.Task) -> None:
        """Tell the server this client leaves the secure round (best effort), and sit it out."""
        self._submit_secure(self._secure.withdrawal(task, self.client_id or ""))

    def _submit_secure(self, reply: SecureReply) -> None:
        if reply.withdraws:  # best effort: if it fails, the stage deadline decides
            with contextlib.suppress(grpc.RpcError):
                self._call("SubmitSecure", reply.chunks(self.chunk_size), self.rpc_timeout)
            return
        self._call("SubmitSecure", reply.chunks(self.chunk_size), reply.timeout(self.rpc_timeout))

    def _upload(self, p: PendingUpload) -> None:
        try:
            self._transfers.upload(p)
        finally:
            if self.upload_connection == "separate":
                # A gRPC server keeps buffers sized to what a connection received for as
                # long as it stays open, so a fleet of idle clients whose long-lived
                # connections once carried an update would hold server memory in proportion
                # to the fleet: after its update the client moves to a new connection. (It
                # waits for its upload slot on the old one: one connection per client.)
                self._disconnect()

    def _evaluate(self, task: pb.Task) -> None:
        if self.evaluate is None:
            # Nothing to report: the phase's deadline closes it without this client.
            self._stop.wait(max(self.poll_wait, 1.0))
            return
        model = self._weights_reader.read(self._model_bytes(task))
        weights = {k: np.array(v) for k, v in model.items()}
        loss, num_samples, metrics = self.evaluate(weights, json.loads(task.config_json or "{}"))
        report = pb.EvaluationReport(
            client_id=self.client_id or "",
            task_id=task.task_id,
            loss=float(loss),
            num_samples=int(num_samples),
            metrics_json=json.dumps({k: float(v) for k, v in metrics.items()}),
        )
        self._call("ReportEvaluation", report, self.rpc_timeout)
