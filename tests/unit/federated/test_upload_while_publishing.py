"""Uploads that wait, against the Session service in-process: one that arrives while its
phase is being published (an async job's lands in the next buffer; a round's is refused
once the round is published), and riding data kept while waiting for a receiving slot
within what the slots may hold (beyond it, dropped and asked for again)."""

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

    def make(
        min_clients: int = 2, clients: str = "ab", state: str = "state", **job: object
    ) -> RoundManager:
        make_model(tmp_path / "init.spore")
        table: dict[str, object] = {
            "state_dir": str(tmp_path / state),
            "model": str(tmp_path / "init.spore"),
            "min_clients": min_clients,
            "rounds": 3,
            "heartbeat_timeout": 30.0,
            "round_timeout": 600.0,
            "job": job,
        }
        for key in ("max_update_bytes",):
            if key in job:
                table[key] = job.pop(key)
        m = RoundManager(
            build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"), clock=clock
        )
        made.append(m)
        for cid in clients:
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


def test_riding_data_waits_for_a_slot_within_what_the_slots_may_hold(
    manager: Any, tmp_path: Path
) -> None:
    probe = manager(mode="sync", min_clients=3, clients="abc", state="probe")
    size = pb.UploadChunk.FromString(_upload_chunk(probe, "a", "t")).header.total_size
    # One receiving slot, which may hold one such update: one waiting rider is kept.
    m = manager(mode="sync", min_clients=3, clients="abc", max_update_bytes=size)
    tasks = {cid: m.get_task(cid) for cid in "bc"}
    streams = {cid: Replies() for cid in "bc"}

    async def run() -> None:
        with ThreadPoolExecutor(2) as pool:
            svc = SessionService(
                m, metrics=Metrics(), executor=pool, chunk_size=1 << 20, slots=(1, 1)
            )
            svc.attach(asyncio.get_running_loop())
            slots = svc._upload_slots
            busy = slots.claim("a", "a-1", "t")  # "a" receives something long
            await slots.acquire(busy)
            uploads = [
                asyncio.ensure_future(
                    svc._upload(memoryview(_upload_chunk(m, cid, tasks[cid].task_id)), streams[cid])
                )
                for cid in "bc"
            ]
            for _ in range(20):
                await asyncio.sleep(0)
            assert not any(u.done() for u in uploads)  # both wait for the slot
            slots.release(busy)
            await asyncio.gather(*uploads)

    asyncio.run(run())
    # "b" kept its data: answered at once, with no upload_offset asking for it again.
    assert [f for f, _ in streams["b"].replies] == [SessionReplyField.UPLOAD_REPLY]
    assert pb.UploadReply.FromString(streams["b"].replies[0][1]).accepted
    # "c" was over the budget: asked for its data from byte 0 (this client sent no more).
    fields = [f for f, _ in streams["c"].replies]
    assert fields == [SessionReplyField.UPLOAD_OFFSET, SessionReplyField.UPLOAD_REPLY]
    assert pb.UploadOffsetReply.FromString(streams["c"].replies[0][1]).received == 0
    assert not pb.UploadReply.FromString(streams["c"].replies[1][1]).accepted
    assert m.clients.status("b") == Participant.ACCEPTED
