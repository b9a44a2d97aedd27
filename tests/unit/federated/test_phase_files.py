"""A fit phase's journal of accepted updates: one record per update and participant row
with their CRC-32s, read back by client (the last record wins), cut at a torn record,
emptied by a checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sporenet.federated.aggregation import WeightedMeanAggregator
from sporenet.federated.common.checksum import crc32
from sporenet.federated.server.checkpoint import load_arrays
from sporenet.federated.server.phase_files import HEAD, TAIL, PhaseFiles


def record_size(client_id: str, payload: bytes, samples: int = 0, metrics: str = "{}") -> int:
    """Bytes of one journal record (its row is the JSON list [id, samples, metrics])."""
    row = f'["{client_id}", {samples}, {metrics}]'.encode()
    return HEAD.size + len(row) + len(payload) + TAIL.size


TEMPLATE = {"w": ((3,), np.dtype(np.float32))}


def test_journalled_updates_read_back_with_their_crc_given_or_computed(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    files.append("a", memoryview(b"update a"))
    files.append("b", memoryview(b"update b"), crc=crc32(b"update b"))
    files.append("c", memoryview(b"update c"), crc=crc32(b"update c") ^ 1)  # never read back
    files.close()
    size = files.journal_path.stat().st_size
    assert size == 3 * record_size("a", b"update a")

    again = PhaseFiles(tmp_path, 1, "fit")  # a restart reads what the first one wrote
    assert again.read_kept("a") == b"update a"
    assert again.read_kept("b") == b"update b"
    assert again.read_kept("c") is None
    assert again.read_kept("d") is None


def test_the_last_record_of_a_client_wins_and_a_torn_one_is_ignored(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    files.append("a", memoryview(b"first"))
    files.append("a", memoryview(b"second"))
    files.append("b", memoryview(b"torn record"))
    files.close()
    data = files.journal_path.read_bytes()
    files.journal_path.write_bytes(data[:-5])  # a crash in the middle of b's append

    again = PhaseFiles(tmp_path, 1, "fit")
    assert again.read_kept("a") == b"second"
    assert again.read_kept("b") is None


def test_checkpoint_saves_the_aggregate_and_empties_the_journal(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    agg = WeightedMeanAggregator(TEMPLATE)
    for k, cid in enumerate(("a", "b", "c")):
        files.append(cid, memoryview(b"x"))
        agg.add(cid, {"w": np.full(3, k, np.float32)}, 1.0)
    files.checkpoint(agg)
    assert files.journal_path.stat().st_size == 0
    assert files.read_kept("a") is None
    np.testing.assert_array_equal(load_arrays(files.checkpoint_path)["sum/w"], [3.0, 3.0, 3.0])

    files.append("d", memoryview(b"after"))  # appends continue at the journal's start
    assert files.read_kept("d") == b"after"
    assert files.journal_path.stat().st_size == record_size("d", b"after")
    files.remove()
    assert not files.dir.exists() and not files.checkpoint_path.exists()


def test_rows_read_back_with_the_last_record_of_each_client(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 2, "fit")
    files.append("a", memoryview(b"one"), num_samples=5, metrics={"loss": 0.5})
    files.append("b", memoryview(b"two"), num_samples=7)
    files.append("a", memoryview(b"three"), num_samples=9, metrics={"loss": 0.25})
    files.close()

    again = PhaseFiles(tmp_path, 2, "fit")
    assert again.rows() == {"a": (9, {"loss": 0.25}), "b": (7, {})}
    assert again.read_kept("a") == b"three"


def test_a_damaged_row_ends_the_journal_there(tmp_path: Path) -> None:
    files = PhaseFiles(tmp_path, 1, "fit")
    files.append("a", memoryview(b"first"), num_samples=1)
    files.append("b", memoryview(b"second"), num_samples=2)
    files.close()
    data = bytearray(files.journal_path.read_bytes())
    at = record_size("a", b"first", 1) + HEAD.size + 3  # inside b's row
    data[at] ^= 0xFF
    files.journal_path.write_bytes(bytes(data))

    again = PhaseFiles(tmp_path, 1, "fit")
    assert again.rows() == {"a": (1, {})}
    assert again.read_kept("b") is None
