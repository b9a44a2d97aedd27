"""Backpropagation through time for LSTM, GRU and RNN (forward: lite/kernels/recurrent.py).

LSTM_GRAD(X, W, R, B, sequence_lens, initial_h, initial_c, P, dY, dY_h, dY_c, saved) and
GRU_GRAD / RNN_GRAD(X, W, R, B, sequence_lens, initial_h, dY, dY_h) carry the forward
node's attributes. They run the forward pass again keeping each step's gates, then walk
the steps backwards. In a training graph an LSTM is an LSTM_TRAINING node, which writes
its steps to output 3 (`saved`) as it runs; LSTM_GRAD given that reads the steps instead
of recomputing them (the same arrays, so the same gradients bit for bit). Outputs:
the gradients of X, W, R, B, initial_h, initial_c, P, in that order, for those of them
the forward node has (absent inputs and sequence_lens get none). Gradients flow through
clip only where a gate was not clipped; a step past a sequence's length passes the state's
gradient through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.recurrent import (
    INITIAL_C,
    INITIAL_H,
    NUM_INPUTS,
    PEEPHOLES,
    B,
    Config,
    Inputs,
    R,
    Step,
    Trace,
    W,
    X,
    check_inputs,
    output_shapes,
    parse_config,
    run_sequence,
)
from sporenet.lite.ops import OpCode

Array = np.ndarray

DIFFERENTIABLE = (X, W, R, B, INITIAL_H, INITIAL_C, PEEPHOLES)


def grad_outputs(kind: str, present: Sequence[bool]) -> list[int]:
    """Forward input positions that get a gradient output, given which inputs are present."""
    n = NUM_INPUTS[kind]
    return [k for k in DIFFERENTIABLE if k < n and k < len(present) and present[k]]


def _clip_mask(cfg: Config, pre: Array) -> Array | float:
    return 1.0 if cfg.clip is None else (np.abs(pre) < cfg.clip).astype(pre.dtype)


# An LSTM step as LSTM_TRAINING saves it: h, c, the gates' pre-activations and
# activations (4 * hidden each), h(c_new) and c_new, in units of hidden.
_SAVED = {"h": (0, 1), "c": (1, 2), "pre": (2, 6), "post": (6, 10), "extra": (10, 12)}
SAVED_WIDTH = 12


def saved_shape(cfg: Config, seq: int, batch: int) -> tuple[int, int, int, int]:
    """The shape of LSTM_TRAINING's saved steps: (dirs, seq, batch, 12 * hidden)."""
    return (cfg.dirs, seq, batch, SAVED_WIDTH * cfg.hidden)


def _field(cfg: Config, saved_step: Array, name: str) -> Array:
    start, stop = _SAVED[name]
    return saved_step[:, start * cfg.hidden : stop * cfg.hidden]


def save_traces(cfg: Config, traces: Sequence[Trace], saved: Array) -> None:
    """Write an LSTM's traces (run_sequence's) into `saved`, indexed by time step."""
    for d, trace in enumerate(traces):
        if not trace.steps:
            continue
        steps = saved[d, ::-1] if cfg.reverse[d] else saved[d]  # in the order they ran
        for name, (start, stop) in _SAVED.items():
            cols = slice(start * cfg.hidden, stop * cfg.hidden)
            np.stack([getattr(step, name) for step in trace.steps], out=steps[:, :, cols])


def load_traces(cfg: Config, inp: Inputs, saved: Array) -> list[Trace]:
    """The traces run_sequence(trace=True) gives for these inputs, as views of `saved`
    (which save_traces wrote for the same inputs); the masks follow from sequence_lens."""
    seq = saved.shape[1]
    masks = None
    if inp.lens is not None and np.any(inp.lens < seq):
        masks = (np.arange(seq)[:, None] < inp.lens[None, :])[:, :, None]  # (seq, batch, 1)
    traces = []
    for d, reverse in enumerate(cfg.reverse):
        trace = Trace()
        for t in range(seq - 1, -1, -1) if reverse else range(seq):
            fields = {name: _field(cfg, saved[d, t], name) for name in _SAVED}
            mask = None if masks is None else masks[t]
            trace.time.append(t)
            trace.steps.append(Step(mask=mask, **fields))
        traces.append(trace)
    return traces


def backward(
    cfg: Config,
    inp: Inputs,
    dy: Array | None,
    dy_h: Array | None,
    dy_c: Array | None,
    saved: Array | None = None,
) -> dict[int, Array]:
    """Gradients (time-major layout) of every differentiable input, keyed by position;
    the forward steps are read from `saved` (LSTM_TRAINING's output 3) when given."""
    if saved is None:
        _, _, _, traces = run_sequence(cfg, inp, trace=True)
    else:
        traces = load_traces(cfg, inp, saved)
    x = inp.x
    seq, batch, size = x.shape
    hidden, gh, dtype = cfg.hidden, cfg.gates * cfg.hidden, x.dtype
    dx = np.zeros(x.shape, dtype)
    dw, dr = np.zeros_like(inp.w), np.zeros_like(inp.r)
    db = np.zeros((cfg.dirs, 2 * gh), dtype)
    dh0 = np.zeros((cfg.dirs, batch, hidden), dtype)
    dc0 = np.zeros_like(dh0)
    dp = np.zeros((cfg.dirs, 3 * hidden), dtype)
    x2 = x.reshape(seq * batch, size)
    for d, trace in enumerate(traces):
        dh = np.zeros((batch, hidden), dtype) if dy_h is None else dy_h[d].astype(dtype)
        dc = np.zeros((batch, hidden), dtype) if dy_c is None else dy_c[d].astype(dtype)
        if trace.steps and trace.steps[0].mask is not None:  # empty sequences: zero states
            nonempty = np.any([step.mask for step in trace.steps], axis=0)
            dh, dc = dh * nonempty, dc * nonempty
        dxw = np.zeros((seq, batch, gh), dtype)
        drb_h = np.zeros(hidden, dtype)
        for t, step in zip(reversed(trace.time), reversed(trace.steps), strict=True):
            if dy is not None:
                dh = dh + dy[t, d] if step.mask is None else dh + dy[t, d] * step.mask
            live_dh, live_dc = dh, dc
            if step.mask is not None:
                live_dh, live_dc = dh * step.mask, dc * step.mask
            if cfg.kind == "LSTM":
                da, dh_prev, dc_prev = _lstm_back(cfg, d, step, live_dh, live_dc, inp, dp)
            elif cfg.kind == "GRU":
                da, dh_prev, dq = _gru_back(cfg, d, step, live_dh, inp.r[d], dr[d])
                drb_h += dq.sum(axis=0)
                dc_prev = dc
            else:
                da = live_dh * cfg.acts[d][0].grad(step.pre, step.post) * _clip_mask(cfg, step.pre)
                dh_prev, dc_prev = da @ inp.r[d], dc
            if cfg.kind != "GRU":
                dr[d] += da.T @ step.h
            if step.mask is not None:
                keep = 1 - step.mask
                dh_prev = dh_prev + dh * keep
                if cfg.kind == "LSTM":
                    dc_prev = dc_prev + dc * keep
            dxw[t] = da
            dh, dc = dh_prev, dc_prev
        dh0[d], dc0[d] = dh, dc
        dxw2 = dxw.reshape(seq * batch, gh)
        dx += (dxw2 @ inp.w[d]).reshape(x.shape)
        dw[d] = dxw2.T @ x2
        db[d, :gh] = dxw2.sum(axis=0)
        db[d, gh:] = db[d, :gh]
        if cfg.kind == "GRU":
            db[d, gh + 2 * hidden :] = drb_h
    return {X: dx, W: dw, R: dr, B: db, INITIAL_H: dh0, INITIAL_C: dc0, PEEPHOLES: dp}


def _lstm_back(
    cfg: Config, d: int, step: Step, dh: Array, dc: Array, inp: Inputs, dp: Array
) -> tuple[Array, Array, Array]:
    hidden = cfg.hidden
    f, _, hact = cfg.acts[d]
    g = cfg.acts[d][1]
    ai, ao, af, ac = (step.pre[:, k * hidden : (k + 1) * hidden] for k in range(4))
    i, o, forget, cand = (step.post[:, k * hidden : (k + 1) * hidden] for k in range(4))
    hc, c_new = step.extra[:, :hidden], step.extra[:, hidden:]  # type: ignore[index]
    c = step.c
    p = inp.p
    dao = dh * hc * f.grad(ao, o) * _clip_mask(cfg, ao)
    dct = dc + dh * o * hact.grad(c_new, hc)
    if p is not None:
        dct = dct + dao * p[d, hidden : 2 * hidden]
    di = dct * cand
    dforget = dct * c
    if cfg.input_forget:
        di = di - dforget
        daf = np.zeros_like(dforget)
    else:
        daf = dforget * f.grad(af, forget) * _clip_mask(cfg, af)
    dai = di * f.grad(ai, i) * _clip_mask(cfg, ai)
    dac = dct * i * g.grad(ac, cand) * _clip_mask(cfg, ac)
    dc_prev = dct * forget
    if p is not None:
        dc_prev = dc_prev + dai * p[d, :hidden] + daf * p[d, 2 * hidden :]
        dp[d, :hidden] += (dai * c).sum(axis=0)
        dp[d, hidden : 2 * hidden] += (dao * c_new).sum(axis=0)
        dp[d, 2 * hidden :] += (daf * c).sum(axis=0)
    da = np.concatenate([dai, dao, daf, dac], axis=1)
    return da, da @ inp.r[d], dc_prev


def _gru_back(
    cfg: Config, d: int, step: Step, dh: Array, r_d: Array, dr_d: Array
) -> tuple[Array, Array, Array]:
    """The gate gradients, the previous state's gradient and that of the reset-side product
    (for the h-part of Rb); accumulates dR into dr_d."""
    hidden = cfg.hidden
    f, g = cfg.acts[d]
    az, ar, ah = (step.pre[:, k * hidden : (k + 1) * hidden] for k in range(3))
    z, r, cand = (step.post[:, k * hidden : (k + 1) * hidden] for k in range(3))
    q, h = step.extra, step.h
    rzr, rh = r_d[: 2 * hidden], r_d[2 * hidden :]
    dz = dh * (h - cand)
    dah = dh * (1 - z) * g.grad(ah, cand) * _clip_mask(cfg, ah)
    dh_prev = dh * z
    if cfg.linear_before_reset:
        d_reset = dah * q
        dq = dah * r
        dh_prev = dh_prev + dq @ rh
        dr_d[2 * hidden :] += dq.T @ h
    else:
        dq = dah
        drh = dq @ rh
        d_reset = drh * h
        dh_prev = dh_prev + drh * r
        dr_d[2 * hidden :] += dq.T @ (r * h)
    daz = dz * f.grad(az, z) * _clip_mask(cfg, az)
    dar = d_reset * f.grad(ar, r) * _clip_mask(cfg, ar)
    dzr = np.concatenate([daz, dar], axis=1)
    dh_prev = dh_prev + dzr @ rzr
    dr_d[: 2 * hidden] += dzr.T @ h
    return np.concatenate([dzr, dah], axis=1), dh_prev, dq


class _RecurrentGrad(Kernel):
    """Inputs: the forward node's (padded to its full count with absent entries), then the
    gradients of its outputs (LSTM: then the steps LSTM_TRAINING saved); outputs: see
    grad_outputs."""

    kind: ClassVar[str]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.cfg = parse_config(self, self.kind)
        n = NUM_INPUTS[self.kind]
        seq, batch, _ = check_inputs(self, self.cfg)
        shapes = output_shapes(self.cfg, seq, batch)
        grads = list(inputs[n : n + len(shapes)])
        for k, spec in enumerate(grads):
            if spec is not None and spec.shape != shapes[k]:
                raise self.fail(
                    f"gradient of output {k} must have shape {list(shapes[k])}, "
                    f"got {list(spec.shape)}"
                )
        saved = self.optional_input(n + len(shapes)) if len(inputs) > n + len(shapes) else None
        if saved is not None:
            want = saved_shape(self.cfg, seq, batch)
            if saved.shape != want or saved.dtype != self.input(X).dtype:
                raise self.fail(
                    f"the saved steps (input {n + len(shapes)}) must be "
                    f"{self.input(X).dtype}{list(want)}, got {saved.dtype}{list(saved.shape)}"
                )
        present = [spec is not None for spec in inputs[:n]]
        self.positions = grad_outputs(self.kind, present)
        self.output_specs = [
            TensorSpec(self.input(k).shape, self.input(k).dtype) for k in self.positions
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        cfg, n, positions = self.cfg, NUM_INPUTS[self.kind], self.positions
        dy, dy_h, dy_c, saved = (list(inputs[n:]) + [None] * 4)[:4]
        if cfg.layout:  # time-major views of the batch-first gradients
            dy = None if dy is None else dy.transpose(1, 2, 0, 3)
            dy_h = None if dy_h is None else dy_h.transpose(1, 0, 2)
            dy_c = None if dy_c is None else dy_c.transpose(1, 0, 2)
        forward_inputs = inputs[:n]

        def compute() -> None:
            inp = Inputs.from_node(cfg, forward_inputs)
            result = backward(cfg, inp, dy, dy_h, dy_c, saved)
            for out, k in zip(outputs, positions, strict=True):
                value = result[k]
                if cfg.layout and k in (X, INITIAL_H, INITIAL_C):  # batch-first again
                    value = value.transpose(1, 0, 2)
                out[...] = value

        return compute


class LSTMGrad(_RecurrentGrad):
    op = OpCode.LSTM_GRAD
    kind = "LSTM"
    num_inputs = (3, 12)


class GRUGrad(_RecurrentGrad):
    op = OpCode.GRU_GRAD
    kind = "GRU"
    num_inputs = (3, 8)


class RNNGrad(_RecurrentGrad):
    op = OpCode.RNN_GRAD
    kind = "RNN"
    num_inputs = (3, 8)


def _saving_applies(cfg: Config, inp: Inputs) -> bool:
    """Whether forward_saving computes this LSTM (else run_sequence, then save_traces)."""
    return inp.p is None and not cfg.quantize_activations and inp.x.shape[0] > 0


def forward_saving(cfg: Config, inp: Inputs, out: tuple[Array, Array, Array], saved: Array) -> None:
    """An LSTM without peepholes, as recurrent.run_sequence computes it (the same
    operations in the same order, so the same bits), writing each step's trace straight
    into `saved` instead of building Step objects to copy there afterwards."""
    x, (y, y_h, y_c), hidden = inp.x, out, cfg.hidden
    seq, batch, size = x.shape
    h3 = 3 * hidden
    masks = None
    if inp.lens is not None and np.any(inp.lens < seq):
        masks = (np.arange(seq)[:, None] < inp.lens[None, :])[:, :, None]  # (seq, batch, 1)
    x2 = x.reshape(seq * batch, size)
    for d, reverse in enumerate(cfg.reverse):
        f, g, hact = cfg.acts[d]
        xw = x2 @ inp.w[d].T
        if inp.b is not None:
            xw += inp.b[d, : 4 * hidden] + inp.b[d, 4 * hidden :]
        xw = xw.reshape(seq, batch, 4 * hidden)
        rt = np.ascontiguousarray(inp.r[d].T)
        h = np.zeros((batch, hidden), x.dtype) if inp.h0 is None else inp.h0[d].copy()
        c = np.zeros((batch, hidden), x.dtype) if inp.c0 is None else inp.c0[d].copy()
        for t in range(seq - 1, -1, -1) if reverse else range(seq):
            step = {name: _field(cfg, saved[d, t], name) for name in _SAVED}
            step["h"][...], step["c"][...] = h, c
            a, post = step["pre"], step["post"]
            np.add(h @ rt, xw[t], out=a)
            if cfg.clip is not None:
                np.clip(a, -cfg.clip, cfg.clip, out=a)
            post[:, :h3] = f(a[:, :h3])
            if cfg.input_forget:
                np.subtract(1, post[:, :hidden], out=post[:, 2 * hidden : h3])
            post[:, h3:] = g(a[:, h3:])
            i, o, forget, cand = (post[:, k * hidden : (k + 1) * hidden] for k in range(4))
            hc, c_new = step["extra"][:, :hidden], step["extra"][:, hidden:]
            np.multiply(forget, c, out=c_new)
            c_new += i * cand
            hc[...] = hact(c_new)
            h_new = o * hc
            if masks is None:
                y[t, d] = h_new
                h, c = h_new, c_new
            else:
                np.multiply(h_new, masks[t], out=y[t, d])
                h, c = np.where(masks[t], h_new, h), np.where(masks[t], c_new, c)
        y_h[d], y_c[d] = h, c
        if masks is not None:  # an empty sequence has zero final states, as in onnxruntime
            y_h[d] *= masks.any(axis=0)
            y_c[d] *= masks.any(axis=0)


class LSTMTraining(Kernel):
    """LSTM_TRAINING: an LSTM (the general loop of recurrent.run_sequence, as LSTM_GRAD
    recomputes it) that also writes its steps to output 3 for LSTM_GRAD."""

    op = OpCode.LSTM_TRAINING
    num_inputs = (3, 8)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.cfg = parse_config(self, "LSTM")
        seq, batch, _ = check_inputs(self, self.cfg)
        dtype = self.input(X).dtype
        shapes = [*output_shapes(self.cfg, seq, batch), saved_shape(self.cfg, seq, batch)]
        self.output_specs = [TensorSpec(shape, dtype) for shape in shapes]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        cfg = self.cfg
        y, y_h, y_c, saved = outputs
        if cfg.layout:  # write through time-major views of the batch-first outputs
            y, y_h, y_c = y.transpose(1, 2, 0, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)

        def compute() -> None:
            inp = Inputs.from_node(cfg, inputs)
            if _saving_applies(cfg, inp):
                forward_saving(cfg, inp, (y, y_h, y_c), saved)
            else:
                _, _, _, traces = run_sequence(cfg, inp, trace=True, out=(y, y_h, y_c))
                save_traces(cfg, traces, saved)

        return compute
