"""A fit phase's kept updates: written with their CRC-32, dropped by the checkpoints that
contain them, each only once per aggregator."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from sporenet.federated.aggregation import WeightedMeanAggregator
from sporenet.federated.common.checksum import crc32
from sporenet.federated.server.checkpoint import load_arrays
from sporenet.federated.server.phase_files import PhaseFiles

TEMPLATE = {"w": ((3,), np.dtype(np.float32))}


def _keep(files: PhaseFiles, cid: str, payload: bytes, crc: int | None = None) -> None:
    files.keep(files.write_pending(cid, memoryview(payload), crc), cid)


def test_kept_update_ends_with_its_crc_given_or_computed(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    payload = b"update bytes"
    _keep(files, "a", payload)
    _keep(files, "b", payload, crc=crc32(payload))
    for cid in ("a", "b"):
        raw = files.kept(cid).read_bytes()
        assert raw[:-4] == payload
        assert struct.unpack("<I", raw[-4:])[0] == crc32(payload)
        assert files.read_kept(cid) == payload
    _keep(files, "c", payload, crc=crc32(payload) ^ 1)  # a wrong CRC: never read back
    assert files.read_kept("c") is None


def test_checkpoint_drops_only_updates_folded_since_the_last(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    agg = WeightedMeanAggregator(TEMPLATE)
    for k, cid in enumerate(("a", "b", "c")):
        _keep(files, cid, b"x")
        agg.add(cid, {"w": np.full(3, k, np.float32)}, 1.0)
    assert files.checkpoint(agg) == 3
    assert not any(files.kept(cid).exists() for cid in ("a", "b", "c"))
    np.testing.assert_array_equal(load_arrays(files.checkpoint_path)["sum/w"], [3.0, 3.0, 3.0])

    _keep(files, "d", b"x")
    agg.add("d", {"w": np.ones(3, np.float32)}, 1.0)
    _keep(files, "a", b"stale")  # not folded again: a checkpoint from 3 leaves it
    assert files.checkpoint(agg, dropped=3) == 4
    assert not files.kept("d").exists()
    assert files.kept("a").exists()
    assert files.checkpoint(agg, dropped=0) == 4  # from 0, every folded client's
    assert not files.kept("a").exists()
