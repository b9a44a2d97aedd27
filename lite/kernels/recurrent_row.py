"""LSTM steps for a single sequence (batch 1), laid out for few array calls per step.

With one row a step is a matrix-vector product and about a dozen operations on vectors
of a few hundred values, each of which costs more in call overhead than in arithmetic.
This loop computes exactly what recurrent_fast._lstm_steps computes, value for value,
with fewer calls:

- The cell state lives in the gates' buffer, gate-major [c, i, o, f, g] (each block
  holds every direction's values, so no gate operation of two directions reads a
  strided slice): the product's sum with the projections writes [i, o, f, g], and one
  multiply of [c, i] by [f, g] gives both c * f and i * g.
- Each step writes its new hidden state straight into Y, which the next step reads:
  one direction steps in Y[t, 0]; two step in one strided view over Y[k, 0] and
  Y[seq-1-k, 1] (the forward direction's time and the reverse one's), so no step copies
  its state out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from sporenet.lite.kernels import recurrent_quant
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.workspace import temporary


def step_states(y: np.ndarray, reverse: Sequence[bool]) -> list[np.ndarray]:
    """Per step k, the (dirs, 1, H) view of Y the step writes: each direction's row at
    its own time (k, or seq-1-k for a reverse direction), as one strided array; `y` is
    (seq, dirs, 1, H) with one or two directions."""
    seq, dirs = y.shape[:2]
    views = []
    for k in range(seq):
        rows = [y[seq - 1 - k if reverse[d] else k, d] for d in range(dirs)]
        if dirs == 1:
            views.append(rows[0][np.newaxis])
            continue
        # Two directions (ONNX's most): their rows are always one stride apart.
        first, second = (r.__array_interface__["data"][0] for r in rows)
        stride = second - first
        views.append(as_strided(rows[0], (dirs, *rows[0].shape), (stride, *rows[0].strides)))
    return views


def set_states(starts: Sequence[tuple[np.ndarray, np.ndarray | None]]) -> None:
    """Each (state, initial value) pair's state set to its value (None: zeros)."""
    for state, value in starts:
        if value is None:
            state.fill(0)
        else:
            np.copyto(state, value)


def bind_lstm_row(
    rt: np.ndarray,
    xw: np.ndarray,
    y: np.ndarray,
    initial: tuple[np.ndarray | None, np.ndarray | None],
    finals: tuple[np.ndarray, np.ndarray],
    reverse: Sequence[bool],
    quantize: bool,
) -> Compute:
    """The steps of every direction side by side for one sequence: `rt` is R^T (dirs,
    H, 4H) with the sigmoid gates' columns halved (recurrent_fast._pack), `xw` the input
    projections gate-major in step order, (seq, 4, dirs, 1, H), `y` (seq, dirs, 1, H);
    `initial` the states h0 and c0 (None: zeros) and `finals` Y_h and Y_c. With
    `quantize`, each state is rounded to uint8 (per direction) before its product, as
    recurrent_fast's steps do (module docstring)."""
    dirs, hidden, dtype = rt.shape[0], rt.shape[1], rt.dtype
    # Written before they are read on every call: temporaries from the plan's arena.
    buf = temporary((5, dirs, 1, hidden), dtype)  # [c, i, o, f, g]
    # One direction's gates are one run of memory either way: the product writes them.
    product = (
        buf[1:].reshape(1, 1, 4 * hidden) if dirs == 1 else temporary((dirs, 1, 4 * hidden), dtype)
    )
    by_gate = product.reshape(dirs, 1, 4, hidden).transpose(2, 0, 1, 3)
    tmp = temporary((dirs, 1, hidden), dtype)
    h_start = temporary((dirs, 1, hidden), dtype)
    h_in = temporary((dirs, 1, hidden), dtype) if quantize else None
    states = step_states(y, reverse)
    previous = [h_start, *states[:-1]]
    if h_in is None:
        rounds: list[Compute | None] = [None] * len(states)
        reads = previous
    else:
        rounds = list(recurrent_quant.bind_fake_quantize_each(previous, h_in, dirs))
        reads = [h_in] * len(states)
    steps = list(zip(rounds, reads, xw, states, strict=True))
    matmul, add, multiply, tanh, copyto = np.matmul, np.add, np.multiply, np.tanh, np.copyto
    one, half = np.array(1, dtype), np.array(0.5, dtype)
    c, ci, i, o, fg, gates, sig = buf[0], buf[:2], buf[1], buf[2], buf[3:], buf[1:], buf[1:4]
    starts = [(h_start, initial[0]), (c, initial[1])]
    y_h, y_c = finals
    last = states[-1]

    def compute() -> None:
        set_states(starts)
        for round_h, h_read, xw_k, h_new in steps:
            if round_h is not None:
                round_h()
            matmul(h_read, rt, out=product)
            add(by_gate, xw_k, out=gates)
            tanh(gates, out=gates)
            add(sig, one, out=sig)
            multiply(sig, half, out=sig)  # i, o, f: (1 + tanh(x / 2)) / 2
            multiply(ci, fg, out=ci)  # c * f, i * g
            add(c, i, out=c)
            tanh(c, out=tmp)
            multiply(o, tmp, out=h_new)
        copyto(y_h, last)
        copyto(y_c, c)

    return compute
