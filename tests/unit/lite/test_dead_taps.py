"""lite.kernels.dead_taps.trim_window: which taps a window keeps and the pads with them."""

from __future__ import annotations

from sporenet.lite.kernels.dead_taps import trim_window


def test_a_tap_dilated_past_the_input_keeps_only_the_centre():
    kept, pads = trim_window((1, 25), (1, 5), (1, 1), (1, 64), (0, 128, 0, 128))
    assert kept == (range(0, 1), range(2, 3))
    assert pads == [0, 0, 0, 0]


def test_nothing_dead_is_none():
    assert trim_window((1, 25), (1, 5), (1, 1), (1, 2), (0, 4, 0, 4)) is None


def test_an_axis_that_would_need_a_crop_keeps_its_taps():
    # One output: tap 0 reads position 0, tap 1 position 2, past the input's 2 (in the
    # right pad of 1); cutting tap 1 would leave a right pad of 1 - 2 = -1 (a crop).
    assert trim_window((1, 2), (1, 2), (1, 1), (1, 2), (0, 0, 0, 1)) is None


def test_all_dead_axis_is_left_alone():
    # With no live tap the output is the bias alone: the window is kept as it is.
    assert trim_window((1, 2), (1, 3), (1, 1), (1, 5), (0, 10, 0, 10)) is None
