"""Second derivatives of LSTM, GRU and RNN: the rule of their backward ops (LSTM_GRAD,
GRU_GRAD, RNN_GRAD).

A backward op computes J(theta)^T g, the vjp of the layer at its inputs theta. Its own
gradient is that of the same vjp written with differentiable ops: the layer is rebuilt
as a subgraph (one LOOP per direction over the time steps, whose body is the step of
lite/kernels/recurrent.py in elementwise ops and FULLY_CONNECTED), the automatic vjp of
that subgraph stands for the backward op, and the CALL rule differentiates it. Every op
in these subgraphs has a second-order rule, so the result is differentiable again.
The backward kernels keep computing first derivatives; these subgraphs only appear in
the graph of a second derivative.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.control_flow import _like, call, vjp_graph
from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.graph import Graph, Node
from sporenet.lite.kernels.base import Attrs
from sporenet.lite.kernels.recurrent import (
    ACTIVATIONS,
    INITIAL_C,
    INITIAL_H,
    NUM_INPUTS,
    PEEPHOLES,
    SEQUENCE_LENS,
    B,
    BoundActivation,
    Config,
    R,
    W,
    X,
    parse_config,
)
from sporenet.lite.kernels.training.recurrent_grad import DIFFERENTIABLE
from sporenet.lite.ops import OpCode

O = OpCode  # noqa: E741 - short, as in the declaration modules

_KIND = {O.LSTM_GRAD: "LSTM", O.GRU_GRAD: "GRU", O.RNN_GRAD: "RNN"}
_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}  # Y, Y_h (, Y_c)
_NAMES = {X: "x", W: "w", R: "r", B: "b", SEQUENCE_LENS: "lens", INITIAL_H: "h0"}
_NAMES |= {INITIAL_C: "c0", PEEPHOLES: "p"}


class _Attributes:
    """A backward node's attributes as parse_config reads a kernel's."""

    def __init__(self, node: Node, kind: str) -> None:
        self.attrs = Attrs(kind, dict(node.attrs))
        self._what = f"{node.op.name} {node.name!r}"

    def fail(self, message: str) -> ShapeError:
        return ShapeError(f"{self._what}: {message}")


def backward_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # The backward node is the vjp of the forward rebuilt from differentiable ops: its
    # gradient is the CALL rule's on a CALL of that vjp (the saved steps of an
    # LSTM_TRAINING get none: the rebuilt forward recomputes them from the inputs).
    kind = _KIND[node.op]
    n = NUM_INPUTS[kind]
    forward = list(node.inputs[:n]) + [-1] * max(n - len(node.inputs), 0)
    dys = list(node.inputs[n : n + _OUTPUTS[kind]])
    present = [k for k in range(n) if forward[k] != -1]
    given = [k for k, g in enumerate(dys) if g != -1]
    result: list[int | None] = [None] * len(node.inputs)
    if not given or all(u is None for u in grads):
        return result
    cfg = parse_config(_Attributes(node, kind), kind)  # type: ignore[arg-type]
    if cfg.quantize_activations:
        raise UnsupportedOpError(
            f"{node.op.name} {node.name!r}: no second derivative of an LSTM that rounds its "
            "activations (quantize_activations)"
        )
    scope = ctx.scope
    gf = _forward_graph(ctx, cfg, forward, present, given)
    select = [j for j, k in enumerate(present) if k in DIFFERENTIABLE]
    vjp = vjp_graph(ctx, gf, select, "vjp")
    ctx.scope = scope
    positions = [*present, *(n + k for k in given)]
    stand_in = Node(
        op=O.CALL,
        inputs=[node.inputs[p] for p in positions],
        outputs=list(node.outputs),
        attrs={"graph": vjp},
        name=node.name,
    )
    for p, g in zip(positions, call(ctx, stand_in, grads), strict=True):
        result[p] = g
    return result


class _Emitter:
    """Appends nodes to one graph through a context, in a few words per op."""

    def __init__(self, ctx: GradContext, dtype: np.dtype) -> None:
        self.ctx = ctx
        self.dtype = dtype

    def __call__(self, op: OpCode, *inputs: int, **attrs: object) -> int:
        return self.ctx.op(op, list(inputs), **attrs)

    def constant(self, name: str, value: object, dtype: object) -> int:
        return self.ctx.constant(name, value, dtype)

    def scalar(self, value: float) -> int:
        return self.ctx.constant("scalar", value, self.dtype)

    def cols(self, x: int, start: int, stop: int) -> int:
        """x[..., start:stop]."""
        return self(O.SLICE, x, starts=[start], ends=[stop], axes=[-1])

    def pick(self, x: int, k: int) -> int:
        """x[k] along axis 0."""
        return self(O.GATHER, x, self.constant("index", np.int64(k), np.int64), axis=0)

    def activation(self, act: BoundActivation, x: int) -> int:
        """One of ONNX's recurrent activations, in ops that have second-order rules."""
        name = next(k for k, v in ACTIVATIONS.items() if v is act.fn)
        a, b = act.alpha, act.beta
        if name in _UNARY:
            return self(_UNARY[name], x)
        if name == "LeakyRelu":
            return self(O.LEAKY_RELU, x, alpha=a)
        if name == "HardSigmoid":
            return self(O.HARD_SIGMOID, x, alpha=a, beta=b)
        if name == "Elu":
            return self(O.ELU, x, alpha=a)
        if name == "Affine":
            return self(O.ADD, self(O.MUL, x, self.scalar(a)), self.scalar(b))
        if name == "ScaledTanh":
            return self(O.MUL, self(O.TANH, self(O.MUL, x, self.scalar(b))), self.scalar(a))
        if name == "ThresholdedRelu":
            above = self(O.CAST, self(O.GREATER, x, self.scalar(a)), to=str(self.dtype))
            return self(O.MUL, x, above)
        # Softsign: x / (1 + |x|)
        return self(O.DIV, x, self(O.ADD, self(O.ABS, x), self.scalar(1.0)))


_UNARY = {"Sigmoid": O.SIGMOID, "Tanh": O.TANH, "Relu": O.RELU, "Softplus": O.SOFTPLUS}


def _forward_graph(
    ctx: GradContext, cfg: Config, inputs: list[int], present: list[int], given: list[int]
) -> int:
    """A subgraph computing the layer: inputs those at `present`, outputs Y, Y_h (, Y_c)
    at positions `given`, in the node's layout."""
    x_shape = ctx.shape(inputs[X])
    if len(x_shape) != 3:
        raise UnsupportedOpError(
            f"{cfg.kind}_GRAD: a second derivative needs the input's shape known when the "
            f"model is built (a 3-d input), found shape {x_shape}"
        )
    seq = x_shape[1] if cfg.layout else x_shape[0]
    if seq == -1:
        raise UnsupportedOpError(
            f"{cfg.kind}_GRAD: a second derivative needs a sequence length known when the "
            "model is built"
        )
    scope = ctx.scope
    ctx.scope = f"{scope}/{cfg.kind.lower()}"
    ins = {k: _like(ctx, inputs[k], _NAMES[k]) for k in present}
    graph = Graph(name=ctx.scope, inputs=[ins[k] for k in present], outputs=[], nodes=[])
    gi = ctx.add_graph(graph)
    emit = _Emitter(ctx.child(gi), ctx.dtype(inputs[X]))
    if cfg.layout:  # time-major inside
        for k in (X, INITIAL_H, INITIAL_C):
            if k in ins:
                ins[k] = emit(O.TRANSPOSE, ins[k], perm=[1, 0, 2])
    if SEQUENCE_LENS in ins:
        ins[SEQUENCE_LENS] = emit(O.CAST, ins[SEQUENCE_LENS], to="int64")
    per_dir = [_direction(ctx, emit, gi, cfg, d, ins, seq) for d in range(cfg.dirs)]
    y = emit(O.CONCAT, *(emit(O.UNSQUEEZE, p[0], axes=[1]) for p in per_dir), axis=1)
    outs = [y]
    for k in range(1, len(per_dir[0])):
        outs.append(emit(O.CONCAT, *(emit(O.UNSQUEEZE, p[k], axes=[0]) for p in per_dir), axis=0))
    if cfg.layout:
        outs = [emit(O.TRANSPOSE, outs[0], perm=[2, 0, 1, 3])]
        outs += [emit(O.TRANSPOSE, s, perm=[1, 0, 2]) for s in outs[1:]]
    graph.outputs = [outs[k] for k in given]
    fill_inferred_shapes(ctx.model, gi)
    ctx.scope = scope
    return gi


def _direction(
    ctx: GradContext, emit: _Emitter, gi: int, cfg: Config, d: int, ins: dict[int, int], seq: int
) -> list[int]:
    """Direction d's Y (seq, batch, H) in time order, Y_h (, Y_c) (batch, H)."""
    hidden, gh = cfg.hidden, cfg.gates * cfg.hidden
    xw = emit(O.FULLY_CONNECTED, ins[X], emit.pick(ins[W], d))
    rb_h = None
    if B in ins:
        b = emit.pick(ins[B], d)
        wb, rb = emit.cols(b, 0, gh), emit.cols(b, gh, 2 * gh)
        if cfg.kind == "GRU":  # the candidate's recurrent bias adds after the reset gate
            rb_h = emit.cols(rb, 2 * hidden, 3 * hidden)
            zero = emit(O.MUL, rb_h, emit.scalar(0.0))
            rb = emit(O.CONCAT, emit.cols(rb, 0, 2 * hidden), zero, axis=0)
        xw = emit(O.ADD, xw, emit(O.ADD, wb, rb))
    zeros = emit(O.MUL, emit.cols(emit.pick(xw, 0), 0, hidden), emit.scalar(0.0))
    states = [emit.pick(ins[INITIAL_H], d) if INITIAL_H in ins else zeros]
    if cfg.kind == "LSTM":
        states.append(emit.pick(ins[INITIAL_C], d) if INITIAL_C in ins else zeros)
    implicit = {"xw": xw, "r": emit.pick(ins[R], d)}
    if rb_h is not None:
        implicit["rb_h"] = rb_h
    if PEEPHOLES in ins:
        implicit["p"] = emit.pick(ins[PEEPHOLES], d)
    if SEQUENCE_LENS in ins:
        implicit["lens"] = ins[SEQUENCE_LENS]
    fill_inferred_shapes(ctx.model, gi)  # the body's inputs copy these shapes
    body = _body(ctx, cfg, d, seq, states, implicit)
    trips = emit.constant("trips", np.int64(seq), np.int64)
    loop = ctx.child(gi).op_multi(
        O.LOOP,
        [trips, -1, *states, *implicit.values()],
        len(states) + 1,
        body=body,
        num_carried=len(states),
    )
    for out, like in zip(loop, [*states, states[0]], strict=True):
        ctx.model.tensors[out].dtype = ctx.dtype(like)
    *finals, y = loop
    if cfg.reverse[d]:  # the scan stacks steps in the order they ran
        order = emit.constant("order", np.arange(seq - 1, -1, -1, dtype=np.int64), np.int64)
        y = emit(O.GATHER, y, order, axis=0)
    if "lens" in implicit:  # an empty sequence has zero final states, as in the kernel
        nonempty = emit(O.GREATER, implicit["lens"], emit.constant("zero", 0, np.int64))
        nonempty = emit(O.UNSQUEEZE, emit(O.CAST, nonempty, to=str(emit.dtype)), axes=[1])
        finals = [emit(O.MUL, s, nonempty) for s in finals]
    return [y, *finals]


def _body(
    ctx: GradContext, cfg: Config, d: int, seq: int, states: list[int], implicit: dict[str, int]
) -> int:
    """The LOOP body of one direction: (iteration, condition, h (, c), implicit...) ->
    (condition, h' (, c'), Y's row)."""
    scope = ctx.scope
    ctx.scope = f"{scope}/step{d}"
    it, keep = ctx.tensor("t", np.int64), ctx.tensor("keep", np.bool_)
    carried = [_like(ctx, s, name) for s, name in zip(states, ("h", "c"), strict=False)]
    given = {name: _like(ctx, v, name) for name, v in implicit.items()}
    graph = Graph(
        name=ctx.scope, inputs=[it, keep, *carried, *given.values()], outputs=[], nodes=[]
    )
    gi = ctx.add_graph(graph)
    emit = _Emitter(ctx.child(gi), ctx.dtype(states[0]))
    t = it
    if cfg.reverse[d]:
        t = emit(O.SUB, emit.constant("last", np.int64(seq - 1), np.int64), it)
    xw_t = emit(O.GATHER, given["xw"], t, axis=0)
    h = carried[0]
    if cfg.kind == "LSTM":
        h_new, c_new = _lstm_step(emit, cfg, d, xw_t, h, carried[1], given)
        new = [h_new, c_new]
    elif cfg.kind == "GRU":
        new = [_gru_step(emit, cfg, d, xw_t, h, given)]
    else:
        pre = _clip(emit, cfg, emit(O.ADD, xw_t, emit(O.FULLY_CONNECTED, h, given["r"])))
        new = [emit.activation(cfg.acts[d][0], pre)]
    row = new[0]
    if "lens" in given:  # steps past a sequence's length keep the state and write zeros
        live = emit(O.CAST, emit(O.LESS, t, given["lens"]), to=str(emit.dtype))
        live = emit(O.UNSQUEEZE, live, axes=[1])
        row = emit(O.MUL, row, live)
        new = [
            emit(O.ADD, s, emit(O.MUL, live, emit(O.SUB, v, s)))
            for s, v in zip(carried, new, strict=True)
        ]
    graph.outputs = [emit(O.IDENTITY, keep), *new, row]
    fill_inferred_shapes(ctx.model, gi)
    ctx.scope = scope
    return gi


def _clip(emit: _Emitter, cfg: Config, x: int) -> int:
    return x if cfg.clip is None else emit(O.CLIP, x, min=-cfg.clip, max=cfg.clip)


def _lstm_step(
    emit: _Emitter, cfg: Config, d: int, xw: int, h: int, c: int, given: dict[str, int]
) -> tuple[int, int]:
    f, g, hact = cfg.acts[d]
    hidden = cfg.hidden
    a = emit(O.ADD, xw, emit(O.FULLY_CONNECTED, h, given["r"]))  # i, o, f, c
    ai, ao, af, ac = (emit.cols(a, k * hidden, (k + 1) * hidden) for k in range(4))
    p = given.get("p")
    if p is not None:
        ai = emit(O.ADD, ai, emit(O.MUL, emit.cols(p, 0, hidden), c))
        af = emit(O.ADD, af, emit(O.MUL, emit.cols(p, 2 * hidden, 3 * hidden), c))
    i = emit.activation(f, _clip(emit, cfg, ai))
    if cfg.input_forget:
        forget = emit(O.SUB, emit.scalar(1.0), i)
    else:
        forget = emit.activation(f, _clip(emit, cfg, af))
    cand = emit.activation(g, _clip(emit, cfg, ac))
    c_new = emit(O.ADD, emit(O.MUL, forget, c), emit(O.MUL, i, cand))
    if p is not None:
        ao = emit(O.ADD, ao, emit(O.MUL, emit.cols(p, hidden, 2 * hidden), c_new))
    o = emit.activation(f, _clip(emit, cfg, ao))
    return emit(O.MUL, o, emit.activation(hact, c_new)), c_new


def _gru_step(emit: _Emitter, cfg: Config, d: int, xw: int, h: int, given: dict[str, int]) -> int:
    f, g = cfg.acts[d]
    hidden = cfg.hidden
    r_w = given["r"]
    xw_zr = emit.cols(xw, 0, 2 * hidden)
    if cfg.linear_before_reset:
        hr = emit(O.FULLY_CONNECTED, h, r_w)
        pre_zr = emit(O.ADD, xw_zr, emit.cols(hr, 0, 2 * hidden))
        q = emit.cols(hr, 2 * hidden, 3 * hidden)
        if "rb_h" in given:
            q = emit(O.ADD, q, given["rb_h"])
        zr = emit.activation(f, _clip(emit, cfg, pre_zr))
        z, r = emit.cols(zr, 0, hidden), emit.cols(zr, hidden, 2 * hidden)
        q = emit(O.MUL, r, q)
    else:
        r_zr = emit(O.SLICE, r_w, starts=[0], ends=[2 * hidden], axes=[0])
        pre_zr = emit(O.ADD, xw_zr, emit(O.FULLY_CONNECTED, h, r_zr))
        zr = emit.activation(f, _clip(emit, cfg, pre_zr))
        z, r = emit.cols(zr, 0, hidden), emit.cols(zr, hidden, 2 * hidden)
        r_h = emit(O.SLICE, r_w, starts=[2 * hidden], ends=[3 * hidden], axes=[0])
        q = emit(O.FULLY_CONNECTED, emit(O.MUL, r, h), r_h)
        if "rb_h" in given:
            q = emit(O.ADD, q, given["rb_h"])
    ah = emit(O.ADD, emit.cols(xw, 2 * hidden, 3 * hidden), q)
    cand = emit.activation(g, _clip(emit, cfg, ah))
    return emit(O.ADD, cand, emit(O.MUL, z, emit(O.SUB, h, cand)))  # (1 - z) cand + z h
