"""Helpers for federated integration tests: a tiny model, free ports, the daemon as a subprocess."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health_pb2, health_pb2_grpc

import sporenet.lite
from sporenet.federated.common.auth import public_key_text
from sporenet.federated.common.wire import method_path
from sporenet.lite import ModelBuilder, OpCode
from sporenet.proto import federated_pb2 as pb

SESSION = "/sporenet.federated.v1.Federated/Session"


def make_model(path: Path, *, out: int = 3, inp: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a one-layer .spore model to `path`; returns its initial weights."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((out, inp)).astype(np.float32)
    b0 = rng.standard_normal(out).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", (-1, inp))
    w = b.constant("w", w0)
    bias = b.constant("b", b0)
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w, bias]))
    path.write_bytes(sporenet.lite.serialize(b.build()))
    return {"w": w0, "b": b0}


def auth_config(
    tmp_path: Path, key: Ed25519PrivateKey, tokens: dict[str, str], *, min_clients: int
) -> Path:
    """A one-round server.toml with token clients `tokens` (name -> token) and the Ed25519
    client `dev1` holding `key`, for the model make_model writes to init.spore."""
    make_model(tmp_path / "init.spore")
    listed = ", ".join(f'{name} = "{token}"' for name, token in tokens.items())
    path = tmp_path / "server.toml"
    path.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 1\nmin_clients = {min_clients}\n'
        f"[auth]\ntokens = {{ {listed} }}\n"
        f'ed25519 = {{ dev1 = "{public_key_text(key)}" }}\n'
    )
    return path


def status_command(state_dir: Path) -> dict:
    """What an operator sees: the JSON that `sporenet-server status` prints (a real
    subprocess reading the state dir)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "status",
            "--json",
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProcess:
    """What the tests read of a daemon subprocess (server or edge): its JSON log lines,
    and kill -9 leaving its state dir as a crash would."""

    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str) -> list[dict]:
        out = []
        for line in self.logs().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("event") == name:
                out.append(entry)
        return out

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        (self.state_dir / "server.json").unlink(missing_ok=True)


class ServerProcess(DaemonProcess):
    """`python -m sporenet.federated.server` with the given flags, logs captured to a file."""

    def __init__(self, state_dir: Path, args: list[str], *, port: int | None = None) -> None:
        self.state_dir, self.args = state_dir, args
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{state_dir.name}-server.log"

    def start(
        self,
        *,
        wait: bool = True,
        extra: list[str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "--address",
            self.address,
            "--state-dir",
            str(self.state_dir),
            *self.args,
            *(extra or []),
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=self._log, env={**os.environ}, preexec_fn=preexec_fn
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(
        self, timeout: float = 120.0, *, credentials: grpc.ChannelCredentials | None = None
    ) -> None:
        """Return once the server has written its server.json. `timeout` only bounds the
        wait: a start-up can take tens of seconds on a loaded 2-core machine."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            info = self.state_dir / "server.json"
            if info.exists() and json.loads(info.read_text()).get("pid") == self.proc.pid:  # type: ignore[union-attr]
                return
            time.sleep(0.05)
        raise TimeoutError(f"server did not start:\n{self.logs()}")

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def health(self) -> int:
        with grpc.insecure_channel(self.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """The first true value `predicate()` returns, polled every `interval` seconds;
    TimeoutError after `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def _serialize(request: pb.SessionRequest | bytes) -> bytes:
    # Raw bytes pass through: some tests send messages protobuf cannot build.
    return request if isinstance(request, bytes) else request.SerializeToString()


class RawSession:
    """One Session call: requests go in through a queue, replies come out in order."""

    def __init__(
        self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]] | None = None
    ) -> None:
        self._requests: queue.SimpleQueue[pb.SessionRequest | bytes | None] = queue.SimpleQueue()
        open_call = channel.stream_stream(
            SESSION, request_serializer=_serialize, response_deserializer=pb.SessionReply.FromString
        )
        # A deadline for the whole call, so a missing reply fails the test instead of hanging.
        self.call = open_call(iter(self._requests.get, None), metadata=metadata, timeout=30)

    def send(self, request: pb.SessionRequest | bytes) -> None:
        self._requests.put(request)

    def all_sent(self) -> bool:
        """True once gRPC has taken every request queued so far."""
        return self._requests.empty()

    def receive(self, kind: str) -> pb.SessionReply:
        reply = next(self.call)
        assert reply.WhichOneof("kind") == kind, reply
        return reply

    def refusal(self) -> tuple[grpc.StatusCode, str]:
        """The status that ends the stream (fails if a reply comes instead)."""
        with pytest.raises(grpc.RpcError) as info:
            reply = next(self.call)
            raise AssertionError(f"expected the stream to end, got {reply}")
        return info.value.code(), info.value.details()

    def poll(self, client_id: str, wait_ms: int = 0) -> pb.Task:
        self.send(pb.SessionRequest(poll=pb.TaskRequest(client_id=client_id, wait_ms=wait_ms)))
        return self.receive("task").task

    def download(self, request: pb.DownloadRequest) -> list[pb.ModelChunk]:
        self.send(pb.SessionRequest(download=request))
        chunks = [self.receive("model").model]
        while chunks[-1].offset + len(chunks[-1].data) < chunks[-1].total_size:
            chunks.append(self.receive("model").model)
        return chunks

    def upload_header(self, header: pb.UploadHeader) -> pb.SessionReply:
        self.send(pb.SessionRequest(upload=pb.UploadChunk(header=header)))
        return next(self.call)

    def upload_data(self, payload: bytes, start: int, end: int, chunk: int) -> None:
        for at in range(start, end, chunk):
            piece = payload[at : min(at + chunk, end)]
            self.send(pb.SessionRequest(upload=pb.UploadChunk(offset=at, data=piece)))

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def poll_task(
    channel: grpc.Channel,
    client_id: str,
    *,
    wait_ms: int = 0,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> pb.Task:
    """One poll over a Session of its own (grpc.RpcError if the server refuses it)."""
    session = RawSession(channel, metadata)
    try:
        return session.poll(client_id, wait_ms)
    finally:
        session.close()


def fit_task(channel: grpc.Channel, client_id: str) -> pb.Task:
    """Poll until the server hands `client_id` a fit task."""
    for _ in range(100):
        task = poll_task(channel, client_id, wait_ms=500)
        if task.type == pb.TASK_FIT:
            return task
    raise AssertionError(f"no fit task for {client_id!r}")


def register_raw(channel: grpc.Channel, names: Sequence[str]) -> list[str]:
    """Register a raw (hand-driven) client per name; returns their client ids."""
    register = channel.unary_unary(
        method_path("Register"),
        request_serializer=pb.RegisterRequest.SerializeToString,
        response_deserializer=pb.RegisterReply.FromString,
    )
    return [register(pb.RegisterRequest(client_name=n), timeout=30).client_id for n in names]


def fit_tasks(channel: grpc.Channel, client_ids: Sequence[str]) -> dict[str, pb.Task]:
    """Each client's fit task, polled for all at once (a round opens when enough poll)."""
    box: dict[str, pb.Task] = {}
    fetchers = [
        threading.Thread(target=lambda c=c: box.__setitem__(c, fit_task(channel, c)))
        for c in client_ids
    ]
    for t in fetchers:
        t.start()
    for t in fetchers:
        t.join(120)
    missing = [c for c in client_ids if c not in box]
    if missing:
        raise AssertionError(f"no fit task for {missing}")
    return {c: box[c] for c in client_ids}


def upload_raw(
    channel: grpc.Channel,
    *,
    client_id: str,
    task_id: str,
    payload: bytes,
    upload_id: str = "u1",
    total_size: int | None = None,
    num_samples: int = 1,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> pb.UploadReply:
    """One upload with hand-made bytes over a Session of its own (for malformed-update
    tests); grpc.RpcError with the server's status when it refuses it."""
    header = pb.UploadHeader(
        client_id=client_id,
        task_id=task_id,
        upload_id=upload_id,
        total_size=len(payload) if total_size is None else total_size,
        num_samples=num_samples,
    )
    session = RawSession(channel, metadata)
    try:
        reply = session.upload_header(header)
        if reply.WhichOneof("kind") == "upload_offset":
            start = reply.upload_offset.received
            session.upload_data(payload, start, len(payload), 1 << 20)
            reply = next(session.call)
        assert reply.WhichOneof("kind") == "upload_reply", reply
        return reply.upload_reply
    finally:
        session.close()


def self_signed_cert(common_name: str = "localhost") -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) valid for localhost and 127.0.0.1, made on the spot."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
