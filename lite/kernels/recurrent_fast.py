"""Inference steps of LSTM and GRU with their weights packed once and no allocation.

The general loop (recurrent.run_sequence) serves every attribute combination and the
backward pass; per step it makes a dozen temporaries and re-transposes R on every call.
The common inference case (constant W, R and B, default activations, no clip, peepholes
or sequence_lens, time-major layout) runs here instead, with buffers made at bind:

- W and R are stored transposed, (in, gates*H) and (H, gates*H), so each projection is a
  plain GEMM, and both biases are summed into the input projection where they add.
- The sigmoid gates' columns of W, R and the biases are scaled by 1/2 at bind (exact in
  binary floating point), so sigmoid(x) = (1 + tanh(x/2)) / 2 needs no scaling pass and
  one tanh call serves the sigmoid gates and the candidate together.
- The new hidden state is written straight into Y[t, d], which the next step reads.
- The projections, gates and cell state are temporaries (kernels/workspace.py): the plan's
  arena lends them for the step and other nodes reuse the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sporenet.lite.kernels.base import Compute, TensorSpec
from sporenet.lite.kernels.workspace import temporary

if TYPE_CHECKING:
    from sporenet.lite.kernels.recurrent import Config

# Input positions (ONNX's order).
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = range(8)


def applies(cfg: Config, specs: Sequence[TensorSpec | None]) -> bool:
    """Whether the fast path computes this node (see the module docstring)."""
    from sporenet.lite.kernels.recurrent import ACTIVATIONS, DEFAULT_ACTIVATIONS

    if cfg.kind not in ("LSTM", "GRU") or cfg.layout or cfg.clip is not None:
        return False
    if cfg.kind == "LSTM" and cfg.input_forget:
        return False
    names = DEFAULT_ACTIVATIONS[cfg.kind]
    for acts in cfg.acts:
        for act, name in zip(acts, names, strict=True):
            if act.fn is not ACTIVATIONS[name]:
                return False
    given = list(specs) + [None] * (8 - len(specs))
    if min(given[X].shape[:2]) == 0:  # type: ignore[union-attr]
        return False
    if given[SEQUENCE_LENS] is not None or given[PEEPHOLES] is not None:
        return False
    return all(given[k] is None or given[k].value is not None for k in (W, R, B))  # type: ignore[union-attr]


def _pack(cfg: Config, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, sig: int) -> tuple:
    """Per direction: W^T, R^T, the input-side bias and (GRU) the recurrent candidate bias,
    with the first `sig` gate columns (the sigmoid gates) halved."""
    hidden, gates = cfg.hidden, cfg.gates
    gh = gates * hidden
    scale = np.ones(gh, np.float64)
    scale[: sig * hidden] = 0.5
    # Halving is exact in any binary float: the weights scale in their own dtype, written
    # transposed into one new array each (no wider temporaries of the weights' size).
    column_scale = scale.astype(w.dtype)
    packed = []
    for d in range(w.shape[0]):
        wt = np.multiply(w[d].T, column_scale, out=np.empty(w[d].T.shape, w.dtype))
        rt = np.multiply(r[d].T, column_scale, out=np.empty(r[d].T.shape, w.dtype))
        bias = np.zeros(gh, np.float64)
        rb_h = None
        if b is not None:
            wb, rb = b[d, :gh].astype(np.float64), b[d, gh:].astype(np.float64)
            bias += wb
            if cfg.kind == "GRU":
                bias[: 2 * hidden] += rb[: 2 * hidden]
                rb_h = rb[2 * hidden :].astype(w.dtype)
            else:
                bias += rb
        packed.append((wt, rt, (bias * scale).astype(w.dtype), rb_h))
    return tuple(packed)


def bind_fast(
    cfg: Config,
    inputs: list[np.ndarray | None],
    y: np.ndarray,
    y_h: np.ndarray,
    y_c: np.ndarray | None,
) -> Compute:
    """The step computing Y, Y_h (and Y_c) for a node `applies` accepted."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    x, h0, c0 = inputs[X], inputs[INITIAL_H], inputs[INITIAL_C]
    seq, batch, size = x.shape  # type: ignore[union-attr]
    hidden, gh = cfg.hidden, cfg.gates * cfg.hidden
    lstm = cfg.kind == "LSTM"
    packed = _pack(cfg, inputs[W], inputs[R], inputs[B], 3 if lstm else 2)  # type: ignore[arg-type]
    dtype = x.dtype  # type: ignore[union-attr]
    x2 = x.reshape(seq * batch, size)  # type: ignore[union-attr]
    # Written before they are read on every call: temporaries from the plan's arena.
    xw = temporary((seq * batch, gh), dtype)
    xw3 = xw.reshape(seq, batch, gh)
    a = temporary((batch, gh), dtype)
    tmp = temporary((batch, hidden), dtype)
    c = temporary((batch, hidden), dtype)
    h_init = np.zeros((batch, hidden), dtype)  # read, never written: the kernel's own
    matmul, add, multiply, tanh = np.matmul, np.add, np.multiply, np.tanh
    one, half = np.array(1, dtype), np.array(0.5, dtype)
    sig = 3 * hidden if lstm else 2 * hidden
    gates = a[:, :sig]  # the sigmoid gates' columns
    directions = []
    for d, reverse in enumerate(cfg.reverse):
        order = range(seq - 1, -1, -1) if reverse else range(seq)
        # Step t reads the state the previous step wrote into Y.
        prev = [None] * seq
        steps = list(order)
        for k, t in enumerate(steps):
            prev[t] = y[steps[k - 1], d] if k else None
        directions.append((d, packed[d], steps, prev))

    def lstm_direction(d: int, pack: tuple, steps: list[int], prev: list) -> None:
        wt, rt, bias, _ = pack
        matmul(x2, wt, out=xw)
        add(xw, bias, out=xw)
        if c0 is None:
            c.fill(0)
        else:
            np.copyto(c, c0[d])
        h = h_init if h0 is None else h0[d]
        i, o, f = a[:, :hidden], a[:, hidden : 2 * hidden], a[:, 2 * hidden : 3 * hidden]
        g = a[:, 3 * hidden :]
        for t in steps:
            if prev[t] is not None:
                h = prev[t]
            matmul(h, rt, out=a)
            add(a, xw3[t], out=a)
            tanh(a, out=a)
            add(gates, one, out=gates)
            multiply(gates, half, out=gates)
            multiply(c, f, out=c)
            multiply(i, g, out=tmp)
            add(c, tmp, out=c)
            tanh(c, out=tmp)
            multiply(o, tmp, out=y[t, d])
        np.copyto(y_h[d], y[steps[-1], d])
        np.copyto(y_c[d], c)  # type: ignore[index]

    def gru_direction(d: int, pack: tuple, steps: list[int], prev: list) -> None:
        wt, rt, bias, rb_h = pack
        matmul(x2, wt, out=xw)
        add(xw, bias, out=xw)
        h = h_init if h0 is None else h0[d]
        z, r, q = a[:, :hidden], a[:, hidden : 2 * hidden], a[:, 2 * hidden :]
        rt_zr, rt_h = rt[:, : 2 * hidden], rt[:, 2 * hidden :]
        zr = gates
        for t in steps:
            if prev[t] is not None:
                h = prev[t]
            xt = xw3[t]
            if cfg.linear_before_reset:
                matmul(h, rt, out=a)
                add(zr, xt[:, : 2 * hidden], out=zr)
                tanh(zr, out=zr)
                add(gates, one, out=gates)
                multiply(gates, half, out=gates)
                if rb_h is not None:
                    add(q, rb_h, out=q)
                multiply(r, q, out=q)
            else:
                matmul(h, rt_zr, out=zr)
                add(zr, xt[:, : 2 * hidden], out=zr)
                tanh(zr, out=zr)
                add(gates, one, out=gates)
                multiply(gates, half, out=gates)
                multiply(r, h, out=tmp)
                matmul(tmp, rt_h, out=q)
                if rb_h is not None:
                    add(q, rb_h, out=q)
            add(q, xt[:, 2 * hidden :], out=q)
            tanh(q, out=q)  # the candidate
            out = y[t, d]
            np.subtract(h, q, out=tmp)
            multiply(tmp, z, out=tmp)
            add(tmp, q, out=out)  # (1 - z) * cand + z * h
        np.copyto(y_h[d], y[steps[-1], d])

    run = lstm_direction if lstm else gru_direction

    def compute() -> None:
        for d, pack, steps, prev in directions:
            run(d, pack, steps, prev)

    return compute
