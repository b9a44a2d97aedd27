"""Fixtures for the federated unit tests."""

from __future__ import annotations

import pytest

from tests.unit.federated.round_helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
