"""Learning-rate schedule values."""

from __future__ import annotations

import math

import pytest

from sporenet.cloud.schedules import CosineDecay, StepDecay, WarmUp


def test_step_decay():
    s = StepDecay(0.1, step_size=3, gamma=0.5)
    assert [s(t) for t in range(7)] == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])


def test_cosine_decay_endpoints_and_midpoint():
    s = CosineDecay(1.0, total=10, min_lr=0.1)
    assert s(0) == pytest.approx(1.0)
    assert s(5) == pytest.approx(0.55)
    assert s(10) == pytest.approx(0.1)
    assert s(25) == pytest.approx(0.1)
    assert s(3) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.3)))


def test_warm_up_then_schedule():
    s = WarmUp(StepDecay(1.0, step_size=2, gamma=0.1), warmup=4, start_factor=0.2)
    assert [s(t) for t in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert [s(t) for t in range(4, 8)] == pytest.approx([1.0, 1.0, 0.1, 0.1])
