"""A client's part in secure aggregation, without I/O: what to send for each secure task.

In a secure round each TASK_SECURE_FIT task is one protocol stage: the client answers it
with a `SecureClientSession` (one per round), trains once when the masked-input stage
comes, and sends only the masked update. In a secure async job the device trains first
(a FIT task whose config says `secure_buffer`), holds its update and says READY; once
its buffer's SecAgg+ instance forms, it answers the stages like a round's, masking the
held update scaled by the staleness weight the server sent (`secure_weight`).

`SecureTasks` holds that state and turns each task into a `SecureReply` for
SubmitSecure; the caller moves the bytes (the Client with blocking calls, the fleet
simulator's devices as coroutines) and does the training it asks for, so both run the
same protocol steps. A reply lost to a failure is rebuilt byte for byte.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Template, Weights
from sporenet.federated.client.dp import privatize_secure
from sporenet.federated.common.wire import SECURE_WEIGHT_KEY, STAGE_NAMES
from sporenet.federated.privacy import PrivacyError
from sporenet.federated.secagg import ProtocolError, SecAggError, Stage
from sporenet.federated.secagg.session import SecureClientSession
from sporenet.proto import federated_pb2 as pb

log = logging.getLogger("sporenet.federated.client")

#: A trained update as secure aggregation takes it: (delta, samples, metrics JSON).
Trained = tuple[Weights, int, str]
#: Makes a round's session: (setup payload, template, max_weight) -> session.
SessionFactory = Callable[[bytes, Template, "float | None"], SecureClientSession]


def trained_delta(
    global_weights: Mapping[str, np.ndarray],
    new: Mapping[str, np.ndarray],
    num_samples: int,
    metrics: Mapping[str, float],
) -> Trained:
    """What training returned, as the update a secure round masks (float64 deltas)."""
    delta = {
        k: np.asarray(new[k], dtype=np.float64) - np.asarray(w, dtype=np.float64)
        for k, w in global_weights.items()
    }
    metrics_json = json.dumps({k: float(v) for k, v in dict(metrics).items()})
    return delta, int(num_samples), metrics_json


def _new_session(setup: bytes, template: Template, max_weight: float | None) -> SecureClientSession:
    return SecureClientSession(setup, template, max_weight=max_weight)


@dataclass(frozen=True)
class SecureReply:
    """One SubmitSecure message: its header, and its body sent in chunks."""

    header: pb.SecureHeader
    body: bytes = b""

    @property
    def withdraws(self) -> bool:
        return bool(self.header.withdraw)

    @property
    def ends_round(self) -> bool:
        """True for the last stage's answer: the next task needs a newer model."""
        return self.header.stage == pb.SECURE_UNMASK and not self.header.withdraw

    def timeout(self, rpc_timeout: float) -> float:
        """How long the call may take: longer for a large masked update."""
        return rpc_timeout + len(self.body) / 5e6

    def chunks(self, chunk_size: int) -> Iterator[pb.SecureChunk]:
        view = memoryview(self.body)
        yield pb.SecureChunk(header=self.header, data=bytes(view[:chunk_size]))
        for at in range(chunk_size, len(self.body), chunk_size):
            yield pb.SecureChunk(data=bytes(view[at : at + chunk_size]))


class SecureTasks:
    """One client's secure round in progress, its held buffer update, and what it sits out."""

    def __init__(self, *, session: SessionFactory = _new_session) -> None:
        self._new_session = session
        self.reset()

    def reset(self) -> None:
        """Forget every secure round (the client moved to another server)."""
        # The open secure round: (task id, its session); the update it masks once trained.
        self._round: tuple[str, SecureClientSession] | None = None
        self._update: Trained | None = None
        # A secure async buffer's: (training task id, its update), held until masked.
        self._held: tuple[str, Trained] | None = None
        self._failed = ""  # a secure task this client cannot continue

    # -- what the caller asks --------------------------------------------------------

    def sitting_out(self, task: pb.Task) -> bool:
        """Whether the client gave up this secure task (it waits for the next one)."""
        return task.task_id == self._failed

    def sit_out(self, task_id: str) -> None:
        """Give up the secure task `task_id` (e.g. the server refused its answer)."""
        self._failed = task_id

    def needs_training(self, task: pb.Task) -> bool:
        """Whether answering the secure stage `task` takes an update trained now: a
        round's masked-input stage, asked for the first time."""
        return (
            task.secure_stage == pb.SECURE_MASKED_INPUT
            and self._round is not None
            and self._round[0] == task.task_id
            and self._update is None
            and SECURE_WEIGHT_KEY not in _config(task)
        )

    def holds(self, task: pb.Task) -> bool:
        """Whether the update for the secure buffer's training task `task` is held."""
        return self._held is not None and self._held[0] == task.task_id

    # -- the replies -------------------------------------------------------------------

    def answer(
        self,
        task: pb.Task,
        client_id: str,
        template: Callable[[], Template],
        trained: Trained | None = None,
    ) -> SecureReply:
        """The reply to one secure stage: the session's message, or a withdrawal when the
        client cannot go on. `template` gives the task model's template (asked only at a
        round's first stage); `trained` is the update `needs_training` asked for."""
        try:
            stage = Stage(STAGE_NAMES[task.secure_stage])
            if self._round is None or self._round[0] != task.task_id:
                if stage != Stage.ADVERTISE_KEYS:
                    # The secrets of the keys this client advertised are gone (it restarted):
                    # answering with new ones would break its neighbours' decryption. It is
                    # a dropout for this round.
                    log.warning(
                        "secure round %s is past its first stage; sitting it out", task.task_id
                    )
                    return self.withdrawal(task, client_id)
                max_weight = _config(task).get("secure_max_weight")
                session = self._new_session(task.secure_setup, template(), max_weight)
                self._round, self._update = (task.task_id, session), None
            session = self._round[1]
            update, num_samples, metrics_json = None, None, ""
            if stage == Stage.MASKED_INPUT:
                update, num_samples, metrics_json = self._masked_update(task, trained)
            body = session.respond(stage, task.secure_payload, update, num_samples)
        except (SecAggError, PrivacyError, KeyError) as e:
            # The session cannot go on (a changed server message, a bad setup): sit the
            # round out; the server's stage deadline leaves this client out.
            log.warning("cannot continue secure round %s: %s", task.task_id, e)
            return self.withdrawal(task, client_id)
        header = pb.SecureHeader(
            client_id=client_id,
            task_id=task.task_id,
            stage=task.secure_stage,
            total_size=len(body),
            num_samples=num_samples or 0,
            metrics_json=metrics_json,
        )
        # After the unmask stage `_held` stays until the next training task replaces it:
        # a failed buffer's round runs again among its survivors, who mask the same update.
        return SecureReply(header, body)

    def _masked_update(self, task: pb.Task, trained: Trained | None) -> Trained:
        """What the masked-input stage masks: in a round, the update trained for it; in a
        secure buffer, the held one times its staleness weight."""
        weight = _config(task).get(SECURE_WEIGHT_KEY)
        if weight is None:
            if self._update is None:
                if trained is None:
                    raise ProtocolError("the masked input stage needs an update trained for it")
                self._update = privatize_secure(task, trained)
            return self._update
        if self._held is None:
            raise ProtocolError("the secure buffer asks for an update this client does not hold")
        delta, num_samples, metrics_json = self._held[1]
        return {k: v * float(weight) for k, v in delta.items()}, num_samples, metrics_json

    def ready(self, task: pb.Task, client_id: str, trained: Trained | None = None) -> SecureReply:
        """A secure buffer's training task is done: hold `trained` (privatized; None when
        `holds(task)` already) and say READY. The secure stages follow when the buffer's
        instance forms."""
        held = self._held
        if held is None or held[0] != task.task_id:
            if trained is None:
                raise ProtocolError(f"secure buffer task {task.task_id!r} needs a trained update")
            held = self._held = (task.task_id, privatize_secure(task, trained))
        _, num_samples, metrics_json = held[1]
        header = pb.SecureHeader(
            client_id=client_id,
            task_id=task.task_id,
            stage=pb.SECURE_READY,
            num_samples=num_samples,
            metrics_json=metrics_json,
        )
        return SecureReply(header)

    def withdrawal(self, task: pb.Task, client_id: str) -> SecureReply:
        """Leave the secure round of `task` and sit it out: the message that tells the
        server (best effort: if it is lost, the stage deadline decides)."""
        self._failed = task.task_id
        header = pb.SecureHeader(
            client_id=client_id, task_id=task.task_id, stage=task.secure_stage, withdraw=True
        )
        return SecureReply(header)


def _config(task: pb.Task) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(task.config_json or "{}")
    return config
