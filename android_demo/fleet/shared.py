"""What the virtual devices of a group share: gRPC connections and the global models.

A phone holds its own connection and its own copy of the model; a thousand simulated
phones in one process need neither. `ChannelPool` multiplexes the devices' Session
streams over a few HTTP/2 connections (each stream is what the server sees of a device).
`ModelCache` holds one read-only copy of each global model version the devices were sent:
the first device to need a version downloads it over its session, the others wait for
that download and read the same weights.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from typing import Any, NoReturn

import grpc
import numpy as np

from sporenet.federated.client.session_stream import SessionStream
from sporenet.federated.client.transfers import Transfers
from sporenet.federated.common.auth import Credentials
from sporenet.federated.common.checksum import model_mismatch
from sporenet.federated.errors import TransferError
from sporenet.lite import WeightsReader
from sporenet.proto import federated_pb2 as pb

# Streams per connection: below the 100 concurrent streams HTTP/2 peers commonly allow,
# so a device's poll never queues behind other devices' streams.
DEVICES_PER_CHANNEL = 64


class ChannelPool:
    """A few grpc.aio channels (one connection each) that many devices share; use it on
    the transport loop."""

    def __init__(
        self,
        address: str,
        devices: int,
        *,
        per_channel: int = DEVICES_PER_CHANNEL,
        credentials: Credentials | None = None,
    ) -> None:
        creds = (credentials or Credentials()).channel_credentials()
        count = max(1, math.ceil(devices / per_channel))
        options = [
            # A subchannel pool per channel: otherwise gRPC folds them into one connection.
            ("grpc.use_local_subchannel_pool", 1),
            # The devices retry failed exchanges themselves; gRPC's transparent retries
            # would keep per-stream retry state for every device's open stream.
            ("grpc.enable_retries", 0),
        ]
        self.channels = [
            grpc.aio.secure_channel(address, creds, options=options) for _ in range(count)
        ]

    def channel(self, device: int) -> grpc.aio.Channel:
        """The channel device number `device` (0-based within the group) talks over."""
        return self.channels[device % len(self.channels)]

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


class ModelCache:
    """One read-only copy of each global model version, downloaded once per group."""

    def __init__(self, *, chunk_size: int, rpc_timeout: float) -> None:
        self.chunk_size, self.rpc_timeout = chunk_size, rpc_timeout
        # The federated weights, read as the Client reads them: the model's trainable
        # tensors (every float constant when none is flagged). An update names only
        # those; the server refuses one carrying another constant.
        self._reader = WeightsReader(trainable_only=True)
        self.downloads = 0  # models downloaded (one per version while no download fails)
        self.held = ""  # sha256 of the newest model downloaded: what every device holds
        # sha256 -> the model's weights once downloaded (the future of its download before).
        self._models: dict[str, asyncio.Future[dict[str, np.ndarray]]] = {}

    async def weights(
        self, task: pb.Task, session: SessionStream, client_id: str
    ) -> dict[str, np.ndarray]:
        """The task's global weights (read-only views into one shared copy of the model),
        downloaded over `session` unless another device already has or is getting them."""
        future = self._models.get(task.model_sha256)
        if future is None or (future.done() and future.exception() is not None):
            future = asyncio.get_running_loop().create_future()
            self._models[task.model_sha256] = future
            try:
                data = await self._download(task, session, client_id)
                future.set_result(self._reader.read(data))
                self.held = task.model_sha256
            except BaseException as exc:
                failed = exc if isinstance(exc, Exception) else TransferError("download cancelled")
                future.set_exception(failed)
                future.exception()  # marked retrieved: waiting devices retry with their own
                raise
            # Older versions are no longer asked for: a task names the current model.
            for sha in [s for s in self._models if s != task.model_sha256]:
                del self._models[sha]
        return await asyncio.shield(future)

    async def _download(self, task: pb.Task, session: SessionStream, client_id: str) -> bytes:
        transfers = loop_transfers(
            session, client_id, chunk_size=self.chunk_size, rpc_timeout=self.rpc_timeout
        )
        self.downloads += 1
        await transfers.download_in_session(task, requested=False)
        _, data, received = transfers.start_download(task)
        mismatch = model_mismatch(task, data[:received])
        if mismatch:
            raise TransferError(f"model v{task.model_version} downloaded with {mismatch}")
        return bytes(data)  # its own bytes: the pooled buffer is not kept by the views


def loop_transfers(
    session: SessionStream, client_id: str, *, chunk_size: int, rpc_timeout: float
) -> Transfers:
    """A device's `Transfers` for one exchange over `session`, whose coroutines the caller
    awaits on the transport loop (made per exchange: a device holds none between them)."""
    return Transfers(
        run=_awaited_instead,
        open_session=lambda: session,
        client_id=lambda: client_id,
        chunk_size=chunk_size,
        download_chunk_size=0,
        rpc_timeout=rpc_timeout,
    )


def _awaited_instead(coro: Coroutine[Any, Any, Any]) -> NoReturn:
    coro.close()
    raise RuntimeError("the fleet awaits its transfers on the transport loop")
