"""RPC fuzzing against the real daemon: no request, however malformed, gets UNKNOWN.

A fixed-seed generator sends raw garbage bytes through generic channel calls, valid
messages with bytes flipped, cut or inserted, hostile field values (a 5,000-digit integer
and deeply nested JSON in metrics_json, 10,000-character ids) and Session frames of every
kind. Every call must end with OK or a documented status (federated/README.md), never
UNKNOWN (an exception nobody mapped) or INTERNAL (a server bug), and the daemon must
still answer afterwards.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from sporenet.federated.common.wire import method_path
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import ServerProcess, make_model

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a poll held for its whole (client) deadline
    grpc.StatusCode.CANCELLED,
}
HOSTILE_JSON = [
    "1" * 5000,
    '{"a": ' + "1" * 5000 + "}",
    "[" * 100_000 + "]" * 100_000,
    '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"a": 1e999}',
    '{"a": NaN}',
    '{"a": true}',
    "{" * 3,
]


def _identity(b: bytes) -> bytes:
    return b


class Fuzzer:
    """Makes request bodies: garbage, mutated valid messages and hostile field values."""

    def __init__(self, seed: int, client_id: str) -> None:
        self.rng = random.Random(seed)
        self.cid = client_id

    def garbage(self) -> bytes:
        return self.rng.randbytes(self.rng.choice([0, 1, 2, 5, 17, 64, 300]))

    def mutate(self, data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(self.rng.randint(1, 4)):
            op = self.rng.randrange(4)
            at = self.rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(at, len(b) - 1)] ^= 1 << self.rng.randrange(8)
            elif op == 1:
                del b[at:]
            elif op == 2:
                b[at:at] = self.rng.randbytes(self.rng.randint(1, 8))
            elif b:
                b[min(at, len(b) - 1)] = self.rng.choice([0x00, 0x7F, 0x80, 0xFF])
        return bytes(b)

    def text(self) -> str:
        return self.rng.choice(
            [self.cid, "", "x" * 10_000, "r1-fit", "\x00", "é" * 50, *HOSTILE_JSON[:2]]
        )

    def body(self, valid: bytes) -> bytes:
        """Garbage one time in four, a mutated valid message otherwise (or as is)."""
        r = self.rng.random()
        if r < 0.25:
            return self.garbage()
        if r < 0.9:
            return self.mutate(valid)
        return valid

    def register(self) -> bytes:
        m = pb.RegisterRequest(client_name=self.text(), compression=["zstd", self.text()])
        m.info["k"] = self.text()
        return self.body(m.SerializeToString())

    def report(self) -> bytes:
        m = pb.EvaluationReport(
            client_id=self.rng.choice([self.cid, self.text()]),
            task_id=self.text(),
            loss=self.rng.choice([0.5, float("nan"), float("inf"), -1e308]),
            num_samples=self.rng.choice([0, 1, 2**64 - 1, 2**62]),
            metrics_json=self.rng.choice([*HOSTILE_JSON, '{"acc": 0.5}']),
        )
        return self.body(m.SerializeToString())

    def status(self) -> bytes:
        return self.body(pb.StatusRequest().SerializeToString())

    def secure(self) -> list[bytes]:
        header = pb.SecureHeader(
            client_id=self.rng.choice([self.cid, self.text()]),
            task_id=self.text(),
            stage=self.rng.randint(-1, 6),
            total_size=self.rng.choice([0, 4, 100, 2**40]),
            withdraw=self.rng.random() < 0.2,
            metrics_json=self.rng.choice(HOSTILE_JSON),
        )
        chunks = [pb.SecureChunk(header=header, data=self.rng.randbytes(4))]
        chunks += [
            pb.SecureChunk(data=self.rng.randbytes(8)) for _ in range(self.rng.randint(0, 2))
        ]
        return [self.body(c.SerializeToString()) for c in chunks]

    def session(self) -> list[bytes]:
        cid = self.rng.choice([self.cid, self.text()])
        kinds = [
            pb.SessionRequest(poll=pb.TaskRequest(client_id=cid, wait_ms=self.rng.choice([0, 1]))),
            pb.SessionRequest(
                download=pb.DownloadRequest(
                    client_id=cid,
                    model_version=self.rng.choice([0, 1, 7, 2**32 - 1]),
                    offset=self.rng.choice([0, 10, 2**40]),
                    chunk_size=self.rng.choice([0, 1, 1024, 2**31 - 1]),
                )
            ),
            pb.SessionRequest(
                upload=pb.UploadChunk(
                    header=pb.UploadHeader(
                        client_id=cid,
                        task_id=self.text(),
                        upload_id=self.rng.choice(["u1", "../x", "x" * 10_000, ""]),
                        total_size=self.rng.choice([0, 8, 2**40]),
                        metrics_json=self.rng.choice(HOSTILE_JSON),
                    )
                )
            ),
            pb.SessionRequest(upload=pb.UploadChunk(offset=3, data=b"abc")),
            pb.SessionRequest(heartbeat=pb.HeartbeatRequest(client_id=cid, task_id=self.text())),
        ]
        return [
            self.body(self.rng.choice(kinds).SerializeToString())
            for _ in range(self.rng.randint(1, 3))
        ]


def _end_of_stream(call: Iterator[bytes]) -> grpc.StatusCode:
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def fuzz(address: str, requests: int, seed: int) -> tuple[Counter[str], list[str]]:
    """Send `requests` fuzzed calls; (count by status, details of the forbidden ones)."""
    counts: Counter[str] = Counter()
    bad: list[str] = []
    with grpc.insecure_channel(address) as channel:
        reply = pb.RegisterReply.FromString(
            channel.unary_unary(method_path("Register"))(
                pb.RegisterRequest(client_name="fuzz-honest").SerializeToString(), timeout=30
            )
        )
        f = Fuzzer(seed, reply.client_id)
        unary = {
            name: channel.unary_unary(
                method_path(name), request_serializer=_identity, response_deserializer=_identity
            )
            for name in ("Register", "ReportEvaluation", "GetStatus")
        }
        secure = channel.stream_unary(
            method_path("SubmitSecure"),
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        session = channel.stream_stream(
            method_path("Session"), request_serializer=_identity, response_deserializer=_identity
        )
        plan: list[tuple[str, Callable[[], grpc.StatusCode]]] = []
        makers = [
            ("Register", f.register, 2),
            ("ReportEvaluation", f.report, 3),
            ("GetStatus", f.status, 1),
            ("SubmitSecure", f.secure, 2),
            ("Session", f.session, 3),
        ]
        weights = [w for *_, w in makers]
        for _ in range(requests):
            name, make, _w = f.rng.choices(makers, weights)[0]
            body = make()
            if name == "SubmitSecure":

                def call(body: list[bytes] = body) -> grpc.StatusCode:  # type: ignore[assignment]
                    try:
                        secure(iter(body), timeout=20)
                    except grpc.RpcError as e:
                        return e.code()
                    return grpc.StatusCode.OK

            elif name == "Session":

                def call(body: list[bytes] = body) -> grpc.StatusCode:  # type: ignore[assignment]
                    return _end_of_stream(session(iter(body), timeout=20))

            else:

                def call(body: bytes = body, name: str = name) -> grpc.StatusCode:  # type: ignore[misc]
                    try:
                        unary[name](body, timeout=20)
                    except grpc.RpcError as e:
                        return e.code()
                    return grpc.StatusCode.OK

            plan.append((name, call))
        with ThreadPoolExecutor(16) as pool:
            for (name, _), code in zip(plan, pool.map(lambda p: p[1](), plan), strict=True):
                counts[f"{name}:{code.name}"] += 1
                if code not in ALLOWED:
                    bad.append(f"{name}: {code.name}")
    return counts, bad


def run_fuzz(tmp_path: Path, factory: Callable[..., ServerProcess], requests: int) -> None:
    make_model(tmp_path / "init.spore")
    server = factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "100000"]
    ).start()
    counts, bad = fuzz(server.address, requests, seed=20)
    total = sum(counts.values())
    by_status = Counter()
    for key, n in counts.items():
        by_status[key.split(":")[1]] += n
    print(f"fuzz: {total} requests, by status {dict(by_status)}")
    assert total == requests
    assert not bad, (Counter(bad), server.logs()[-4000:])
    assert by_status["UNKNOWN"] == 0 and by_status["INTERNAL"] == 0
    # Enough of each RPC reached its handler (not only its decoder).
    for name in ("Register", "ReportEvaluation", "GetStatus", "SubmitSecure", "Session"):
        assert sum(n for k, n in counts.items() if k.startswith(name)) > requests // 20, name
    assert by_status["INVALID_ARGUMENT"] > requests // 10
    assert server.proc is not None and server.proc.poll() is None
    assert server.health() == 1  # SERVING
    # Nothing failed outside a handler (e.g. a finalizer run deep inside a parser).
    assert "Exception ignored" not in server.logs(), server.logs()[-4000:]
    assert server.terminate() == 0


def test_ten_thousand_fuzzed_requests_get_no_unknown_status(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    run_fuzz(tmp_path, server_factory, 10_000)


@pytest.mark.slow
def test_fifty_thousand_fuzzed_requests_get_no_unknown_status(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    run_fuzz(tmp_path, server_factory, 50_000)
