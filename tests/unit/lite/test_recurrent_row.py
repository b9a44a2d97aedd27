"""The one-sequence LSTM loop (recurrent_row) computes what the batched loop
(recurrent_fast._lstm_steps) computes, value for value: the same array operations in the
same order on the same operands, only laid out for fewer calls. Both run in one process
on the same BLAS, so their results are equal bit for bit on any CPU."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels import recurrent_fast, recurrent_quant, recurrent_row

RNG = np.random.default_rng(11)


def _reference(rt, xw, initial, reverse, quantize):
    """Y, Y_h and Y_c from the batched loop at batch 1."""
    seq, dirs, _, gh = xw.shape
    hidden = gh // 4
    h, c = (np.zeros((dirs, 1, hidden), np.float32) if v is None else v.copy() for v in initial)
    h_in = np.zeros_like(h) if quantize else h
    y = np.full((seq, dirs, 1, hidden), np.nan, np.float32)
    writes = [
        [(y[seq - 1 - k if reverse[d] else k, d], h[d]) for d in range(dirs)] for k in range(seq)
    ]
    a, tmp = np.zeros((dirs, 1, gh), np.float32), np.zeros_like(h)
    recurrent_fast._lstm_steps((h, h_in, c, a, tmp), rt, xw, writes, quantize)()
    return y, h, c


@pytest.mark.parametrize("reverse", [(False,), (True,), (False, True)], ids=["fwd", "rev", "bidi"])
@pytest.mark.parametrize("quantize", [False, True], ids=["float", "uint8-states"])
@pytest.mark.parametrize("given", [False, True], ids=["zero-states", "initial-states"])
def test_row_loop_equals_batched_loop(reverse, quantize, given) -> None:
    dirs, hidden, seq = len(reverse), 24, 7
    rt = (0.3 * RNG.standard_normal((dirs, hidden, 4 * hidden))).astype(np.float32)
    xw = RNG.standard_normal((seq, dirs, 1, 4 * hidden)).astype(np.float32)
    initial = tuple(
        RNG.standard_normal((dirs, 1, hidden)).astype(np.float32) if given else None
        for _ in range(2)
    )
    want_y, want_h, want_c = _reference(rt, xw, initial, reverse, quantize)
    gate_major = np.ascontiguousarray(xw.reshape(seq, dirs, 1, 4, hidden).transpose(0, 3, 1, 2, 4))
    y = np.full((seq, dirs, 1, hidden), np.nan, np.float32)
    y_h, y_c = np.full_like(want_h, np.nan), np.full_like(want_c, np.nan)
    step = recurrent_row.bind_lstm_row(rt, gate_major, y, initial, (y_h, y_c), reverse, quantize)
    for _ in range(2):  # a second call starts again from the initial states
        step()
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(y_h, want_h)
        np.testing.assert_array_equal(y_c, want_c)


def test_step_states_view_each_directions_row_of_y() -> None:
    y = np.zeros((5, 2, 1, 3), np.float32)
    views = recurrent_row.step_states(y, (False, True))
    for k, view in enumerate(views):
        view[...] = k + 1
        assert np.all(y[k, 0] == k + 1) and np.all(y[4 - k, 1] == k + 1)


def test_rounding_of_each_state_shares_one_scratch() -> None:
    """bind_fake_quantize_each rounds every given state as bind_fake_quantize does."""
    states = [RNG.standard_normal((2, 1, 16)).astype(np.float32) for _ in range(3)]
    out = np.empty_like(states[0])
    for state, step in zip(
        states, recurrent_quant.bind_fake_quantize_each(states, out, 2), strict=True
    ):
        step()
        np.testing.assert_array_equal(out, recurrent_quant.fake_quantize(state, 2))
