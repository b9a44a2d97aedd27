"""The edge as one participant of the cloud's job: the client SDK with an edge's answers.

It registers with `info = {"role": "edge"}` and, for each task, runs a round among the
edge's devices (EdgeRoundManager) instead of training: a fit task is answered with the
devices' weighted mean delta and their total weight as the sample count, an evaluate
task with their sample-weighted loss and metrics. Everything else (long polls, the
model download, heartbeats while the devices train, resumable uploads, retries with
backoff across cloud restarts) is the client SDK's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import grpc

from sporenet.federated.client.client import Client
from sporenet.federated.client.transfers import PendingUpload
from sporenet.federated.common.codec import encode_update
from sporenet.federated.edge.errors import EdgeRefusedError
from sporenet.federated.edge.rounds import EdgeResult, EdgeRoundManager
from sporenet.federated.server.hierarchy import EDGE_ROLE, ROLE_KEY
from sporenet.federated.server.phases import Phase
from sporenet.proto import federated_pb2 as pb

log = logging.getLogger("sporenet.federated.edge")

#: Gives the edge's round manager for a task's model (built on the first task).
ManagerFor = Callable[[bytes], EdgeRoundManager]


def _no_training(*_: Any) -> Any:
    """Never called: an edge answers tasks with its devices' aggregate."""
    raise AssertionError("an edge does not train")


class UpstreamClient(Client):
    """A Client whose fit and evaluate answers come from the edge's own devices."""

    def __init__(self, address: str, *, manager_for: ManagerFor, **kwargs: Any) -> None:
        super().__init__(address, train=_no_training, evaluate=_no_training, **kwargs)
        self._manager_for = manager_for
        self._sat_out = ""  # a cloud task the edge withdrew from

    def _register(self) -> None:
        request = pb.RegisterRequest(client_name=self.name, info={ROLE_KEY: EDGE_ROLE})
        try:
            reply = self._call("Register", request, self.rpc_timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise EdgeRefusedError(f"the cloud refused this edge: {e.details()}") from None
            raise
        self.client_id = reply.client_id
        self._heartbeat_interval = max(reply.heartbeat_interval_ms / 1000.0, 0.05)
        log.info("registered upstream as %s", self.client_id)

    def _edge_round(self, task: pb.Task, phase: Phase) -> EdgeResult | None:
        """Run (or resume, or pick up the kept result of) the edge round for `task`,
        heartbeating to the cloud meanwhile; None when the edge withdrew from it."""
        model = bytes(self._model_bytes(task))
        manager = self._manager_for(model)
        manager.begin(
            task_id=task.task_id,
            phase=phase,
            cloud_round=task.round,
            config=json.loads(task.config_json or "{}"),
            model=model,
        )
        # Polls, not heartbeats, while the devices work: they keep the edge alive at the
        # cloud and say when the cloud has closed the task without it.
        while not manager.wait(task.task_id, self._heartbeat_interval):
            if self._stop.is_set():
                return None
            if not self._still_wanted(task):
                manager.withdraw(task.task_id, f"the cloud closed task {task.task_id!r}")
                break
        result = manager.result(task.task_id)
        if result is None:
            self._sat_out = task.task_id
            log.warning("edge withdrew from cloud task %s", task.task_id)
        return result

    def _still_wanted(self, task: pb.Task) -> bool:
        """Whether the cloud still asks this edge for `task` (a poll that does not wait)."""
        request = pb.TaskRequest(client_id=self.client_id or "", wait_ms=0, send_model=False)
        current = self._in_session(self._poll_in_session(request, self.rpc_timeout))
        return bool(current.task_id == task.task_id and current.type == task.type)

    def _sitting_out(self, task: pb.Task) -> bool:
        if task.task_id != self._sat_out:
            return False
        self._stop.wait(max(task.retry_after_ms / 1000.0, 0.5))
        return True

    def _fit(self, task: pb.Task) -> None:
        if self._sitting_out(task):
            return
        pending = self._pending
        if pending is None or pending.task_id != task.task_id:
            result = self._edge_round(task, Phase.FIT)
            if result is None or result.delta is None:
                return
            pending = PendingUpload(
                task.task_id,
                f"{task.task_id}-{os.urandom(6).hex()}",
                encode_update(result.delta),
                result.weight,
                json.dumps(result.metrics),
            )
            self._pending = pending
        self._upload(pending)
        self._pending = None
        self._drop_models()
        self.rounds_trained += 1

    def _evaluate(self, task: pb.Task) -> None:
        if self._sitting_out(task):
            return
        result = self._edge_round(task, Phase.EVALUATE)
        if result is None:
            return
        report = pb.EvaluationReport(
            client_id=self.client_id or "",
            task_id=task.task_id,
            loss=result.loss,
            num_samples=result.weight,
            metrics_json=json.dumps(result.metrics),
        )
        self._call("ReportEvaluation", report, self.rpc_timeout)

    def _secure_fit(self, task: pb.Task) -> None:
        """Cannot happen: the cloud refuses edges in secure jobs (server/hierarchy.py)."""
        log.error("the cloud sent a secure task; edges take part in plain rounds only")
        self._withdraw(task)
