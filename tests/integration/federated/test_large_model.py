"""A 200 MB model moves both ways with default gRPC settings (chunked streams, no size ceiling)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import sporenet.lite
from sporenet.federated import Client
from sporenet.lite import ModelBuilder, OpCode


@pytest.mark.slow  # ~20-40 s on a 2-core machine: 200 MB down, 200 MB up, aggregate, publish
def test_200mb_model_round_trip(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    rows, cols = 5000, 10000  # 50M float32 parameters = 200 MB
    b = ModelBuilder()
    x = b.input("x", (-1, cols))
    w = b.constant("w", np.full((rows, cols), 0.5, np.float32))
    bias = b.constant("b", np.zeros(rows, np.float32))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w, bias]))
    data = sporenet.lite.serialize(b.build())
    assert len(data) > 200_000_000
    (tmp_path / "big.spore").write_bytes(data)
    del data
    server = server_factory(
        ["--model", str(tmp_path / "big.spore"), "--rounds", "1", "--min-clients", "1"]
    ).start()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: v + 0.25 for k, v in weights.items()}, 1, {}

    t0 = time.monotonic()
    client = Client(server.address, train=train, poll_wait=1.0, rpc_timeout=120)
    final = client.run()
    assert final is not None
    assert final["w"].shape == (rows, cols)
    assert float(final["w"].min()) == float(final["w"].max()) == 0.75
    assert float(final["b"].max()) == 0.25
    print(f"200 MB round trip: {time.monotonic() - t0:.1f} s")
    assert server.terminate() == 0
