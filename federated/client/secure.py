"""The client side of a secure-aggregation round: answer each stage, train once, withdraw.

In a secure async job the device trains first (a FIT task whose config says
`secure_buffer`), holds its update and says READY; once its buffer's SecAgg+ instance
forms, it answers the stages like a round's, masking the held update scaled by the
staleness weight the server sent (`secure_weight`).

`SecureRounds` is a mixin of `Client`: it works on the client's task calls, model reader
and training step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from sporenet.federated.aggregation import Weights, template_of
from sporenet.federated.client.dp import privatize_secure
from sporenet.federated.common.wire import SECURE_WEIGHT_KEY, STAGE_NAMES
from sporenet.federated.privacy import PrivacyError
from sporenet.federated.secagg import ProtocolError, SecAggError, Stage
from sporenet.federated.secagg.session import SecureClientSession
from sporenet.lite import WeightsReader
from sporenet.proto import federated_pb2 as pb

log = logging.getLogger("sporenet.federated.client")


class SecureRounds:
    """`Client`'s answers to TASK_SECURE_FIT tasks."""

    # The open secure round: (task id, its session), the trained update once computed,
    # and a secure task this client cannot continue.
    _secure: tuple[str, SecureClientSession] | None
    _secure_update: tuple[Weights, int, str] | None
    _secure_failed: str
    _held: tuple[str, tuple[Weights, int, str]] | None
    _stop: threading.Event
    _weights_reader: WeightsReader
    client_id: str | None
    chunk_size: int
    rpc_timeout: float
    rounds_trained: int

    _call: Callable[[str, Any, float], Any]
    _model_bytes: Callable[[pb.Task], memoryview]
    _drop_models: Callable[[], None]
    _train_delta: Callable[[pb.Task], tuple[Weights, int, str]]

    def _secure_fit(self, task: pb.Task) -> None:
        """Answer one stage of a secure round; train (once) at the masked-input stage."""
        if task.task_id == self._secure_failed:
            self._stop.wait(max(task.retry_after_ms / 1000.0, 0.5))
            return
        try:
            stage = Stage(STAGE_NAMES[task.secure_stage])
            if self._secure is None or self._secure[0] != task.task_id:
                if stage != Stage.ADVERTISE_KEYS:
                    # The secrets of the keys this client advertised are gone (it restarted):
                    # answering with new ones would break its neighbours' decryption. It is
                    # a dropout for this round.
                    log.warning(
                        "secure round %s is past its first stage; sitting it out", task.task_id
                    )
                    self._withdraw(task)
                    return
                template = template_of(self._weights_reader.read(self._model_bytes(task)))
                max_weight = json.loads(task.config_json or "{}").get("secure_max_weight")
                session = SecureClientSession(task.secure_setup, template, max_weight=max_weight)
                self._secure, self._secure_update = (task.task_id, session), None
            session = self._secure[1]
            update, num_samples, metrics_json = None, None, ""
            if stage == Stage.MASKED_INPUT:
                if self._secure_update is None:
                    self._secure_update = self._masked_update(task)
                update, num_samples, metrics_json = self._secure_update
            reply = session.respond(stage, task.secure_payload, update, num_samples)
        except (SecAggError, PrivacyError, KeyError) as e:
            # The session cannot go on (a changed server message, a bad setup): sit the
            # round out; the server's stage deadline leaves this client out.
            log.warning("cannot continue secure round %s: %s", task.task_id, e)
            self._withdraw(task)
            return
        header = pb.SecureHeader(
            client_id=self.client_id or "",
            task_id=task.task_id,
            stage=task.secure_stage,
            total_size=len(reply),
            num_samples=num_samples or 0,
            metrics_json=metrics_json,
        )

        def chunks() -> Iterator[pb.SecureChunk]:
            view = memoryview(reply)
            yield pb.SecureChunk(header=header, data=bytes(view[: self.chunk_size]))
            for at in range(self.chunk_size, len(reply), self.chunk_size):
                yield pb.SecureChunk(data=bytes(view[at : at + self.chunk_size]))

        self._call("SubmitSecure", chunks(), self.rpc_timeout + len(reply) / 5e6)
        if stage == Stage.UNMASK:
            # `_held` stays until the next training task replaces it: a failed buffer's
            # round runs again among its survivors, who mask the same update.
            self._drop_models()  # the next task needs a newer model

    def _masked_update(self, task: pb.Task) -> tuple[Weights, int, str]:
        """What the masked-input stage masks: in a round, the update trained now; in a
        secure buffer, the held one times its staleness weight."""
        weight = json.loads(task.config_json or "{}").get(SECURE_WEIGHT_KEY)
        if weight is None:
            trained = privatize_secure(task, self._train_delta(task))
            self.rounds_trained += 1
            return trained
        if self._held is None:
            raise ProtocolError("the secure buffer asks for an update this client does not hold")
        delta, num_samples, metrics_json = self._held[1]
        return {k: v * float(weight) for k, v in delta.items()}, num_samples, metrics_json

    def _buffer_fit(self, task: pb.Task) -> None:
        """A secure buffer's training task: train on its version (once), hold the update
        and say READY; the secure stages follow when the buffer's instance forms."""
        if self._held is None or self._held[0] != task.task_id:
            self._held = (task.task_id, privatize_secure(task, self._train_delta(task)))
            self.rounds_trained += 1
        _, num_samples, metrics_json = self._held[1]
        header = pb.SecureHeader(
            client_id=self.client_id or "",
            task_id=task.task_id,
            stage=pb.SECURE_READY,
            num_samples=num_samples,
            metrics_json=metrics_json,
        )
        self._call("SubmitSecure", iter([pb.SecureChunk(header=header)]), self.rpc_timeout)
        self._drop_models()  # the secure stages carry the current model

    def _withdraw(self, task: pb.Task) -> None:
        """Tell the server this client leaves the secure round (best effort), and sit it out."""
        self._secure_failed = task.task_id
        header = pb.SecureHeader(
            client_id=self.client_id or "",
            task_id=task.task_id,
            stage=task.secure_stage,
            withdraw=True,
        )
        with contextlib.suppress(grpc.RpcError):  # if it fails, the stage deadline decides
            self._call("SubmitSecure", iter([pb.SecureChunk(header=header)]), self.rpc_timeout)
