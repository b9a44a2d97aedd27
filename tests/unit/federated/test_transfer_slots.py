"""How the server splits its transfer slots, and bounds receiving slots by memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import build_config
from sporenet.federated.server.slots import transfer_split

MiB = 1 << 20


@pytest.mark.parametrize(
    ("max_transfers", "update_bytes", "upload_memory", "want"),
    [
        (8, 0, 0, (4, 4)),  # no model size known: half each
        (3, 0, 0, (2, 1)),
        (1, 0, 0, (1, 1)),
        (8, 4 * MiB, 256 * MiB, (4, 4)),  # 1M parameters: memory is no limit
        (8, 100 * MiB, 256 * MiB, (4, 2)),  # two 100 MB updates fit, not three
        (8, 300 * MiB, 256 * MiB, (4, 1)),  # none fits: one slot all the same
    ],
)
def test_receiving_slots_are_bounded_by_the_memory_their_updates_take(
    max_transfers: int, update_bytes: int, upload_memory: int, want: tuple[int, int]
) -> None:
    got = transfer_split(max_transfers, update_bytes=update_bytes, upload_memory=upload_memory)
    assert got == want


def test_a_non_positive_upload_memory_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        build_config({"state_dir": str(tmp_path), "max_upload_memory": 0}, {})
    assert "`max_upload_memory` must be > 0" in str(e.value)
