"""Which algorithm a Conv2D layer runs: the strategies and the one function choosing them.

`choose` is pure: it reads the layer's shapes and which operands are constants (all known
when the model is planned) and names a `ConvStrategy`; conv.py holds one small class per
strategy that binds it. The thresholds are measured, not derived:
benchmarks/conv_strategies.py times im2col and both Winograds on the layers at these
edges and prints which one `choose` picks for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ConvStrategy(StrEnum):
    """How a Conv2D layer computes (see conv.py's module docstring for each)."""

    POINTWISE = "pointwise"  # 1x1, stride 1, unpadded, ungrouped: one GEMM per image
    DEPTHWISE = "depthwise"  # group == in == out channels: kh*kw multiply-adds
    WINOGRAD4 = "winograd4"  # 3x3 stride 1: Winograd F(4x4, 3x3)
    WINOGRAD = "winograd"  # 3x3 stride 1: Winograd F(2x2, 3x3)
    IM2COL = "im2col"  # everything else: a column matrix times the weights


@dataclass(frozen=True)
class ConvLayer:
    """What choosing a strategy reads of one Conv2D layer."""

    batch: int
    in_channels: int
    out_channels: int
    group: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    padded: bool
    out: tuple[int, int]  # output height and width
    const_weights: bool
    has_bias: bool
    const_bias: bool  # a bias that is a constant (False without a bias)


def choose(layer: ConvLayer) -> ConvStrategy:
    """The fastest strategy for `layer`, by the measured thresholds below."""
    c, o = layer.in_channels, layer.out_channels
    if layer.kernel == (1, 1) and layer.strides == (1, 1) and not layer.padded and layer.group == 1:
        return ConvStrategy.POINTWISE
    if layer.group == c == o:
        return ConvStrategy.DEPTHWISE
    if not _winograd_applies(layer):
        return ConvStrategy.IM2COL
    if _winograd4_pays(layer.batch, c, o, layer.out):
        return ConvStrategy.WINOGRAD4
    oh, ow = layer.out
    tiles = layer.batch * -(-oh // 2) * -(-ow // 2)
    few_tiles_pay = tiles >= _WINOGRAD_MANY_TILES or c * o <= _WINOGRAD_MAX_WEIGHTS
    if oh * ow >= _WINOGRAD_MIN_PLANE and min(c, o) * tiles >= _WINOGRAD_MIN_WORK and few_tiles_pay:
        return ConvStrategy.WINOGRAD
    return ConvStrategy.IM2COL


def _winograd_applies(layer: ConvLayer) -> bool:
    """3x3, stride 1, undilated, ungrouped, constant weights (and bias), enough channels:
    the transformed weights are computed once at bind."""
    return (
        layer.kernel == (3, 3)
        and layer.strides == layer.dilations == (1, 1)
        and layer.group == 1
        and layer.const_weights
        and (layer.const_bias or not layer.has_bias)
        and min(layer.in_channels, layer.out_channels) >= _winograd_min_channels(layer.out)
    )


# Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions with outputs of at least this many
# positions and at least this many input channels. The transformed weights take 16/9 of
# the originals' memory and OpenBLAS re-packs them on every call, so with very few tiles
# the saved multiplications stop paying (the largest layers on the smallest planes stay
# on im2col, which also keeps their weights at their original size).
_WINOGRAD_MIN_PLANE = 36
# The transforms cost a few passes over the input and output tiles per call whatever the
# channel counts, while the GEMMs save 5/9 of the C*O work per tile: with few channels,
# or few tiles (N * ceil(OH/2) * ceil(OW/2)) times channels, the transforms eat the saving.
# On a small plane Winograd's tile buffers are small too, and F(4x4) pays from fewer
# channels (a text line's 24 channels on 32x80); on large planes those buffers cost more
# memory than the time they save.
_WINOGRAD_MIN_CH = 32
_WINOGRAD_SMALL_PLANE = 64 * 64
_WINOGRAD_SMALL_PLANE_MIN_CH = 16
_WINOGRAD_MIN_WORK = 2000
# Large weights on few tiles: F(2x2)'s transformed weights (16/9 of the originals, re-
# packed by OpenBLAS on every call) cost more than the multiplications they save. A
# ResNet's 512x512 layers on 7x7 planes (16 tiles) ran faster on im2col and kept 7 MiB
# less each; 256x256 on 14x14 (49 tiles) stays on F(2x2).
_WINOGRAD_MANY_TILES = 36
_WINOGRAD_MAX_WEIGHTS = 256 * 256
# Winograd F(4x4, 3x3) stores 36/9 of the weights' size and OpenBLAS re-packs them on
# every call, so it needs enough 4x4 tiles per weight byte; with few tiles and large
# weights F(2x2) wins. Up to 128x128 channels it wins from four tiles on (a 7x7 plane,
# or a text line's 8x20).
_WINOGRAD4_MIN_TILES = 4
_WINOGRAD4_MANY_TILES = 36
_WINOGRAD4_MAX_WEIGHTS = 128 * 128


def _winograd_min_channels(out_hw: tuple[int, int]) -> int:
    """The fewest channels (in and out) for which Winograd can pay on this output plane."""
    small = out_hw[0] * out_hw[1] <= _WINOGRAD_SMALL_PLANE
    return _WINOGRAD_SMALL_PLANE_MIN_CH if small else _WINOGRAD_MIN_CH


def _winograd4_pays(n: int, c: int, o: int, out_hw: tuple[int, int]) -> bool:
    """Whether F(4x4, 3x3) beats F(2x2, 3x3) and im2col on this layer (see above)."""
    tiles = n * -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    return tiles >= _WINOGRAD4_MANY_TILES or (
        tiles >= _WINOGRAD4_MIN_TILES and c * o <= _WINOGRAD4_MAX_WEIGHTS
    )
