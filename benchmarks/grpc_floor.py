"""The gRPC floor under a federated round: server CPU per exchange and server memory per
open connection of bare grpcio servers, with no sporenet code in the path.

One exchange is what a federated client does each round: it asks for the model (a small
message), receives it (`--model` bytes, 400 KB: 100k float32 parameters), sends its update
(as many bytes) and gets a small acknowledgement. N clients (asyncio, in this process) do
one warm-up exchange, then `--rounds` more; a server subprocess reports its own CPU time
(process time) and resident memory (VmRSS) through a unary call. Reported per design: server
CPU per exchange over the timed rounds, RSS with the N connections open and idle after
the rounds minus RSS before any client (per connection), and RSS once they closed.

Designs (`--designs`, comma list; the server is grpc.aio unless the name starts "sync-",
grpc.server on a thread pool, the API Flower uses, or "tcp-", no gRPC: _tcp_floor.py):

- stream-reconnect: one bidirectional stream per exchange on a new connection.
- stream-longlived: one stream per client kept open across rounds.
- stream-newcall: one connection per client, a new stream per exchange.
- stream-chunked: long-lived stream, the update sent as `--chunk`-byte messages.
- unary-longlived / unary-reconnect: a Get call and a Put call per exchange.
- unary-chunked: long-lived connection, Get plus a client-streaming Put in chunks.
- tcp-streams-* / tcp-buffered-*: length-prefixed frames over asyncio (StreamReader per
  connection, or one shared read buffer and pooled frame buffers), reconnecting or not.

    python benchmarks/grpc_floor.py                     # every design, 100 clients
    python benchmarks/grpc_floor.py --clients 500 --designs stream-reconnect,stream-longlived

It answers two questions for the server's transport: how much CPU the connection set-up
per round costs, and whether any long-lived design holds bounded memory per connection.
Server options for every design go in `--server-options` as JSON ([["name", value]]).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import socket
import subprocess
import sys
import time
from concurrent import futures
from typing import Any

import grpc
from _common import blas_kernels, clean_env, free_port, machine_header
from _tcp_floor import TcpPeer, serve_tcp

OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
DESIGNS = {  # name: (server, rpc shape, new connection per exchange)
    "stream-reconnect": ("aio", "stream", True),
    "stream-longlived": ("aio", "stream", False),
    "stream-newcall": ("aio", "stream-newcall", False),
    "stream-chunked": ("aio", "stream-chunked", False),
    "unary-longlived": ("aio", "unary", False),
    "unary-reconnect": ("aio", "unary", True),
    "unary-chunked": ("aio", "unary-chunked", False),
    "sync-stream-reconnect": ("sync", "stream", True),
    "sync-stream-longlived": ("sync", "stream", False),
    "sync-unary-longlived": ("sync", "unary", False),
    "sync-unary-reconnect": ("sync", "unary", True),
    "tcp-streams-reconnect": ("tcp-streams", "tcp", True),
    "tcp-streams-longlived": ("tcp-streams", "tcp", False),
    "tcp-buffered-reconnect": ("tcp-buffered", "tcp", True),
    "tcp-buffered-longlived": ("tcp-buffered", "tcp", False),
}
ASK, PART, ACK = b"P", b"C", b"ok"


def _same(b: bytes) -> bytes:
    return b


HELD = [0]  # calls the server holds open (the idle designs)


def _stats() -> bytes:
    gc.collect()  # what is reported is held state, not garbage awaiting a collection
    with open("/proc/self/status") as f:
        rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS"))
    # process_time: every thread's CPU to the nanosecond (os.times counts 10 ms ticks,
    # a tenth of what a few hundred small exchanges take).
    return json.dumps({"cpu": time.process_time(), "rss_kb": rss, "held": HELD[0]}).encode()


def _answer(msg: bytes, model: bytes) -> bytes | None:
    """The Session reply to one message: the model, an ack, or none (a chunk)."""
    if msg == ASK:
        return model
    return None if msg[:1] == PART else ACK


def _aio_methods(model: bytes) -> dict[str, Any]:
    async def session(requests: Any, _ctx: Any) -> Any:
        async for msg in requests:
            if (reply := _answer(msg, model)) is not None:
                yield reply

    async def get(_r: bytes, _ctx: Any) -> bytes:
        return model

    async def put(_r: bytes, _ctx: Any) -> bytes:
        return ACK

    async def put_stream(requests: Any, _ctx: Any) -> bytes:
        async for _ in requests:
            pass
        return ACK

    async def stats(_r: bytes, _ctx: Any) -> bytes:
        return _stats()

    async def hold(requests: Any, _ctx: Any) -> Any:
        HELD[0] += 1
        try:
            async for _ in requests:  # a pending read, as a long-poll stream waits
                yield ACK
        finally:
            HELD[0] -= 1

    methods = {"Session": session, "Get": get, "Put": put, "PutStream": put_stream}
    return methods | {"Stats": stats, "Hold": hold}


def _sync_methods(model: bytes) -> dict[str, Any]:
    def session(requests: Any, _ctx: Any) -> Any:
        for msg in requests:
            if (reply := _answer(msg, model)) is not None:
                yield reply

    def put_stream(requests: Any, _ctx: Any) -> bytes:
        for _ in requests:
            pass
        return ACK

    return {
        "Session": session,
        "Get": lambda _r, _ctx: model,
        "Put": lambda _r, _ctx: ACK,
        "PutStream": put_stream,
        "Stats": lambda _r, _ctx: _stats(),
        "Hold": session,
    }


def _handlers(aio: bool, model: bytes) -> grpc.GenericRpcHandler:
    """Session (ask -> model, update or chunks -> ack), Get, Put, PutStream, Stats."""
    f = (_aio_methods if aio else _sync_methods)(model)
    methods = {
        "Session": grpc.stream_stream_rpc_method_handler(f["Session"], _same, _same),
        "Get": grpc.unary_unary_rpc_method_handler(f["Get"], _same, _same),
        "Put": grpc.unary_unary_rpc_method_handler(f["Put"], _same, _same),
        "PutStream": grpc.stream_unary_rpc_method_handler(f["PutStream"], _same, _same),
        "Stats": grpc.unary_unary_rpc_method_handler(f["Stats"], _same, _same),
        "Hold": grpc.stream_stream_rpc_method_handler(f["Hold"], _same, _same),
    }
    return grpc.method_handlers_generic_handler("floor", methods)


def serve(kind: str, port: int, model_bytes: int, extra: list[tuple[str, Any]]) -> None:
    """Run the bare server until killed."""
    if kind.startswith("tcp"):
        serve_tcp(kind, port, model_bytes, _stats)
        return
    model, options = os.urandom(model_bytes), OPTIONS + extra
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1000), options=options)
        server.add_generic_rpc_handlers((_handlers(False, model),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((_handlers(True, model),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


class Peer:
    """One simulated client: its channel and, for long-lived streams, its open call."""

    def __init__(self, address: str, shape: str, reconnect: bool, update: bytes, chunk: int):
        self.address, self.shape, self.reconnect = address, shape, reconnect
        self.update, self.chunk = update, chunk
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None

    def _parts(self) -> list[bytes]:
        return [self.update[i : i + self.chunk] for i in range(0, len(self.update), self.chunk)]

    async def exchange(self) -> None:
        if self.channel is None:
            # A channel of its own pool: one TCP connection per client, as with real devices.
            options = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
            self.channel = grpc.aio.insecure_channel(self.address, options=options)
        ch = self.channel
        if self.shape.startswith("stream"):
            if self.call is None:
                self.call = ch.stream_stream("/floor/Session", _same, _same)()
            await self.call.write(ASK)
            await self.call.read()
            if self.shape == "stream-chunked":
                for part in self._parts():
                    await self.call.write(PART + part)
                await self.call.write(b"E")
            else:
                await self.call.write(self.update)
            if await self.call.read() != ACK:
                raise RuntimeError("the server did not acknowledge the update")
            if self.shape == "stream-newcall" or self.reconnect:
                await self._end_call()
        else:
            await ch.unary_unary("/floor/Get", _same, _same)(ASK)
            if self.shape == "unary-chunked":

                async def parts() -> Any:
                    for part in self._parts():
                        yield part

                await ch.stream_unary("/floor/PutStream", _same, _same)(parts())
            else:
                await ch.unary_unary("/floor/Put", _same, _same)(self.update)
        if self.reconnect:
            await self.close()

    async def _end_call(self) -> None:
        if self.call is not None:
            await self.call.done_writing()
            await self.call.code()
            self.call = None

    async def close(self) -> None:
        await self._end_call()
        if self.channel is not None:
            await self.channel.close()
            self.channel = None


async def drive(address: str, design: str, args: argparse.Namespace) -> dict[str, float]:
    """Warm-up, timed rounds, idle and closed: the server's CPU and memory."""
    _kind, shape, reconnect = DESIGNS[design]
    port = int(address.rsplit(":", 1)[1])
    async with grpc.aio.insecure_channel(address) as ch:
        stats = ch.unary_unary("/floor/Stats", _same, _same)
        observer = TcpPeer(port, False, b"")

        async def read() -> dict[str, float]:
            if shape == "tcp":
                return await observer.stats()
            return json.loads(await stats(b""))

        before = await read()
        update = os.urandom(args.model)
        peers: list[Any] = [
            TcpPeer(port, reconnect, update)
            if shape == "tcp"
            else Peer(address, shape, reconnect, update, args.chunk)
            for _ in range(args.clients)
        ]
        in_flight = asyncio.Semaphore(args.concurrency)

        async def one(peer: Any) -> None:
            async with in_flight:
                await peer.exchange()

        await asyncio.gather(*(one(p) for p in peers))
        start = await read()
        for _ in range(args.rounds):
            await asyncio.gather(*(one(p) for p in peers))
        end = await read()
        await asyncio.sleep(0.5)
        idle = await read()
        for p in peers:
            await p.close()
        await asyncio.sleep(1.0)
        closed = await read()
        await observer.close()
    n = args.clients
    return {
        "cpu_ms": (end["cpu"] - start["cpu"]) / (n * args.rounds) * 1000,
        "kb_per_conn": (idle["rss_kb"] - before["rss_kb"]) / n,
        "idle_mb": idle["rss_kb"] / 1024,
        "closed_mb": closed["rss_kb"] / 1024,
    }


IDLE_SETTLE_SECONDS = 2.0  # after the last client is held: late allocations land first


async def _idle_rss(address: str, clients: int, mode: str, interval: float = 0.5) -> list[int]:
    """Server RSS (KB) with 1, `clients` // 2 and `clients` idle connections: open only
    (mode "connection"), each holding a stream (a pending server read: a long-poll,
    "stream"), or each making a unary call every `interval` seconds, jittered ("poll")."""
    channels: list[grpc.aio.Channel] = []
    calls: list[Any] = []
    pollers: list[asyncio.Task[None]] = []

    async def poll(ch: grpc.aio.Channel) -> None:
        put = ch.unary_unary("/floor/Put", _same, _same)
        while True:
            await put(ASK)
            await asyncio.sleep(interval * (0.5 + random.random()))

    async with grpc.aio.insecure_channel(address) as observer:
        stats = observer.unary_unary("/floor/Stats", _same, _same)

        async def connect(k: int) -> None:
            for _ in range(k):
                options = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
                ch = grpc.aio.insecure_channel(address, options=options)
                channels.append(ch)
                await ch.channel_ready()
                if mode == "stream":
                    calls.append(ch.stream_stream("/floor/Hold", _same, _same)())
                    await calls[-1].write(ASK)
                    await calls[-1].read()  # the server holds it now
                elif mode == "poll":
                    pollers.append(asyncio.ensure_future(poll(ch)))

        rss = []
        for k in (1, clients // 2 - 1, clients - clients // 2):
            await connect(k)
            await asyncio.sleep(IDLE_SETTLE_SECONDS + (2 * interval if mode == "poll" else 0))
            got = json.loads(await stats(b""))
            if mode == "stream" and got["held"] != len(channels):
                raise RuntimeError(f"the server holds {got['held']} of {len(channels)} streams")
            rss.append(int(got["rss_kb"]))
        for task in pollers:
            task.cancel()
        for call in calls:
            call.cancel()
        for ch in channels:
            await ch.close()
    return rss


def idle_floor(
    clients: int, extra: list[tuple[str, Any]] | None = None, *, interval: float = 0.5
) -> dict[str, float]:
    """A bare grpc.aio server's memory per idle client beyond the first (KB), measured as
    benchmarks/federated.py --idle measures sporenet's: an open connection alone
    ("connection"), one holding a stream ("stream"), one polling with a unary call every
    `interval` seconds ("poll"); "*-marginal": per client from `clients` // 2 to
    `clients`. Server options as in `--server-options`."""
    out = {}
    for mode in ("connection", "stream", "poll"):
        port = free_port()
        cmd = [sys.executable, __file__, "--serve", "aio", str(port), "--model", "64"]
        cmd += ["--server-options", json.dumps(extra or [])]
        server = subprocess.Popen(cmd, env=clean_env())
        try:
            _wait_listening(port)
            first, half, last = asyncio.run(_idle_rss(f"127.0.0.1:{port}", clients, mode, interval))
        finally:
            server.kill()
            server.wait()
        out[mode] = (last - first) / (clients - 1)
        out[f"{mode}-marginal"] = (last - half) / (clients - clients // 2)
    return out


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


FLOOR_DEADLINE = 600.0  # seconds: a floor run takes seconds; a hung one fails instead


def exchange_floor(
    clients: int,
    payload: int,
    *,
    rounds: int = 3,
    design: str = "stream-longlived",
    deadline: float = FLOOR_DEADLINE,
) -> float:
    """Server CPU ms per exchange of `payload` bytes each way, `clients` clients, on a bare
    grpc.aio server (the floor under one accepted federated update). TimeoutError after
    `deadline` seconds (a run once hung: a stuck exchange must not hold the benchmark)."""
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", DESIGNS[design][0], str(port)]
    server = subprocess.Popen([*cmd, "--model", str(payload)], env=clean_env())
    try:
        _wait_listening(port)
        args = argparse.Namespace(
            model=payload, rounds=rounds, chunk=64 << 10, concurrency=50, clients=clients
        )

        async def bounded() -> dict[str, float]:
            async with asyncio.timeout(deadline):
                return await drive(f"127.0.0.1:{port}", design, args)

        try:
            return asyncio.run(bounded())["cpu_ms"]
        except TimeoutError:
            raise TimeoutError(
                f"grpc floor ({design}, {clients} clients, {payload} bytes) took more than "
                f"{deadline:g} s"
            ) from None
    finally:
        server.kill()
        server.wait()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--designs", default=",".join(DESIGNS))
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", type=int, default=400_000, help="bytes each way per exchange")
    p.add_argument("--chunk", type=int, default=64 << 10, help="bytes per chunked message")
    p.add_argument("--concurrency", type=int, default=50, help="exchanges in flight at once")
    p.add_argument("--server-options", default="[]", help='JSON list of ["name", value]')
    p.add_argument(
        "--idle", action="store_true", help="KB per idle connection / held stream / poller only"
    )
    p.add_argument("--poll-interval", type=float, default=0.5, help="--idle: seconds per poll")
    p.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    print(machine_header(blas_kernels()), flush=True)
    extra = [tuple(o) for o in json.loads(args.server_options)]
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.model, extra)
        return
    if args.idle:
        kb = idle_floor(args.clients, extra, interval=args.poll_interval)
        print(
            f"bare grpc.aio server, {args.clients} idle clients: {kb['connection']:.1f} KB per"
            f" connection, {kb['stream']:.1f} KB per connection holding a stream,"
            f" {kb['poll']:.1f} KB per connection polling every {args.poll_interval:g} s (from"
            f" {args.clients // 2} to {args.clients}: {kb['connection-marginal']:.1f},"
            f" {kb['stream-marginal']:.1f} and {kb['poll-marginal']:.1f} KB)"
        )
        return
    print(f"grpcio {grpc.__version__}, {args.clients} clients, {args.model} bytes each way")
    heads = f"{'CPU ms/exchange':>16} {'KB/connection':>14} {'idle MB':>8} {'closed MB':>10}"
    print(f"{'design':24} {heads}")
    for design in args.designs.split(","):
        if design not in DESIGNS:
            raise SystemExit(f"unknown design {design!r}; expected one of {', '.join(DESIGNS)}")
        port = free_port()
        cmd = [sys.executable, __file__, "--serve", DESIGNS[design][0], str(port)]
        cmd += ["--model", str(args.model), "--server-options", args.server_options]
        server = subprocess.Popen(cmd, env=clean_env())
        try:
            _wait_listening(port)
            r = asyncio.run(drive(f"127.0.0.1:{port}", design, args))
        finally:
            server.kill()
            server.wait()
        print(
            f"{design:24} {r['cpu_ms']:16.2f} {r['kb_per_conn']:14.0f} "
            f"{r['idle_mb']:8.0f} {r['closed_mb']:10.0f}",
            flush=True,
        )
        time.sleep(0.2)


if __name__ == "__main__":
    main()
