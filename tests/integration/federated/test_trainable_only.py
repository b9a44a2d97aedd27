"""Only trainable tensors are federated: a model's non-trainable constants (here an input
scaling) are not handed to train() or evaluate(), not accepted in an update, not
aggregated, and the published models keep them byte for byte.

A real `sporenet-server` subprocess and real Clients on loopback.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

import sporenet.lite
from sporenet.federated import Client
from sporenet.federated.common.codec import encode_update
from sporenet.lite import ModelBuilder, OpCode, read_weights
from tests.integration.federated.helpers import fit_tasks, register_raw, upload_raw


def scaled_model(path: Path) -> dict[str, np.ndarray]:
    """x * scale -> FullyConnected(w, b), with `scale` a non-trainable constant."""
    rng = np.random.default_rng(3)
    values = {
        "scale": np.full(4, 0.5, np.float32),
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    scale = b.constant("scale", values["scale"])  # trainable=False
    w = b.constant("w", values["w"], trainable=True)
    bias = b.constant("b", values["b"], trainable=True)
    scaled = b.op(OpCode.MUL, [x, scale])
    b.output(b.op(OpCode.FULLY_CONNECTED, [scaled, w, bias]))
    path.write_bytes(sporenet.lite.serialize(b.build()))
    return values


def test_non_trainable_constants_neither_travel_nor_change(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    v0 = scaled_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "2", "--min-clients", "2"]
    server = server_factory([*args, "--evaluate-every", "1"]).start()

    # An update that carries the constant is refused: it is not a federated weight.
    with grpc.insecure_channel(server.address) as ch:
        ids = register_raw(ch, ["raw0", "raw1"])
        tasks = fit_tasks(ch, ids)
        rogue = {k: np.ones_like(v) for k, v in v0.items()}
        with pytest.raises(grpc.RpcError) as info:
            upload_raw(
                ch, client_id=ids[0], task_id=tasks[ids[0]].task_id, payload=encode_update(rogue)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "scale" in (info.value.details() or "")
        # The raw clients' updates of the trainable tensors only are accepted.
        for i, cid in enumerate(ids):
            delta = {k: np.full_like(v0[k], float(i + 1)) for k in ("w", "b")}
            upload_raw(ch, client_id=cid, task_id=tasks[cid].task_id, payload=encode_update(delta))

    seen: list[set[str]] = []

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        seen.append(set(weights))
        # A train() that also returns the constant changed does not change it anywhere.
        return {**{k: v + 1.0 for k, v in weights.items()}, "scale": np.zeros(4)}, 4, {}

    def evaluate(weights: dict[str, np.ndarray], config: dict) -> tuple:
        seen.append(set(weights))
        return 0.5, 4, {}

    def run(name: str) -> None:
        c = Client(server.address, train=train, evaluate=evaluate, name=name, poll_wait=1.0)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in ("raw0", "raw1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()
    assert seen and all(s == {"w", "b"} for s in seen), seen

    models = server.state_dir / "models"
    v1 = read_weights((models / "v00001.spore").read_bytes())
    v2 = read_weights((models / "v00002.spore").read_bytes())
    # Round 1: the mean of the raw deltas (1 and 2, equal weights); round 2: +1.
    for k in ("w", "b"):
        np.testing.assert_allclose(v1[k], v0[k] + 1.5, rtol=1e-6)
        np.testing.assert_allclose(v2[k], v0[k] + 2.5, rtol=1e-6)
    for v in (v1, v2):
        assert v["scale"].tobytes() == v0["scale"].tobytes()
