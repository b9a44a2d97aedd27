"""Inference steps of LSTM and GRU with their weights packed once and no allocation.

The general loop (recurrent.run_sequence) serves every attribute combination and the
backward pass; per step it makes a dozen temporaries and re-transposes R on every call.
The common inference case (constant W, R and B, default activations, no clip, peepholes
or sequence_lens, time-major layout) runs here instead, with buffers made at bind:

- W and R are stored transposed, (in, gates*H) and (H, gates*H), so each projection is a
  plain GEMM, and both biases are summed into the input projection where they add.
  int8/uint8 weights are dequantized straight into that layout, one direction at a time:
  the packed arrays are the only float copies of the weights. An LSTM's int8 W is not
  copied at all: its projection is the transposed product of the integers as stored,
  scaled per gate column afterwards (kernels/int8_weights.py), which also keeps the
  weights a step reads from the cache smaller.
- The sigmoid gates' columns of W, R and the biases are scaled by 1/2 at bind (exact in
  binary floating point), so sigmoid(x) = (1 + tanh(x/2)) / 2 needs no scaling pass and
  one tanh call serves the sigmoid gates and the candidate together.
- An LSTM runs its directions side by side: step k advances the forward direction at
  time k and the reverse one at time seq-1-k with one batched product of the stacked
  states and the stacked R^T, and one call per gate operation for all directions. The
  input projections are stored in that step order (the reverse direction's time-flipped).
  When one direction's R^T fits in the core's L2 cache and all of them together do not,
  the directions run one after the other instead, so each R^T stays in cache over its
  steps (lite/cpu_cache.py; a bidirectional LSTM of 256 units then runs a third faster).
- A GRU runs its directions side by side in the same way; a direction that runs alone
  writes its new state straight into Y[t, d], which the next step reads.
- While a step's product is small, or one gate's runs unpacked where the whole would
  not (gate_major), an LSTM's or GRU's gates are each a contiguous (dirs, batch, H)
  block: the product writes through R^T's per-gate column views and the projections
  are laid out alike once per call, so no gate operation reads a strided slice (on a
  step's small arrays a strided ufunc call costs about three contiguous ones).
- An LSTM over one sequence (batch 1) steps in kernels/recurrent_row.py's loop, laid
  out for fewer array calls per step.
- The projections, gates and states are temporaries (kernels/workspace.py): the plan's
  arena lends them for the step and other nodes reuse the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from sporenet.lite import cpu_cache, huge_pages, pages, shared_weights
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels import int8_weights, recurrent_quant, recurrent_row
from sporenet.lite.kernels.base import Compute, TensorSpec, required
from sporenet.lite.kernels.conv_common import ROW_PRODUCT_MIN, UNPACKED_GEMM, row_products
from sporenet.lite.kernels.workspace import temporary

if TYPE_CHECKING:
    from sporenet.lite.kernels.recurrent import Config

# Input positions (ONNX's order).
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = range(8)

Packed = tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None]
"""W^T (None when W is read as stored), R^T, the input-side bias, the GRU's candidate bias."""

GruState = tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]
"""A GRU step's state to read, the state it writes, and (Y slice, state) copies after it."""


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
    x = given[X]
    if x is None or min(x.shape[:2]) == 0:
        return False
    if given[SEQUENCE_LENS] is not None or given[PEEPHOLES] is not None:
        return False
    return all(spec is None or spec.value is not None for spec in (given[W], given[R], given[B]))


def _gate_params(quant: Quantization, dirs: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Scales and zero points of (dirs, gates*H, rows) integer weights, quantized per
    direction (axis 0) or per gate column (axis 1), as float32 (dirs, gates*H) arrays."""
    from sporenet.lite.kernels.quantized.convert import broadcast_params

    scale, zp = broadcast_params(quant, 3)
    scale = np.broadcast_to(np.asarray(scale, np.float32), (dirs, cols, 1))[:, :, 0]
    zp = np.broadcast_to(np.asarray(zp, np.float32), (dirs, cols, 1))[:, :, 0]
    return scale, zp


def pack_transposed(
    value: np.ndarray, quant: Quantization | None, column_scale: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """(dirs, gates*H, rows) weights as (dirs, rows, gates*H), each column multiplied by
    `column_scale`; integer weights are dequantized on the way (as dequantize_array:
    float32 (q - zero_point) * scale), one direction's slice at a time, with no float
    temporary of the weights' size. Read-only, and shared with every live plan that packs
    the same constant alike (lite/shared_weights.py): a re-plan makes no second copy."""
    key = ("transposed", quant is None, np.dtype(dtype).str, column_scale.tobytes())
    out = shared_weights.shared(
        value, key, lambda: _packed_transposed(value, quant, column_scale, dtype)
    )
    if quant is not None:
        pages.release(value)
    return out


def _packed_transposed(
    value: np.ndarray, quant: Quantization | None, column_scale: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    dirs, cols, rows = value.shape
    out = huge_pages.empty((dirs, rows, cols), dtype)  # streamed every step: see huge_pages
    if quant is None:
        for d in range(dirs):
            np.multiply(value[d].T, column_scale, out=out[d])
        return out
    scale, zp = _gate_params(quant, dirs, cols)
    for d in range(dirs):
        np.copyto(out[d], value[d].T, casting="unsafe")  # integers: exact in float32
        np.subtract(out[d], zp[d], out=out[d])
        # (q - zp) * (scale / 2) equals ((q - zp) * scale) / 2: halving is exact.
        np.multiply(out[d], scale[d] * column_scale, out=out[d])
    return out


def _pack(
    cfg: Config,
    w: np.ndarray | None,
    r: np.ndarray,
    b: np.ndarray | None,
    quants: tuple[Quantization | None, Quantization | None],
    dtype: np.dtype,
    sig: int,
) -> Packed:
    """W^T (dirs, in, gates*H) (None without `w`), R^T (dirs, H, gates*H), the input-side
    bias (dirs, gates*H) and (GRU) the recurrent candidate bias (dirs, H), with the first
    `sig` gate columns (the sigmoid gates) halved."""
    hidden, gates, dirs = cfg.hidden, cfg.gates, cfg.dirs
    gh = gates * hidden
    scale = np.ones(gh, np.float64)
    scale[: sig * hidden] = 0.5
    column_scale = scale.astype(dtype)
    wt = None if w is None else pack_transposed(w, quants[0], column_scale, dtype)
    rt = pack_transposed(r, quants[1], column_scale, dtype)
    bias = np.zeros((dirs, gh), np.float64)
    rb_h = None
    if b is not None:
        wb, rb = b[:, :gh].astype(np.float64), b[:, gh:].astype(np.float64)
        bias += wb
        if cfg.kind == "GRU":
            bias[:, : 2 * hidden] += rb[:, : 2 * hidden]
            rb_h = np.ascontiguousarray(rb[:, 2 * hidden :], dtype)
        else:
            bias += rb
    return wt, rt, (bias * scale).astype(dtype), rb_h


def bind_fast(
    cfg: Config,
    inputs: list[np.ndarray | None],
    specs: Sequence[TensorSpec | None],
    y: np.ndarray,
    y_h: np.ndarray,
    y_c: np.ndarray | None,
) -> Compute:
    """The step computing Y, Y_h (and Y_c) for a node `applies` accepted; `specs` are the
    kernel's input specs (their quantization parameters for int8 weights)."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    specs = list(specs) + [None] * (8 - len(specs))
    x, h0, c0 = required(inputs, X), inputs[INITIAL_H], inputs[INITIAL_C]
    lstm = cfg.kind == "LSTM"
    dtype = x.dtype
    w_spec, r_spec = specs[W], specs[R]
    quants = (
        w_spec.quant if w_spec is not None and w_spec.dtype != dtype else None,
        r_spec.quant if r_spec is not None and r_spec.dtype != dtype else None,
    )
    # An LSTM projects X with int8 W as stored (kernels/int8_weights.py), no float copy.
    w_int8 = lstm and quants[0] is not None
    packed = _pack(
        cfg,
        None if w_int8 else inputs[W],
        required(inputs, R),
        inputs[B],
        quants,
        dtype,
        3 if lstm else 2,
    )
    if not lstm:
        return _bind_gru(cfg, x, h0, packed, y, y_h)
    # An LSTM's kernel allocates Y_c; `w_int8` says W's parameters are known.
    int8_w = (required(inputs, W), cast(Quantization, quants[0])) if w_int8 else None
    return _bind_lstm(cfg, x, h0, c0, packed, (y, y_h, cast(np.ndarray, y_c)), int8_w)


def _bind_gru(
    cfg: Config,
    x: np.ndarray,
    h0: np.ndarray | None,
    packed: Packed,
    y: np.ndarray,
    y_h: np.ndarray,
) -> Compute:
    """The GRU steps: the directions of each of `direction_groups` advanced together, as
    an LSTM's (see the module docstring)."""
    seq, batch, size = x.shape
    hidden, gh, dirs, dtype = cfg.hidden, cfg.gates * cfg.hidden, cfg.dirs, x.dtype
    if gate_major(batch, hidden, gh):
        return _bind_gru_gate_major(cfg, x, h0, packed, y, y_h)
    rt, rb_h = packed[1], packed[3]
    projections = _projections(cfg, x.reshape(seq * batch, size), seq, packed, None)
    # Written before they are read on every call: temporaries from the plan's arena.
    xw = temporary((seq, dirs, batch, gh), dtype)  # in step order, per direction
    h = temporary((dirs, batch, hidden), dtype)
    a = temporary((dirs, batch, gh), dtype)
    tmp = temporary((dirs, batch, hidden), dtype)
    groups = direction_groups(dirs, rt[0].nbytes, cpu_cache.l2_bytes())
    loops = []
    states: list[GruState]
    for g in groups:
        # Per step, the state the step reads and the one it writes, and the copies into Y.
        # One direction alone steps in Y itself: step k reads the state step k-1 wrote.
        times = [[seq - 1 - k if cfg.reverse[d] else k for d in range(dirs)[g]] for k in range(seq)]
        if g.stop - g.start == 1:
            into = [y[t[0], g] for t in times]
            states = [(into[k - 1] if k else h[g], into[k], []) for k in range(seq)]
        else:
            copies = [
                [(y[t, d], h[d]) for t, d in zip(ts, range(dirs)[g], strict=True)] for ts in times
            ]
            states = [(h[g], h[g], c) for c in copies]
        loops.append(
            _gru_steps(
                (a[g], tmp[g]),
                rt[g],
                None if rb_h is None else rb_h[g].reshape(-1, 1, hidden),
                xw[:, g],
                states,
                cfg.linear_before_reset,
            )
        )
    # Y_h: the last state of each direction.
    last = [(y_h[d], y[0 if cfg.reverse[d] else seq - 1, d]) for d in range(dirs)]
    copyto = np.copyto

    def compute() -> None:
        for d, project in enumerate(projections):
            copyto(xw[:, d], project())
        if h0 is None:
            h.fill(0)
        else:
            copyto(h, h0)
        for loop in loops:
            loop()
        for target, source in last:
            copyto(target, source)

    return compute


def gate_major(batch: int, hidden: int, gate_columns: int) -> bool:
    """Whether a step lays its gates out as contiguous blocks (one product per gate,
    through R^T's column views): while its product is small (the weights in L2, under
    ROW_PRODUCT_MIN multiply-adds) the gate operations' calls are most of a step; and
    where the whole product is past OpenBLAS's unpacked limit (conv_common.UNPACKED_GEMM)
    and one gate's is not, the per-gate products skip packing R^T on every step (8 rows
    by 224 x 896, two directions: 69 us against 114 us). Otherwise, and for 2-3 rows that
    run row by row, the stacked product over whole rows of R^T is as fast or a few percent
    faster (one row by 256 x 1024: 36 us against 42 us)."""
    whole = batch * hidden * gate_columns
    if whole < ROW_PRODUCT_MIN:
        return True
    per_gate = batch * hidden * hidden
    return (
        batch > 1
        and not row_products(batch, hidden, gate_columns)
        and per_gate < UNPACKED_GEMM <= whole
    )


def _bind_gru_gate_major(
    cfg: Config,
    x: np.ndarray,
    h0: np.ndarray | None,
    packed: Packed,
    y: np.ndarray,
    y_h: np.ndarray,
) -> Compute:
    """The GRU steps with every gate in its own contiguous block: the step's product
    writes (gates, dirs, batch, H) through R^T's per-gate column views (no copy of the
    weights), and the projections are laid out the same way once per call, so no gate
    operation reads a strided slice (several times the cost of a contiguous one on a
    step's small arrays). Groups of directions as in _bind_gru."""
    seq, batch, size = x.shape
    hidden, dirs, dtype = cfg.hidden, cfg.dirs, x.dtype
    wt, rt, bias, rb_h = packed
    if rb_h is not None and not cfg.linear_before_reset:
        # q = x_h + (r * h) @ R_h + rb_h: the recurrent bias adds with the input side's.
        bias = bias.copy()
        bias[:, 2 * hidden :] += rb_h
        rb_h = None
    projections = _projections(cfg, x.reshape(seq * batch, size), seq, (wt, rt, bias, None), None)
    r4 = rt.reshape(dirs, hidden, 3, hidden).transpose(2, 0, 1, 3)  # (gates, dirs, H, H)
    fills: list[tuple[np.ndarray, int]] = []
    loops: list[tuple[tuple[np.ndarray, np.ndarray | None], Compute]] = []
    for g in direction_groups(dirs, rt[0].nbytes, cpu_cache.l2_bytes()):
        ds = range(dirs)[g]
        # Written before they are read on every call: temporaries from the plan's arena.
        xw = temporary((seq, 3, len(ds), batch, hidden), dtype)
        h = temporary((len(ds), batch, hidden), dtype)
        fills.extend((xw[:, :, j], d) for j, d in enumerate(ds))
        times = [[seq - 1 - k if cfg.reverse[d] else k for d in ds] for k in range(seq)]
        states: list[GruState]
        if len(ds) == 1:  # one direction steps in Y itself, as in _bind_gru
            into = [y[t[0], g] for t in times]
            states = [(into[k - 1] if k else h, into[k], []) for k in range(seq)]
        else:
            pairs = [enumerate(zip(ts, ds, strict=True)) for ts in times]
            copies = [[(y[t, d], h[j]) for j, (t, d) in p] for p in pairs]
            states = [(h, h, c) for c in copies]
        start = (h, None if h0 is None else h0[g])
        scratch = (temporary((3, len(ds), batch, hidden), dtype), temporary(h.shape, dtype))
        rb = None if rb_h is None else rb_h[g].reshape(-1, 1, hidden)
        loops.append((start, _gru_gate_steps(scratch, r4[:, g], rb, xw, states, cfg)))
    last = [(y_h[d], y[0 if cfg.reverse[d] else seq - 1, d]) for d in range(dirs)]
    copyto = np.copyto
    by_gate = [(target, projections[d], (seq, batch, 3, hidden)) for target, d in fills]

    def compute() -> None:
        for target, project, shape in by_gate:
            copyto(target, project().reshape(shape).transpose(0, 2, 1, 3))
        for (h, h_init), loop in loops:
            if h_init is None:
                h.fill(0)
            else:
                copyto(h, h_init)
            loop()
        for target, source in last:
            copyto(target, source)

    return compute


def _gru_gate_steps(
    scratch: tuple[np.ndarray, np.ndarray],
    r4: np.ndarray,
    rb_h: np.ndarray | None,
    xw: np.ndarray,
    states: list[GruState],
    cfg: Config,
) -> Compute:
    """Every GRU step of one direction group: `scratch` holds the gates (3, dirs, batch,
    H) and a state-sized buffer, `r4` R^T's per-gate views (3, dirs, H, H), `xw` the
    projections (seq, 3, dirs, batch, H) in step order; `states` as for _gru_steps."""
    a, tmp = scratch
    z, r, q, zr = a[0], a[1], a[2], a[:2]
    r_zr, r_h = r4[:2], r4[2]
    add, multiply, tanh = np.add, np.multiply, np.tanh
    subtract, copyto, matmul = np.subtract, np.copyto, np.matmul
    one, half = np.array(1, a.dtype), np.array(0.5, a.dtype)
    steps = [(xw_k[:2], xw_k[2], *s) for xw_k, s in zip(xw, states, strict=True)]
    before_reset = cfg.linear_before_reset

    def compute() -> None:
        for x_zr, x_h, h, h_new, copies in steps:
            if before_reset:
                matmul(h, r4, out=a)
            else:
                matmul(h, r_zr, out=zr)
            add(zr, x_zr, out=zr)
            tanh(zr, out=zr)
            add(zr, one, out=zr)
            multiply(zr, half, out=zr)  # z and r: the sigmoid gates
            if before_reset:
                if rb_h is not None:
                    add(q, rb_h, out=q)
                multiply(q, r, out=q)
            else:
                multiply(r, h, out=tmp)
                matmul(tmp, r_h, out=q)
            add(q, x_h, out=q)
            tanh(q, out=q)  # the candidate
            subtract(h, q, out=tmp)
            multiply(tmp, z, out=tmp)
            add(tmp, q, out=h_new)  # (1 - z) * cand + z * h
            for target, source in copies:
                copyto(target, source)

    return compute


def _gru_steps(
    scratch: tuple[np.ndarray, np.ndarray],
    rt: np.ndarray,
    rb_h: np.ndarray | None,
    xw: np.ndarray,
    states: list[GruState],
    linear_before_reset: bool,
) -> Compute:
    """Every GRU step of the directions `rt` (their stacked R^T, (dirs, H, 3H)) holds, with
    their input projections `xw` in step order; `states` lists per step the state it
    reads, the one it writes and the (Y slice, state) copies after it."""
    a, tmp = scratch
    hidden = tmp.shape[-1]
    add, multiply, tanh = np.add, np.multiply, np.tanh
    subtract, copyto = np.subtract, np.copyto
    one, half = np.array(1, a.dtype), np.array(0.5, a.dtype)
    gates = a[..., : 2 * hidden]  # the sigmoid gates' columns
    z, r, q = a[..., :hidden], a[..., hidden : 2 * hidden], a[..., 2 * hidden :]
    rt_zr, rt_h = rt[..., : 2 * hidden], rt[..., 2 * hidden :]
    # Per step: the product with the state it reads (all gates, or z and r), and the
    # candidate's product with r * h.
    candidate = bind_product(tmp, rt_h, q)  # not called with linear_before_reset
    steps = [
        (
            xw_k[..., : 2 * hidden],
            xw_k[..., 2 * hidden :],
            bind_product(s[0], rt, a) if linear_before_reset else bind_product(s[0], rt_zr, gates),
            *s,
        )
        for xw_k, s in zip(xw, states, strict=True)
    ]

    def compute() -> None:
        for x_zr, x_h, product, h, h_new, copies in steps:
            product()
            add(gates, x_zr, out=gates)
            tanh(gates, out=gates)
            add(gates, one, out=gates)
            multiply(gates, half, out=gates)
            if linear_before_reset:
                if rb_h is not None:
                    add(q, rb_h, out=q)
                multiply(r, q, out=q)
            else:
                multiply(r, h, out=tmp)
                candidate()
                if rb_h is not None:
                    add(q, rb_h, out=q)
            add(q, x_h, out=q)
            tanh(q, out=q)  # the candidate
            subtract(h, q, out=tmp)
            multiply(tmp, z, out=tmp)
            add(tmp, q, out=h_new)  # (1 - z) * cand + z * h
            for target, source in copies:
                copyto(target, source)

    return compute


def bind_product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
    """The step out = x @ w for stacked (dirs, rows, k) states and (dirs, k, n) weights:
    one np.matmul, or for 2 or 3 rows over large weights (conv_common.row_products) one
    product per direction and row (np.dot, or np.matmul for a column slice of the weights,
    which np.dot would first copy)."""
    rows = x.shape[-2]
    matmul = np.matmul
    if x.ndim != 3 or not row_products(rows, *w.shape[-2:]):

        def stacked() -> None:
            matmul(x, w, out=out)

        return stacked
    calls = [
        (np.dot if w[d].flags.c_contiguous else matmul, x[d, i], w[d], out[d, i])
        for d in range(x.shape[0])
        for i in range(rows)
    ]

    def compute() -> None:
        for product, v, m, o in calls:
            product(v, m, out=o)

    return compute


def _projections(
    cfg: Config,
    x2: np.ndarray,
    seq: int,
    packed: Packed,
    int8_w: tuple[np.ndarray, Quantization] | None,
) -> list[Callable[[], np.ndarray]]:
    """Per direction, the step computing X @ W^T + bias (X as `x2`, (seq*batch, in)) and
    returning it in step order, (seq, batch, gates*H); with `int8_w` from the integers of
    W as stored."""
    rows, dtype = x2.shape[0], x2.dtype
    gh, dirs, batch = cfg.gates * cfg.hidden, cfg.dirs, x2.shape[0] // seq
    wt, _, bias, _ = packed
    # Written before they are read on every call: temporaries from the plan's arena.
    if int8_w is None:
        wt = cast(np.ndarray, wt)  # packed when not read as stored
        proj = temporary((rows, gh), dtype)
        proj3 = proj.reshape(seq, batch, gh)
        return [
            _float_projection(x2, wt[d], bias[d], proj, proj3[::-1] if reverse else proj3)
            for d, reverse in enumerate(cfg.reverse)
        ]
    w8, quant = int8_w
    scale, zp = _gate_params(quant, dirs, gh)
    column_scale = np.ones(gh, dtype)
    column_scale[: 3 * cfg.hidden] = 0.5  # the sigmoid gates, halved as in _pack
    prod_t = temporary((gh, rows), dtype)  # (gates*H, seq*batch)
    steps3 = prod_t.T.reshape(seq, batch, gh)
    return [
        _int8_projection(
            x2,
            w8[d],
            None if not np.any(zp[d]) else zp[d].reshape(gh, 1).copy(),
            (scale[d] * column_scale).reshape(gh, 1),
            bias[d].reshape(gh, 1),
            prod_t,
            steps3[::-1] if reverse else steps3,
        )
        for d, reverse in enumerate(cfg.reverse)
    ]


def direction_groups(dirs: int, weight_bytes: int, cache_bytes: int) -> list[slice]:
    """The directions each step loop advances together: all of them (one batched product
    and one call per gate operation for all), or one at a time when one direction's R^T
    fits in the core's cache and all of them do not, so each stays cached over its steps
    instead of every step streaming them all from the next level."""
    fits_one = weight_bytes <= cache_bytes * 3 // 4
    if dirs > 1 and fits_one and dirs * weight_bytes > cache_bytes * 3 // 4:
        return [slice(d, d + 1) for d in range(dirs)]
    return [slice(0, dirs)]


Fill = tuple[np.ndarray, Callable[[], np.ndarray], tuple[int, ...] | None]
"""Where a direction's projection goes, the step computing it (seq, batch, gates*H), and
None to copy it as it is or the (seq, batch, gates, H) shape whose gate-major transpose
(seq, gates, batch, H) is copied."""


def _bind_lstm(
    cfg: Config,
    x: np.ndarray,
    h0: np.ndarray | None,
    c0: np.ndarray | None,
    packed: Packed,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    int8_w: tuple[np.ndarray, Quantization] | None,
) -> Compute:
    """The LSTM steps: the directions of each of `direction_groups` advanced together
    (see the module docstring). With `int8_w` (W as stored and its parameters), each
    direction's projection is the transposed product of the integers, scaled per gate
    column afterwards. With `cfg.quantize_activations`, X and each state are rounded to
    uint8 first (kernels/recurrent_quant.py)."""
    y, y_h, y_c = outputs
    seq, batch, size = x.shape
    hidden, gh, dirs, dtype = cfg.hidden, cfg.gates * cfg.hidden, cfg.dirs, x.dtype
    # One row steps in recurrent_row's loop, whose gates are gate-major blocks already.
    if batch > 1 and gate_major(batch, hidden, gh):
        return _bind_lstm_gate_major(cfg, x, (h0, c0), packed, outputs, int8_w)
    rt = packed[1]
    x2 = x.reshape(seq * batch, size)
    quantize_x = None
    if cfg.quantize_activations:
        xq = temporary(x2.shape, dtype)
        quantize_x = recurrent_quant.bind_fake_quantize(x2, xq)
        x2 = xq
    projections = _projections(cfg, x2, seq, packed, int8_w)
    groups = direction_groups(dirs, rt[0].nbytes, cpu_cache.l2_bytes())
    if batch == 1:  # one sequence: recurrent_row's loop, fewer calls per step
        row_loops, row_fills = _row_loops(cfg, rt, (h0, c0), outputs, groups, projections)
        return _projected(quantize_x, row_fills, row_loops)
    xw = temporary((seq, dirs, batch, gh), dtype)  # in step order, per direction
    h = temporary((dirs, batch, hidden), dtype)
    h_in = temporary(h.shape, dtype) if cfg.quantize_activations else h
    a = temporary((dirs, batch, gh), dtype)
    c = temporary((dirs, batch, hidden), dtype)
    tmp = temporary((dirs, batch, hidden), dtype)
    loops = [
        _lstm_steps(
            (h[g], h_in[g], c[g], a[g], tmp[g]),
            rt[g],
            xw[:, g],
            # Per step, where each direction's new state goes in Y.
            [
                [(y[seq - 1 - k if cfg.reverse[d] else k, d], h[d]) for d in range(dirs)[g]]
                for k in range(seq)
            ],
            cfg.quantize_activations,
        )
        for g in groups
    ]
    fills: list[Fill] = [(xw[:, d], project, None) for d, project in enumerate(projections)]
    steps = _lstm_run([(h, h0), (c, c0)], loops, [(y_h, h), (y_c, c)])
    return _projected(quantize_x, fills, [steps])


def _lstm_run(
    starts: list[tuple[np.ndarray, np.ndarray | None]],
    loops: list[Compute],
    finals: list[tuple[np.ndarray, np.ndarray]],
) -> Compute:
    """The step setting the states to their initial values, running `loops` and copying
    the last states out (each (target, source) of `finals`)."""
    set_states, copyto = recurrent_row.set_states, np.copyto

    def compute() -> None:
        set_states(starts)
        for loop in loops:
            loop()
        for target, source in finals:
            copyto(target, source)

    return compute


def _row_loops(
    cfg: Config,
    rt: np.ndarray,
    initial: tuple[np.ndarray | None, np.ndarray | None],
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    groups: list[slice],
    projections: list[Callable[[], np.ndarray]],
) -> tuple[list[Compute], list[Fill]]:
    """recurrent_row's loop for each group of directions of a one-row LSTM, and where
    the projections go: gate-major (seq, 4, dirs, 1, H), as its gates are laid out."""
    y, y_h, y_c = outputs
    seq, hidden = y.shape[0], cfg.hidden
    # Written before they are read on every call: temporaries from the plan's arena.
    xw = temporary((seq, 4, cfg.dirs, 1, hidden), rt.dtype)
    h0, c0 = initial
    loops = [
        recurrent_row.bind_lstm_row(
            rt[g],
            xw[:, :, g],
            y[:, g],
            (None if h0 is None else h0[g], None if c0 is None else c0[g]),
            (y_h[g], y_c[g]),
            cfg.reverse[g],
            cfg.quantize_activations,
        )
        for g in groups
    ]
    row = (seq, 1, 4, hidden)
    return loops, [(xw[:, :, d], project, row) for d, project in enumerate(projections)]


def _projected(quantize_x: Compute | None, fills: list[Fill], loops: list[Compute]) -> Compute:
    """The step rounding X (when `quantize_x`), writing each direction's projection as
    `fills` say and then running `loops`."""
    copyto = np.copyto

    def compute() -> None:
        if quantize_x is not None:
            quantize_x()
        for target, project, shape in fills:
            value = project()
            copyto(target, value if shape is None else value.reshape(shape).transpose(0, 2, 1, 3))
        for loop in loops:
            loop()

    return compute


def _bind_lstm_gate_major(
    cfg: Config,
    x: np.ndarray,
    initial: tuple[np.ndarray | None, np.ndarray | None],
    packed: Packed,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    int8_w: tuple[np.ndarray, Quantization] | None,
) -> Compute:
    """_bind_lstm with every gate a contiguous (dirs, batch, H) block, as
    _bind_gru_gate_major lays out a GRU's."""
    y, y_h, y_c = outputs
    seq, batch, size = x.shape
    hidden, dirs, dtype = cfg.hidden, cfg.dirs, x.dtype
    rt = packed[1]
    x2 = x.reshape(seq * batch, size)
    quantize_x = None
    h = temporary((dirs, batch, hidden), dtype)
    c = temporary((dirs, batch, hidden), dtype)
    tmp = temporary((dirs, batch, hidden), dtype)
    h_in = h  # what each step multiplies with R^T
    if cfg.quantize_activations:
        xq = temporary(x2.shape, dtype)
        quantize_x = recurrent_quant.bind_fake_quantize(x2, xq)
        x2 = xq
        h_in = temporary(h.shape, dtype)
    projections = _projections(cfg, x2, seq, packed, int8_w)
    r4 = rt.reshape(dirs, hidden, 4, hidden).transpose(2, 0, 1, 3)  # (gates, dirs, H, H)
    fills: list[tuple[np.ndarray, int]] = []
    loops = []
    for g in direction_groups(dirs, rt[0].nbytes, cpu_cache.l2_bytes()):
        ds = range(dirs)[g]
        # Written before they are read on every call: temporaries from the plan's arena.
        xw = temporary((seq, 4, len(ds), batch, hidden), dtype)
        fills.extend((xw[:, :, j], d) for j, d in enumerate(ds))
        writes = [
            [(y[seq - 1 - k if cfg.reverse[d] else k, d], h[d]) for d in ds] for k in range(seq)
        ]
        state = (h[g], h_in[g], c[g], temporary((4, len(ds), batch, hidden), dtype), tmp[g])
        loops.append(_lstm_gate_steps(state, r4[:, g], xw, writes, cfg.quantize_activations))
    by_gate: list[Fill] = [(target, projections[d], (seq, batch, 4, hidden)) for target, d in fills]
    steps = _lstm_run([(h, initial[0]), (c, initial[1])], loops, [(y_h, h), (y_c, c)])
    return _projected(quantize_x, by_gate, [steps])


def _lstm_gate_steps(
    state: tuple[np.ndarray, ...],
    r4: np.ndarray,
    xw: np.ndarray,
    writes: list[list[tuple[np.ndarray, np.ndarray]]],
    quantize: bool,
) -> Compute:
    """_lstm_steps over gate-major blocks: `state` as there with the gates (4, dirs,
    batch, H), `r4` R^T's per-gate views (4, dirs, H, H), `xw` the projections (seq, 4,
    dirs, batch, H) in step order."""
    h, h_in, c, a, tmp = state
    quantize_h = recurrent_quant.bind_fake_quantize(h, h_in, h.shape[0]) if quantize else None
    add, multiply, tanh, copyto, matmul = np.add, np.multiply, np.tanh, np.copyto, np.matmul
    one, half = np.array(1, h.dtype), np.array(0.5, h.dtype)
    gates, i, o, f, g = a[:3], a[0], a[1], a[2], a[3]  # the sigmoid gates, then each
    steps = list(zip(xw, writes, strict=True))

    def compute() -> None:
        for xw_k, writes_k in steps:
            if quantize_h is not None:
                quantize_h()
            matmul(h_in, r4, out=a)
            add(a, xw_k, out=a)
            tanh(a, out=a)
            add(gates, one, out=gates)
            multiply(gates, half, out=gates)
            multiply(c, f, out=c)
            multiply(i, g, out=tmp)
            add(c, tmp, out=c)
            tanh(c, out=tmp)
            multiply(o, tmp, out=h)
            for target, source in writes_k:
                copyto(target, source)

    return compute


def _lstm_steps(
    state: tuple[np.ndarray, ...],
    rt: np.ndarray,
    xw: np.ndarray,
    writes: list[list[tuple[np.ndarray, np.ndarray]]],
    quantize: bool,
) -> Compute:
    """Every step of the directions whose views `state` holds (h, the state the product
    reads, c, the gate pre-activations and a scratch, each (dirs, batch, ...)), with
    their R^T `rt` and input projections `xw` in step order; `writes` lists per step the
    (Y slice, state) copies. With `quantize`, the state is rounded to uint8 into h_in
    before each product, with parameters per direction."""
    h, h_in, c, a, tmp = state
    hidden, dtype = h.shape[-1], h.dtype
    quantize_h = recurrent_quant.bind_fake_quantize(h, h_in, h.shape[0]) if quantize else None
    add, multiply, tanh, copyto = np.add, np.multiply, np.tanh, np.copyto
    one, half = np.array(1, dtype), np.array(0.5, dtype)
    gates = a[..., : 3 * hidden]  # the sigmoid gates' columns
    i, o = a[..., :hidden], a[..., hidden : 2 * hidden]
    f, g = a[..., 2 * hidden : 3 * hidden], a[..., 3 * hidden :]
    steps = list(zip(xw, writes, strict=True))
    product = bind_product(h_in, rt, a)

    def compute() -> None:
        for xw_k, writes_k in steps:
            if quantize_h is not None:
                quantize_h()
            product()
            add(a, xw_k, out=a)
            tanh(a, out=a)
            add(gates, one, out=gates)
            multiply(gates, half, out=gates)
            multiply(c, f, out=c)
            multiply(i, g, out=tmp)
            add(c, tmp, out=c)
            tanh(c, out=tmp)
            multiply(o, tmp, out=h)
            for target, source in writes_k:
                copyto(target, source)

    return compute


def _float_projection(
    x2: np.ndarray, wt: np.ndarray, bias: np.ndarray, proj: np.ndarray, ordered: np.ndarray
) -> Callable[[], np.ndarray]:
    """One direction's X @ W^T + bias into `proj`; returns `ordered`, its step-order view."""
    matmul, add = np.matmul, np.add

    def project() -> np.ndarray:
        matmul(x2, wt, out=proj)
        add(proj, bias, out=proj)
        return ordered

    return project


def _int8_projection(
    x2: np.ndarray,
    w8: np.ndarray,
    zp: np.ndarray | None,
    scale: np.ndarray,
    bias: np.ndarray,
    prod_t: np.ndarray,
    ordered: np.ndarray,
) -> Callable[[], np.ndarray]:
    """One direction's (W - zp) * scale @ X^T + bias into `prod_t` (gates*H, seq*batch)
    from the integers of W; returns `ordered`, the step-order (seq, batch, gates*H) view."""
    product = int8_weights.bind_product_t(x2, w8, zp, scale, prod_t)
    add = np.add

    def project() -> np.ndarray:
        product()
        add(prod_t, bias, out=prod_t)
        return ordered

    return project
