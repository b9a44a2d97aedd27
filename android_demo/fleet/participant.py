"""One virtual device's side of the federated protocol, as coroutines on the shared loop.

The calls a `sporenet.federated.Client` makes, spoken by a coroutine instead of a thread:
Register; a unary Poll for a task while idle (an idle device holds no stream); while it
works on a task, one Session stream for the model, its heartbeats, its upload and the
poll for the next task, closed once that poll finds nothing to do; SubmitSecure for the
secure stages; evaluation reports. A thousand devices then cost a thousand small objects
and calls multiplexed over a few connections (shared.ChannelPool), not a thousand
threads and connections. What a device does with a task (train, drop out, upload,
answer a secure stage) is devices.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping

import grpc
import numpy as np

from sporenet.android_demo.fleet.shared import loop_transfers
from sporenet.federated.client.secure import SecureReply
from sporenet.federated.client.session_stream import SessionStream
from sporenet.federated.client.transfers import PendingUpload
from sporenet.federated.common.wire import SessionReplyField, SessionRequestField, method_path
from sporenet.federated.errors import FederatedError
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc


class Participant:
    """A registered device's connection to the server: its id, its Session while it works."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        name: str,
        *,
        poll_wait: float,
        rpc_timeout: float,
        chunk_size: int,
    ) -> None:
        self.channel, self.name = channel, name
        self.stub = pb_grpc.FederatedStub(channel)
        self.poll_wait, self.rpc_timeout, self.chunk_size = poll_wait, rpc_timeout, chunk_size
        self.client_id = ""
        self.heartbeat_interval = 5.0
        self._session: SessionStream | None = None
        # When the poll that rode with the last upload is to be answered on the session:
        # the model sha256 it said the device holds.
        self._ridden: str | None = None

    def session(self) -> SessionStream:
        """The open Session stream, opened when a task needs it (and anew after a failure)."""
        if self._session is None or self._session.closed:
            self._session = SessionStream(self.channel, method_path("Session"))
        return self._session

    def close(self) -> None:
        """End the session (the device is idle, or gone: then the server sees it go silent)."""
        self._ridden = None
        session, self._session = self._session, None
        if session is not None:
            session.close()

    async def register(self) -> None:
        reply = await self.stub.Register(
            pb.RegisterRequest(client_name=self.name), timeout=self.rpc_timeout
        )
        self.client_id = reply.client_id
        self.heartbeat_interval = max(reply.heartbeat_interval_ms / 1000.0, 0.05)

    async def poll(self, held: str = "", wait: float | None = None) -> pb.Task:
        """The next task, which the server may hold up to `wait` seconds (default
        `poll_wait`): asked on the Session while one is open (the poll right after a
        task: one message on an open stream, not a new call), else by a unary Poll.
        Models come from the group's cache, over a Session; `held` is the sha256 of the
        newest model the device holds there (a DONE task for that model tells the server
        the device has the job's final model)."""
        wait = self.poll_wait if wait is None else wait
        session, ridden, self._ridden = self._session, self._ridden, None
        if ridden is not None and session is not None and not session.closed:
            limit = max(wait, self.poll_wait) + self.rpc_timeout  # as long as it may be held
            _, body = await session.receive((SessionReplyField.TASK,), limit)
            answer = pb.Task.FromString(bytes(body))
            # A DONE task counts the device as told only if the poll said it holds the
            # final model: asked again when the device's model changed since it uploaded.
            if answer.type != pb.TASK_DONE or ridden == held:
                return answer
        request = pb.TaskRequest(
            client_id=self.client_id, wait_ms=int(wait * 1000), held_model_sha256=held
        )
        if session is not None and not session.closed:
            await session.send(SessionRequestField.POLL, request.SerializeToString())
            _, body = await session.receive((SessionReplyField.TASK,), wait + self.rpc_timeout)
            return pb.Task.FromString(bytes(body))
        task: pb.Task = await self.stub.Poll(request, timeout=wait + self.rpc_timeout)
        return task

    async def submit_secure(self, reply: SecureReply) -> None:
        """Send a secure stage's answer (a withdrawal is best effort)."""
        if reply.withdraws:
            with contextlib.suppress(grpc.RpcError):
                await self.stub.SubmitSecure(
                    reply.chunks(self.chunk_size), timeout=self.rpc_timeout
                )
            return
        await self.stub.SubmitSecure(
            reply.chunks(self.chunk_size), timeout=reply.timeout(self.rpc_timeout)
        )

    async def heartbeats(self, task_id: str, stop: asyncio.Event) -> None:
        """Heartbeat every interval until `stop` is set (a missed beat is not fatal).

        Stopped by the event, not by cancelling: the task ends only after a beat it is
        writing, so no beat can land inside an upload that starts afterwards.
        """
        message = pb.HeartbeatRequest(client_id=self.client_id, task_id=task_id)
        beat = message.SerializeToString()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_interval):
                    await stop.wait()
            if stop.is_set():
                return
            with contextlib.suppress(grpc.RpcError, FederatedError):
                await self.session().send(SessionRequestField.HEARTBEAT, beat)

    async def upload(
        self,
        task: pb.Task,
        payload: bytes | bytearray | memoryview,
        samples: int,
        metrics: Mapping[str, float],
        *,
        then_poll: str | None = None,
    ) -> None:
        """Send the update and see it accepted (TransferError or grpc.RpcError if not).
        With `then_poll` (the sha256 of the model the device holds), the device's next
        poll rides with the upload: a server that takes it answers it after the upload's
        reply, and `poll` reads that answer without asking."""
        pending = PendingUpload(
            task.task_id,
            f"{task.task_id}-{os.urandom(6).hex()}",
            payload,
            int(samples),
            json.dumps({k: float(v) for k, v in metrics.items()}),
        )
        transfers = loop_transfers(
            self.session(), self.client_id, chunk_size=self.chunk_size, rpc_timeout=self.rpc_timeout
        )
        header = transfers.upload_header(pending)
        if then_poll is not None:  # the next poll rides with the upload
            header.then_poll_ms, header.held_model_sha256 = int(self.poll_wait * 1000), then_poll
        if await transfers.upload_in_session(pending, header):
            self._ridden = then_poll

    async def report_evaluation(
        self, task: pb.Task, loss: float, samples: int, metrics: Mapping[str, float]
    ) -> None:
        report = pb.EvaluationReport(
            client_id=self.client_id,
            task_id=task.task_id,
            loss=float(loss),
            num_samples=int(samples),
            metrics_json=json.dumps({k: float(v) for k, v in metrics.items()}),
        )
        await self.stub.ReportEvaluation(report, timeout=self.rpc_timeout)


def weights_of(final: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Own copies of read-only weights (for a report that outlives the model cache)."""
    return {k: np.array(v) for k, v in final.items()}
