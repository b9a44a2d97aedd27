"""LSTM, GRU and RNN over a whole sequence, with ONNX's semantics.

Inputs as ONNX lists them: X, W, R, B, sequence_lens, initial_h (, initial_c, P for LSTM);
outputs Y (seq, dirs, batch, hidden), Y_h (dirs, batch, hidden) (, Y_c). `layout` 1 puts
the batch first in X, Y and the states. Gate orders are ONNX's (LSTM i, o, f, c; GRU z, r,
h). The sequence length is the input's, so one model runs any length it is planned for.

Per direction, the input projection of every step is one GEMM; the loop then does one
small GEMM with R per step. Steps at or past a batch entry's sequence_lens leave its state
unchanged and write zeros to Y, as onnxruntime does. `run_sequence` keeps, on request, what
the backward pass (lite/kernels/training/recurrent_grad.py) needs.

The kernels pack constant weights once at bind: the common inference case (see
recurrent_fast.applies) runs recurrent_fast's packed loop; every other one runs
`run_sequence` with R^T packed at bind when R is constant.

W and R may be int8/uint8 constants with their quantization parameters (a dynamically
quantized LSTM): the forward kernels read them as stored (`quantized_weights`
tells the planner not to dequantize them first) and dequantize each one once, straight
into the form they compute with, so no float copy of the file's layout stays beside the
packed one; the file's pages of the integers are then given back (lite/pages.py). An
LSTM with `quantize_activations` (onnxruntime's DynamicQuantizeLSTM) also rounds X and
each state to uint8 before its products (kernels/recurrent_quant.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from sporenet.lite import pages, shared_weights
from sporenet.lite.kernels import recurrent_fast, recurrent_quant
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.quantized.base import is_quantized
from sporenet.lite.kernels.quantized.convert import dequantize_array
from sporenet.lite.ops import OpCode

Array = np.ndarray


def _sigmoid(x: Array, a: float, b: float) -> Array:
    # The logistic function as 0.5 * (1 + tanh(x / 2)): no exp to overflow.
    y = np.multiply(x, 0.5)
    np.tanh(y, out=y)
    y += 1
    y *= 0.5
    return y


@dataclass(frozen=True)
class Activation:
    """One gate activation: f(x, alpha, beta) and its derivative from (x, f(x))."""

    forward: Callable[[Array, float, float], Array]
    derivative: Callable[[Array, Array, float, float], Array]
    alpha: float = 0.0  # ONNX's defaults for activation_alpha / activation_beta
    beta: float = 0.0


ACTIVATIONS: dict[str, Activation] = {
    "Sigmoid": Activation(_sigmoid, lambda x, y, a, b: y * (1 - y)),
    "Tanh": Activation(lambda x, a, b: np.tanh(x), lambda x, y, a, b: 1 - y * y),
    "Relu": Activation(
        lambda x, a, b: np.maximum(x, 0), lambda x, y, a, b: (x > 0).astype(x.dtype)
    ),
    "LeakyRelu": Activation(
        lambda x, a, b: np.where(x >= 0, x, a * x),
        lambda x, y, a, b: np.where(x >= 0, 1, a).astype(x.dtype),
        alpha=0.01,
    ),
    "ThresholdedRelu": Activation(
        lambda x, a, b: np.where(x > a, x, 0).astype(x.dtype),
        lambda x, y, a, b: (x > a).astype(x.dtype),
        alpha=1.0,
    ),
    "HardSigmoid": Activation(
        lambda x, a, b: np.clip(a * x + b, 0, 1),
        lambda x, y, a, b: np.where((y > 0) & (y < 1), a, 0).astype(x.dtype),
        alpha=0.2,
        beta=0.5,
    ),
    "ScaledTanh": Activation(
        lambda x, a, b: a * np.tanh(b * x),
        lambda x, y, a, b: a * b * (1 - np.tanh(b * x) ** 2),
        alpha=1.0,
        beta=1.0,
    ),
    "Elu": Activation(
        lambda x, a, b: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0))),
        lambda x, y, a, b: np.where(x > 0, 1, y + a).astype(x.dtype),
        alpha=1.0,
    ),
    "Softsign": Activation(
        lambda x, a, b: x / (1 + np.abs(x)), lambda x, y, a, b: 1 / (1 + np.abs(x)) ** 2
    ),
    "Softplus": Activation(
        lambda x, a, b: np.logaddexp(0, x), lambda x, y, a, b: _sigmoid(x, a, b)
    ),
    "Affine": Activation(
        lambda x, a, b: a * x + b, lambda x, y, a, b: np.full_like(x, a), alpha=1.0
    ),
}

GATES: dict[str, int] = {"LSTM": 4, "GRU": 3, "RNN": 1}
ACTIVATIONS_PER_DIRECTION: dict[str, int] = {"LSTM": 3, "GRU": 2, "RNN": 1}
DEFAULT_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
    "GRU": ("Sigmoid", "Tanh"),
    "RNN": ("Tanh",),
}
DIRECTIONS: dict[str, tuple[bool, ...]] = {
    "forward": (False,),
    "reverse": (True,),
    "bidirectional": (False, True),
}


@dataclass(frozen=True)
class BoundActivation:
    """An activation with its alpha and beta."""

    fn: Activation
    alpha: float
    beta: float

    def __call__(self, x: Array) -> Array:
        return self.fn.forward(x, self.alpha, self.beta)

    def grad(self, x: Array, y: Array) -> Array:
        return self.fn.derivative(x, y, self.alpha, self.beta)


@dataclass(frozen=True)
class Config:
    """A recurrent node's attributes, checked: kind, sizes, directions, activations."""

    kind: str
    hidden: int
    reverse: tuple[bool, ...]  # one flag per direction
    acts: tuple[tuple[BoundActivation, ...], ...]  # per direction: f (, g (, h))
    clip: float | None
    layout: int
    linear_before_reset: bool
    input_forget: bool
    # LSTM: activations rounded to uint8 before each product, as onnxruntime's
    # DynamicQuantizeLSTM does (kernels/recurrent_quant.py).
    quantize_activations: bool = False

    @property
    def gates(self) -> int:
        return GATES[self.kind]

    @property
    def dirs(self) -> int:
        return len(self.reverse)


def parse_config(kernel: Kernel, kind: str) -> Config:
    """Read and check the attributes a recurrent node carries."""
    attrs = kernel.attrs
    hidden = attrs.int("hidden_size", 0)
    if hidden <= 0:
        raise kernel.fail(f"attribute hidden_size must be a positive int, got {hidden}")
    direction = attrs.str("direction", "forward")
    if direction not in DIRECTIONS:
        raise kernel.fail(f"direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    reverse = DIRECTIONS[direction]
    per_dir = ACTIVATIONS_PER_DIRECTION[kind]
    names_attr = attrs.str("activations", "")
    names = names_attr.split(",") if names_attr else list(DEFAULT_ACTIVATIONS[kind] * len(reverse))
    if len(names) != per_dir * len(reverse):
        raise kernel.fail(
            f"activations must name {per_dir * len(reverse)} functions ({per_dir} per "
            f"direction), got {names}"
        )
    unknown = sorted({n for n in names if n not in ACTIVATIONS})
    if unknown:
        raise kernel.fail(f"unknown activations {unknown}; supported: {sorted(ACTIVATIONS)}")
    alphas = attrs.floats("activation_alpha", None)
    betas = attrs.floats("activation_beta", None)
    for what, values in (("activation_alpha", alphas), ("activation_beta", betas)):
        if values is not None and len(values) != len(names):
            raise kernel.fail(
                f"{what} must hold one value per activation ({len(names)}), got {len(values)}"
            )
    bound = [
        BoundActivation(
            ACTIVATIONS[n],
            ACTIVATIONS[n].alpha if alphas is None else alphas[k],
            ACTIVATIONS[n].beta if betas is None else betas[k],
        )
        for k, n in enumerate(names)
    ]
    clip = attrs.float("clip", None)
    if clip is not None and not clip > 0:
        raise kernel.fail(f"clip must be positive, got {clip}")
    layout = attrs.int("layout", 0)
    if layout not in (0, 1):
        raise kernel.fail(f"layout must be 0 or 1, got {layout}")
    quantize = attrs.int("quantize_activations", 0)
    if quantize not in (0, 1) or (quantize and kind != "LSTM"):
        raise kernel.fail(f"quantize_activations must be 0 (or 1 for an LSTM), got {quantize}")
    return Config(
        kind=kind,
        hidden=hidden,
        reverse=reverse,
        acts=tuple(tuple(bound[d * per_dir : (d + 1) * per_dir]) for d in range(len(reverse))),
        clip=clip,
        layout=layout,
        linear_before_reset=bool(attrs.int("linear_before_reset", 0)),
        input_forget=bool(attrs.int("input_forget", 0)),
        quantize_activations=bool(quantize),
    )


# Input positions (ONNX's order) and how many inputs each kind takes.
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = range(8)
NUM_INPUTS: dict[str, int] = {"LSTM": 8, "GRU": 6, "RNN": 6}


def check_inputs(kernel: Kernel, cfg: Config, *, quantized: bool = False) -> tuple[int, int, int]:
    """Check the inputs' shapes and dtypes; returns (seq, batch, input_size). With
    `quantized`, W and R may also be int8/uint8 constants with quantization parameters."""
    x = kernel.require_float(X)
    if x.rank != 3:
        raise kernel.fail(f"X must be 3-D, got shape {list(x.shape)}")
    seq, batch, size = (x.shape[1], x.shape[0], x.shape[2]) if cfg.layout else x.shape
    gh, dirs, hidden = cfg.gates * cfg.hidden, cfg.dirs, cfg.hidden
    expected = {
        W: ("W", (dirs, gh, size)),
        R: ("R", (dirs, gh, hidden)),
        B: ("B", (dirs, 2 * gh)),
        INITIAL_H: ("initial_h", (batch, dirs, hidden) if cfg.layout else (dirs, batch, hidden)),
        INITIAL_C: ("initial_c", (batch, dirs, hidden) if cfg.layout else (dirs, batch, hidden)),
        PEEPHOLES: ("P", (dirs, 3 * hidden)),
    }
    for k, (name, shape) in expected.items():
        spec = kernel.optional_input(k) if k < NUM_INPUTS[cfg.kind] else None
        if spec is None:
            if k in (W, R):
                raise kernel.fail(f"input {k} ({name}) is required")
            continue
        if spec.shape != shape:
            raise kernel.fail(f"{name} must have shape {list(shape)}, got {list(spec.shape)}")
        if quantized and k in (W, R) and is_quantized(spec):
            if spec.value is None:
                raise kernel.fail(f"a quantized {name} must be a constant")
            continue
        if spec.dtype != x.dtype:
            raise kernel.fail(f"{name} has dtype {spec.dtype}, X has {x.dtype}")
    lens = kernel.optional_input(SEQUENCE_LENS)
    if lens is not None:
        if lens.dtype.kind not in "iu" or lens.shape != (batch,):
            raise kernel.fail(
                f"sequence_lens must be an int tensor of shape [{batch}], got "
                f"{lens.dtype}{list(lens.shape)}"
            )
        if lens.value is not None and (np.any(lens.value < 0) or np.any(lens.value > seq)):
            raise kernel.fail(f"sequence_lens {lens.value.tolist()} must lie in 0..{seq}")
    return seq, batch, size


def output_shapes(cfg: Config, seq: int, batch: int) -> list[tuple[int, ...]]:
    """Y, Y_h (and Y_c) in the node's layout."""
    dirs, hidden = cfg.dirs, cfg.hidden
    y = (batch, seq, dirs, hidden) if cfg.layout else (seq, dirs, batch, hidden)
    state = (batch, dirs, hidden) if cfg.layout else (dirs, batch, hidden)
    return [y, state, state] if cfg.kind == "LSTM" else [y, state]


@dataclass
class Inputs:
    """A call's arrays in the time-major layout: X (seq, batch, in), states (dirs, batch, H)."""

    x: Array
    w: Array
    r: Array
    b: Array | None
    lens: Array | None
    h0: Array | None
    c0: Array | None
    p: Array | None

    @classmethod
    def from_node(cls, cfg: Config, arrays: Sequence[Array | None]) -> Inputs:
        arrays = list(arrays) + [None] * (8 - len(arrays))
        x, h0, c0 = arrays[X], arrays[INITIAL_H], arrays[INITIAL_C]
        if cfg.layout:
            x = x.transpose(1, 0, 2)
            h0 = None if h0 is None else h0.transpose(1, 0, 2)
            c0 = None if c0 is None else c0.transpose(1, 0, 2)
        return cls(
            x, arrays[W], arrays[R], arrays[B], arrays[SEQUENCE_LENS], h0, c0, arrays[PEEPHOLES]
        )


@dataclass
class Step:
    """What the backward pass needs from one step of one direction."""

    h: Array  # state entering the step
    c: Array | None
    pre: Array  # gate pre-activations, clipped (batch, gates * hidden)
    post: Array  # gate activations (LSTM: i, o, f, g; GRU: z, r, h~; RNN: h)
    mask: Array | None  # (batch, 1): which entries this step advances
    extra: Array | None = None  # LSTM: h(c_new) and c_new; GRU: the reset-side product q


@dataclass
class Trace:
    """One direction's steps in the order they ran, and the clipping masks."""

    time: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)


def _clip(cfg: Config, a: Array) -> Array:
    if cfg.clip is not None:
        np.clip(a, -cfg.clip, cfg.clip, out=a)
    return a


def new_outputs(cfg: Config, x: Array) -> tuple[Array, Array, Array | None]:
    """Uninitialised Y (seq, dirs, batch, H), Y_h (and Y_c) (dirs, batch, H) for X."""
    seq, batch, _ = x.shape
    state = (cfg.dirs, batch, cfg.hidden)
    y_c = np.empty(state, x.dtype) if cfg.kind == "LSTM" else None
    return np.empty((seq, *state), x.dtype), np.empty(state, x.dtype), y_c


def run_sequence(
    cfg: Config,
    inp: Inputs,
    *,
    trace: bool = False,
    out: tuple[Array, Array, Array | None] | None = None,
    packed_r: Sequence[Array] | None = None,
) -> tuple[Array, Array, Array | None, list[Trace]]:
    """Y (seq, dirs, batch, H), Y_h, Y_c (dirs, batch, H) in the time-major layout, and
    per direction the trace the backward pass needs (empty unless `trace`). `out` gives
    the arrays (or time-major views) to write Y, Y_h and Y_c into; every element is set.
    `packed_r` gives R[d].T per direction, contiguous, when the kernel packed it once."""
    x = inp.x
    seq, batch, size = x.shape
    hidden, gh, dtype = cfg.hidden, cfg.gates * cfg.hidden, x.dtype
    y, y_h, y_c = new_outputs(cfg, x) if out is None else out
    masks = None
    if inp.lens is not None and np.any(inp.lens < seq):
        masks = (np.arange(seq)[:, None] < inp.lens[None, :])[:, :, None]  # (seq, batch, 1)
    traces = []
    x2 = x.reshape(seq * batch, size)
    if cfg.quantize_activations:  # one rounding of X serves every direction
        x2 = recurrent_quant.fake_quantize(x2)
    for d, reverse in enumerate(cfg.reverse):
        f, g, hact = (*cfg.acts[d], None, None)[:3]
        xw, rb = _input_projection(cfg, x2, inp, d)
        xw = xw.reshape(seq, batch, gh)
        # (H, gates * H)
        rt = packed_r[d] if packed_r is not None else np.ascontiguousarray(inp.r[d].T)
        h = np.zeros((batch, hidden), dtype) if inp.h0 is None else inp.h0[d].copy()
        c = None
        if cfg.kind == "LSTM":
            c = np.zeros((batch, hidden), dtype) if inp.c0 is None else inp.c0[d].copy()
        tr = Trace()
        for t in range(seq - 1, -1, -1) if reverse else range(seq):
            mask = None if masks is None else masks[t]
            if cfg.kind == "LSTM":
                h_new, c_new, step = _lstm_step(cfg, d, xw[t], h, c, rt, inp.p, f, g, hact, trace)
            elif cfg.kind == "GRU":
                h_new, c_new, step = _gru_step(cfg, xw[t], h, rt, rb, f, g, trace)
            else:
                pre = _clip(cfg, xw[t] + h @ rt)
                h_new, c_new = f(pre), None
                step = Step(h, None, pre, h_new, None)
            if mask is None:
                y[t, d] = h_new
            else:
                np.multiply(h_new, mask, out=y[t, d])
                h_new = np.where(mask, h_new, h)
                if c_new is not None:
                    c_new = np.where(mask, c_new, c)
            if trace and step is not None:
                step.mask = mask
                tr.time.append(t)
                tr.steps.append(step)
            h, c = h_new, c_new
        y_h[d] = h
        if y_c is not None:
            y_c[d] = c
        if masks is not None:  # an empty sequence has zero final states, as in onnxruntime
            y_h[d] *= masks.any(axis=0)
            if y_c is not None:
                y_c[d] *= masks.any(axis=0)
        traces.append(tr)
    return y, y_h, y_c, traces


def _input_projection(cfg: Config, x2: Array, inp: Inputs, d: int) -> tuple[Array, Array | None]:
    """Direction d's input projection of every step at once (seq*batch, gates*H), with
    both biases where they simply add; and the recurrent bias still to add (GRU)."""
    gh, hidden = cfg.gates * cfg.hidden, cfg.hidden
    xw = x2 @ inp.w[d].T
    if inp.b is None:
        return xw, None
    wb, rb = inp.b[d, :gh], inp.b[d, gh:]
    if cfg.kind != "GRU":
        xw += wb + rb
        return xw, None
    xw += wb
    xw[:, : 2 * hidden] += rb[: 2 * hidden]
    return xw, rb[2 * hidden :]


def _lstm_step(
    cfg: Config,
    d: int,
    xw: Array,
    h: Array,
    c: Array,
    rt: Array,
    p: Array | None,
    f: BoundActivation,
    g: BoundActivation,
    hact: BoundActivation,
    trace: bool,
) -> tuple[Array, Array, Step | None]:
    hidden = cfg.hidden
    a = (recurrent_quant.fake_quantize(h) if cfg.quantize_activations else h) @ rt  # i, o, f, c
    a += xw
    if p is None:  # the common case: the three sigmoid gates in one call
        _clip(cfg, a)
        gates = f(a[:, : 3 * hidden])
        i, o = gates[:, :hidden], gates[:, hidden : 2 * hidden]
        forget = 1 - i if cfg.input_forget else gates[:, 2 * hidden :]
        cand = g(a[:, 3 * hidden :])
        c_new = forget * c
        c_new += i * cand
        hc = hact(c_new)
        if not trace:
            return o * hc, c_new, None
        post = np.concatenate([i, o, forget, cand], axis=1)
        return o * hc, c_new, Step(h, c, a, post, None, np.concatenate([hc, c_new], axis=1))
    ai, ao, af, ac = (a[:, k * hidden : (k + 1) * hidden] for k in range(4))
    if p is not None:
        ai += p[d, :hidden] * c
        af += p[d, 2 * hidden :] * c
    _clip(cfg, ai), _clip(cfg, af), _clip(cfg, ac)
    i = f(ai)
    forget = 1 - i if cfg.input_forget else f(af)
    cand = g(ac)
    c_new = forget * c + i * cand
    if p is not None:
        ao += p[d, hidden : 2 * hidden] * c_new
    _clip(cfg, ao)
    o = f(ao)
    hc = hact(c_new)
    if not trace:
        return o * hc, c_new, None
    post = np.concatenate([i, o, forget, cand], axis=1)
    return o * hc, c_new, Step(h, c, a, post, None, np.concatenate([hc, c_new], axis=1))


def _gru_step(
    cfg: Config,
    xw: Array,
    h: Array,
    rt: Array,
    rb: Array | None,
    f: BoundActivation,
    g: BoundActivation,
    trace: bool,
) -> tuple[Array, None, Step | None]:
    hidden = cfg.hidden
    pre = np.empty_like(xw)
    az, ar, ah = (pre[:, k * hidden : (k + 1) * hidden] for k in range(3))
    if cfg.linear_before_reset:
        hr = h @ rt
        np.add(xw[:, : 2 * hidden], hr[:, : 2 * hidden], out=pre[:, : 2 * hidden])
        q = hr[:, 2 * hidden :]
        if rb is not None:
            q += rb
        _clip(cfg, az), _clip(cfg, ar)
        z, r = f(az), f(ar)
        np.add(xw[:, 2 * hidden :], r * q, out=ah)
    else:
        np.add(xw[:, : 2 * hidden], h @ rt[:, : 2 * hidden], out=pre[:, : 2 * hidden])
        _clip(cfg, az), _clip(cfg, ar)
        z, r = f(az), f(ar)
        q = (r * h) @ rt[:, 2 * hidden :]
        if rb is not None:
            q += rb
        np.add(xw[:, 2 * hidden :], q, out=ah)
    _clip(cfg, ah)
    cand = g(ah)
    h_new = h - cand
    h_new *= z
    h_new += cand  # (1 - z) * cand + z * h
    if not trace:
        return h_new, None, None
    return h_new, None, Step(h, None, pre, np.concatenate([z, r, cand], axis=1), None, q)


def float_weight(spec: TensorSpec | None, array: Array | None) -> Array | None:
    """W or R as the kernel computes with it: an int8/uint8 constant dequantized (a new
    float32 array; the file's pages of the integers are given back), else as given."""
    if array is None or spec is None or not is_quantized(spec):
        return array
    quant = spec.quant
    value = shared_weights.shared(array, ("dequantized",), lambda: dequantize_array(array, quant))
    pages.release(array)
    return value


class _Recurrent(Kernel):
    """The forward kernel shared by LSTM, GRU and RNN."""

    kind: ClassVar[str]
    quantized_weights: ClassVar[frozenset[int]] = frozenset({W, R})

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.cfg = parse_config(self, self.kind)
        seq, batch, _ = check_inputs(self, self.cfg, quantized=True)
        dtype = self.input(X).dtype
        self.output_specs = [TensorSpec(s, dtype) for s in output_shapes(self.cfg, seq, batch)]
        self.fast = recurrent_fast.applies(self.cfg, self.inputs)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        cfg = self.cfg
        y, y_h = outputs[0], outputs[1]
        y_c = None
        if cfg.kind == "LSTM":  # the final cell state is needed even when not an output
            y_c = outputs[2] if len(outputs) > 2 else np.empty_like(y_h)
        if self.fast:
            return recurrent_fast.bind_fast(cfg, inputs, self.inputs, y, y_h, y_c)
        inputs = list(inputs)
        inputs[W] = float_weight(self.inputs[W], inputs[W])
        if cfg.layout:  # write through time-major views of the batch-first outputs
            y, y_h = y.transpose(1, 2, 0, 3), y_h.transpose(1, 0, 2)
            y_c = None if y_c is None else y_c.transpose(1, 0, 2)
        out = (y, y_h, y_c)
        # Constant recurrent weights are packed once here (R^T per direction, dequantized
        # on the way when stored as integers), not on every call.
        r_spec, r, packed = self.inputs[R], inputs[R], None
        if r is not None and r_spec is not None and r_spec.value is not None:
            dtype = y.dtype
            quant = r_spec.quant if is_quantized(r_spec) else None
            ones = np.ones(cfg.gates * cfg.hidden, dtype)
            packed = list(recurrent_fast.pack_transposed(r, quant, ones, dtype))

        def compute() -> None:
            run_sequence(cfg, Inputs.from_node(cfg, inputs), out=out, packed_r=packed)

        return compute


class LSTM(_Recurrent):
    op = OpCode.LSTM
    kind = "LSTM"
    num_inputs = (3, 8)


class GRU(_Recurrent):
    op = OpCode.GRU
    kind = "GRU"
    num_inputs = (3, 6)


class RNN(_Recurrent):
    op = OpCode.RNN
    kind = "RNN"
    num_inputs = (3, 6)
