"""The raw-TCP designs of grpc_floor.py: the same exchange as length-prefixed frames over
asyncio, without gRPC, for the floor a hand-written transport would have.

- streams: asyncio.start_server with StreamReader.readexactly per frame, as a first
  version would be written. Each connection's StreamReader keeps a buffer sized to the
  largest frame it received.
- buffered: an asyncio.BufferedProtocol that reads every connection into one shared
  buffer (the loop consumes it before the next read) and copies a frame's body into a
  pooled buffer, returned once the frame is answered: memory follows the frames in
  flight, not the connections.

A frame is a little-endian u32 length and the body: b"P" asks for the model, b"S" for
the server's stats, anything else is an update, acknowledged with b"ok".
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Callable
from typing import ClassVar

LENGTH = struct.Struct("<I")
ASK, STATS, ACK = b"P", b"S", b"ok"


def _reply(body: bytes | memoryview, model: bytes, stats: Callable[[], bytes]) -> bytes:
    if body == ASK:
        return model
    if body == STATS:
        return stats()
    return ACK


async def _serve_streams(port: int, model: bytes, stats: Callable[[], bytes]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = LENGTH.unpack(await reader.readexactly(LENGTH.size))[0]
                reply = _reply(await reader.readexactly(size), model, stats)
                writer.writelines((LENGTH.pack(len(reply)), reply))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    await server.serve_forever()


class _Buffered(asyncio.BufferedProtocol):
    """One connection: frames parsed out of the shared read buffer."""

    shared: ClassVar[bytearray] = bytearray(256 << 10)
    pool: ClassVar[list[bytearray]] = []

    def __init__(self, model: bytes, stats: Callable[[], bytes]) -> None:
        self.model, self.stats = model, stats
        self.head = bytearray()
        self.body: bytearray | None = None
        self.need = self.got = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.shared

    def buffer_updated(self, nbytes: int) -> None:
        data = memoryview(self.shared)[:nbytes]
        while data:
            if self.body is None:
                take = min(LENGTH.size - len(self.head), len(data))
                self.head += data[:take]
                data = data[take:]
                if len(self.head) == LENGTH.size:
                    self.need, self.got = LENGTH.unpack(self.head)[0], 0
                    self.head = bytearray()
                    pooled = self.pool.pop() if self.pool else bytearray()
                    if len(pooled) < self.need:
                        pooled = bytearray(self.need)
                    self.body = pooled
                    if self.need == 0:
                        self._answer()
                continue
            take = min(self.need - self.got, len(data))
            self.body[self.got : self.got + take] = data[:take]
            self.got += take
            data = data[take:]
            if self.got == self.need:
                self._answer()

    def _answer(self) -> None:
        body = self.body
        assert body is not None
        reply = _reply(memoryview(body)[: self.need], self.model, self.stats)
        self.pool.append(body)
        self.body = None
        self.transport.writelines((LENGTH.pack(len(reply)), reply))


async def _serve_buffered(port: int, model: bytes, stats: Callable[[], bytes]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Buffered(model, stats), "127.0.0.1", port)
    await server.serve_forever()


def serve_tcp(kind: str, port: int, model_bytes: int, stats: Callable[[], bytes]) -> None:
    """Run a raw-TCP server ("tcp-streams" or "tcp-buffered") until killed."""
    model = os.urandom(model_bytes)
    run = _serve_streams if kind == "tcp-streams" else _serve_buffered
    asyncio.run(run(port, model, stats))


class TcpPeer:
    """One simulated client over raw TCP: asks for the model, sends its update."""

    def __init__(self, port: int, reconnect: bool, update: bytes) -> None:
        self.port, self.reconnect, self.update = port, reconnect, update
        self.pair: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, body: bytes) -> bytes:
        if self.pair is None:
            self.pair = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.pair
        writer.writelines((LENGTH.pack(len(body)), body))
        await writer.drain()
        size = LENGTH.unpack(await reader.readexactly(LENGTH.size))[0]
        return await reader.readexactly(size)

    async def exchange(self) -> None:
        await self.call(ASK)
        if await self.call(self.update) != ACK:
            raise RuntimeError("the server did not acknowledge the update")
        if self.reconnect:
            await self.close()

    async def stats(self) -> dict[str, float]:
        return json.loads(await self.call(STATS))

    async def close(self) -> None:
        if self.pair is not None:
            self.pair[1].close()
            await self.pair[1].wait_closed()
            self.pair = None
