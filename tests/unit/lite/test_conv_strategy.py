"""conv_strategy.choose: a pure function of a layer's shapes and constant operands,
checked without building a kernel, and the strategy each Conv2D runs is the one it names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.kernels.conv_strategy import ConvLayer, ConvStrategy, choose

BASE = ConvLayer(
    batch=1,
    in_channels=64,
    out_channels=64,
    group=1,
    kernel=(3, 3),
    strides=(1, 1),
    dilations=(1, 1),
    padded=True,
    out=(14, 14),
    const_weights=True,
    has_bias=True,
    const_bias=True,
)


@pytest.mark.parametrize(
    ("change", "strategy"),
    [
        ({}, ConvStrategy.WINOGRAD4),  # 16 tiles of 4x4 on 64 x 64 weights
        ({"kernel": (1, 1), "padded": False}, ConvStrategy.POINTWISE),
        ({"kernel": (1, 1), "padded": True}, ConvStrategy.IM2COL),  # padded 1x1: columns
        ({"group": 64}, ConvStrategy.DEPTHWISE),
        ({"group": 64, "kernel": (5, 5)}, ConvStrategy.DEPTHWISE),
        ({"strides": (2, 2)}, ConvStrategy.IM2COL),
        ({"dilations": (2, 2)}, ConvStrategy.IM2COL),
        ({"group": 2}, ConvStrategy.IM2COL),
        ({"const_weights": False}, ConvStrategy.IM2COL),  # nothing to transform at bind
        ({"const_bias": False}, ConvStrategy.IM2COL),  # a run-time bias
        ({"has_bias": False, "const_bias": False}, ConvStrategy.WINOGRAD4),
        ({"in_channels": 8}, ConvStrategy.IM2COL),  # too few channels
        ({"out": (2, 2)}, ConvStrategy.IM2COL),  # too few positions for either Winograd
        ({"in_channels": 256, "out_channels": 256, "out": (7, 7)}, ConvStrategy.WINOGRAD),
        ({"in_channels": 512, "out_channels": 512, "out": (4, 4)}, ConvStrategy.IM2COL),
    ],
)
def test_choose_names_the_measured_strategy(change, strategy) -> None:
    assert choose(dataclasses.replace(BASE, **change)) is strategy


def test_conv2d_runs_what_choose_names_and_can_be_forced() -> None:
    x = TensorSpec((1, 64, 14, 14), np.dtype(np.float32))
    w = np.ones((64, 64, 3, 3), np.float32)
    kernel = Conv2D(Attrs("Conv", {"pads": [1, 1, 1, 1]}), [x, TensorSpec(w.shape, w.dtype, w)])
    assert kernel.strategy is choose(kernel.layer) is ConvStrategy.WINOGRAD4
    kernel.force_strategy(ConvStrategy.IM2COL)  # as benchmarks/conv_strategies.py times it
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    xv = np.random.default_rng(0).normal(size=x.shape).astype(np.float32)
    kernel.bind([xv, w], [out])()
    assert kernel.strategy is ConvStrategy.IM2COL
    # All-ones weights: every output channel is the 3x3 window sum over all channels.
    padded = np.pad(xv[0].astype(np.float64).sum(0), 1)
    want = np.lib.stride_tricks.sliding_window_view(padded, (3, 3)).sum((2, 3))
    np.testing.assert_allclose(out[0], np.broadcast_to(want, out[0].shape), rtol=1e-5, atol=1e-4)
