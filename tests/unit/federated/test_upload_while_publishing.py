"""An upload that arrives while its phase is being published, against the Session service
in-process: an async job's update waits and lands in the next buffer; a round's is
refused once the round is published (its task closed)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sporenet.federated.common.codec import encode_update
from sporenet.federated.common.wire import SessionReplyField, split_session
from sporenet.federated.errors import StaleTaskError
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import Participant, TaskType
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.session import SessionService
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import make_model
from tests.unit.federated.round_helpers import FakeClock


class Replies:
    """A Session stream whose client sent nothing more: it keeps the server's replies."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, bytes]] = []

    async def read(self) -> Any:
        return None

    async def write(self, message: bytes) -> None:
        field, body = split_session(message)
        self.replies.append((field, bytes(body)))


@pytest.fixture
def manager(tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    made: list[RoundManager] = []

    def make(min_clients: int = 2, **job: object) -> RoundManager:
        make_model(tmp_path / "init.spore")
        table: dict[str, object] = {
            "state_dir": str(tmp_path / "state"),
            "model": str(tmp_path / "init.spore"),
            "min_clients": min_clients,
            "rounds": 3,
            "heartbeat_timeout": 30.0,
            "round_timeout": 600.0,
            "job": job,
        }
        m = RoundManager(
            build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"), clock=clock
        )
        made.append(m)
        for cid in "ab":
            m.register(cid, None, {})
        m.tick()
        return m

    yield make
    for m in made:
        m.close()


def _upload_chunk(m: RoundManager, cid: str, task_id: str) -> bytes:
    zeros = {k: np.zeros(shape, dtype) for k, (shape, dtype) in m.model.template.items()}
    payload = encode_update(zeros)
    header = pb.UploadHeader(
        client_id=cid,
        task_id=task_id,
        upload_id=f"{cid}-1",
        total_size=len(payload),
        num_samples=1,
        metrics_json="{}",
    )
    return pb.UploadChunk(header=header, offset=0, data=payload).SerializeToString()


def _upload_during_publication(m: RoundManager, chunk: bytes) -> tuple[Replies, bool]:
    """Send `chunk` on a Session while `m` publishes its full phase (held in the middle
    of publish_fit until the upload is seen waiting); whether it waited."""
    entered, release = threading.Event(), threading.Event()
    publish = m.publisher.publish_fit

    def held_publish(phase: Any) -> None:
        entered.set()
        release.wait(30)
        publish(phase)

    m.publisher.publish_fit = held_publish  # type: ignore[method-assign]
    closing = threading.Thread(target=m.tick)
    closing.start()
    assert entered.wait(30) and m.aggregating
    stream = Replies()

    async def run() -> bool:
        with ThreadPoolExecutor(2) as pool:
            svc = SessionService(
                m, metrics=Metrics(), executor=pool, chunk_size=1 << 20, slots=(4, 4)
            )
            svc.attach(asyncio.get_running_loop())
            upload = asyncio.ensure_future(svc._upload(memoryview(chunk), stream))
            for _ in range(50):  # give it every chance to answer before the publication
                await asyncio.sleep(0)
            waited = not upload.done() and not stream.replies
            release.set()
            await asyncio.get_running_loop().run_in_executor(None, closing.join)
            await upload
            return waited

    try:
        return stream, asyncio.run(run())
    finally:
        release.set()
        closing.join()


def _fit(m: RoundManager, cid: str) -> None:
    """`cid` answers its fit task with a zero update."""
    task = m.get_task(cid)
    zeros = {k: np.zeros(shape, dtype) for k, (shape, dtype) in m.model.template.items()}
    m.submit_update(
        cid,
        task.task_id,
        memoryview(encode_update(zeros)),
        upload=None,
        mismatch="",
        num_samples=1,
        metrics_json="{}",
    )


def test_an_async_update_arriving_mid_publication_lands_in_the_next_buffer(
    manager: Any,
) -> None:
    m = manager(mode="async", concurrency=2, buffer_size=1)
    task_b = m.get_task("b")
    assert task_b.type == TaskType.FIT
    _fit(m, "a")
    assert m.job.model_version == 0  # the buffer is full; the next tick publishes it
    stream, waited = _upload_during_publication(m, _upload_chunk(m, "b", task_b.task_id))
    assert waited  # not refused while the buffer was being published
    field, body = stream.replies[0]
    assert field == SessionReplyField.UPLOAD_REPLY
    assert pb.UploadReply.FromString(body).accepted
    assert m.job.model_version == 1 and m.clients.status("b") == Participant.ACCEPTED
    assert [r["num_results"] for r in m.store.rounds()] == [1, 0]  # saved at the close


def test_a_round_update_arriving_mid_publication_is_refused_once_published(
    manager: Any, clock: FakeClock
) -> None:
    m = manager(mode="sync", min_clients=1)
    task_b = m.get_task("b")
    _fit(m, "a")
    clock.advance(601)  # past the deadline: the round closes with "a" alone
    m.touch("b")
    with pytest.raises(StaleTaskError, match="is not open"):  # not "being aggregated"
        _upload_during_publication(m, _upload_chunk(m, "b", task_b.task_id))
    assert m.job.model_version == 1
