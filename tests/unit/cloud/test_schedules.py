"""Learning-rate schedule values (cloud's validated versions of lite's schedules)."""

from __future__ import annotations

import math

import pytest

from sporenet.cloud.schedules import CosineLR, StepLR, WarmUp


def test_step_lr():
    s = StepLR(0.1, step_size=3, gamma=0.5)
    assert [s(t) for t in range(7)] == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])


def test_cosine_lr_endpoints_and_midpoint():
    s = CosineLR(1.0, total_steps=10, min_lr=0.1)
    assert s(0) == pytest.approx(1.0)
    assert s(5) == pytest.approx(0.55)
    assert s(10) == pytest.approx(0.1)
    assert s(25) == pytest.approx(0.1)
    assert s(3) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.3)))


def test_warm_up_then_schedule():
    s = WarmUp(StepLR(1.0, step_size=6, gamma=0.1), warmup_steps=4)
    assert [s(t) for t in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert [s(t) for t in range(4, 8)] == pytest.approx([1.0, 1.0, 0.1, 0.1])
