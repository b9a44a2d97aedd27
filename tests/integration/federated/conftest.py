"""Fixtures for federated integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.federated.edge_helpers import EdgeProcess
from tests.integration.federated.helpers import ServerProcess


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Build ServerProcess objects that are always stopped at the end of the test."""
    started: list[ServerProcess] = []

    def factory(args: list[str], *, name: str = "state", port: int | None = None) -> ServerProcess:
        sp = ServerProcess(tmp_path / name, args, port=port)
        started.append(sp)
        return sp

    yield factory
    for sp in started:
        if sp.proc is not None and sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait(10)


@pytest.fixture
def edge_factory(tmp_path: Path) -> Iterator[Callable[..., EdgeProcess]]:
    """Build EdgeProcess objects (state dir tmp_path/NAME) stopped at the end of the test."""
    started: list[EdgeProcess] = []

    def factory(name: str, upstream: str, args: list[str]) -> EdgeProcess:
        edge = EdgeProcess(tmp_path / name, upstream, args)
        started.append(edge)
        return edge

    yield factory
    for edge in started:
        edge.stop()
