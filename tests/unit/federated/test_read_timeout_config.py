"""`read_timeout` (the upload read deadline) is checked at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import ServerConfig


def test_default_read_timeout_is_sane(tmp_path: Path) -> None:
    config = ServerConfig(state_dir=tmp_path)
    assert 0 < config.read_timeout < config.heartbeat_timeout


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), 7200])
def test_bad_read_timeouts_are_refused_by_name(tmp_path: Path, value: float) -> None:
    with pytest.raises(ConfigError, match=r"`read_timeout` must be in \(0, 3600\]"):
        ServerConfig(state_dir=tmp_path, read_timeout=value)
