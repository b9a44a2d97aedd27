"""RNN, GRU and LSTM unrolled over a static sequence length into FullyConnected,
elementwise and activation nodes. Used only for onnxruntime's DynamicQuantizeLSTM, whose
per-step dynamic quantization the LSTM kernel does not model (ONNX gate layouts,
directions, clip, layout attribute).

Per direction and time step: the input projection x_t W^T + Wb is one FullyConnected,
the recurrent projection h W_r^T (+ Rb) another, then the gate arithmetic of the ONNX spec.
Outputs Y (seq, dirs, batch, hidden), Y_h and (LSTM) Y_c are stacked with Unsqueeze/Concat.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.ops import OpCode

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {
    "RNN": ["Tanh"],
    "GRU": ["Sigmoid", "Tanh"],
    "LSTM": ["Sigmoid", "Tanh", "Tanh"],
}
ACTIVATIONS = {"Sigmoid": OpCode.SIGMOID, "Tanh": OpCode.TANH, "Relu": OpCode.RELU}


class _Cell:
    """Emits the nodes of one direction; `act(k, x)` applies activation k of the direction."""

    def __init__(self, ctx: ImportContext, node: OnnxNode, direction: int, hidden: int) -> None:
        self.ctx, self.node, self.hidden = ctx, node, hidden
        self.name = f"{node.name}/dir{direction}"
        names = node.attr("activations") or DEFAULT_ACTIVATIONS[node.op_type] * 2
        per_dir = len(DEFAULT_ACTIVATIONS[node.op_type])
        chosen = names[direction * per_dir : (direction + 1) * per_dir]
        if node.attr("activation_alpha") or node.attr("activation_beta"):
            raise node.fail("activation_alpha/beta are not supported")
        unknown = [a for a in chosen if a not in ACTIVATIONS]
        if unknown:
            raise node.fail(f"activations {unknown} are not supported (only {sorted(ACTIVATIONS)})")
        self.acts = [ACTIVATIONS[a] for a in chosen]
        clip = node.attr("clip")
        self.clip = None if clip is None else float(clip)

    def const(self, suffix: str, value: np.ndarray) -> int:
        return self.ctx.constant(f"{self.name}/{suffix}", value)

    def act(self, k: int, x: int, *, clip: bool = True) -> int:
        if clip and self.clip is not None:
            x = self.ctx.emit1(OpCode.CLIP, [x], min=-self.clip, max=self.clip)
        return self.ctx.emit1(self.acts[k], [x])

    def fc(self, x: int, w: int, b: int | None = None) -> int:
        return self.ctx.emit1(OpCode.FULLY_CONNECTED, [x, w] if b is None else [x, w, b])

    def split(self, x: int, parts: int) -> list[int]:
        if parts == 1:
            return [x]
        return self.ctx.emit(OpCode.SPLIT, [x], num_outputs=parts, axis=1)


def _part(ctx: ImportContext, node: OnnxNode, k: int, d: int, start: int, end: int) -> int:
    """Rows start:end of direction d of parameter input k (W, R: 2-D result; B, P: 1-D):
    sliced now when static, by Slice and Reshape nodes when the parameter is a graph input."""
    index = node.input(k)
    value = ctx.value(index)
    name = f"{node.name}/in{k}/dir{d}/{start}:{end}"
    if value is not None:
        return ctx.constant(name, np.ascontiguousarray(value[d, start:end]))
    shape = ctx.spec(index).shape
    piece = ctx.emit1(OpCode.SLICE, [index], starts=[d, start], ends=[d + 1, end], axes=[0, 1])
    return ctx.emit1(OpCode.RESHAPE, [piece], shape=[end - start, *shape[2:]])


def recurrent(
    ctx: ImportContext, node: OnnxNode, requantize: Callable[[int], int] | None = None
) -> list[int]:
    """`requantize`, when given, replaces the input sequence and each step's state before
    their projections (dynamically quantized LSTMs quantize exactly these)."""
    kind = node.op_type
    rq: Callable[[int], int] = requantize or (lambda index: index)
    gates = GATES[kind]
    x = node.input(0)
    hidden = int(node.attr("hidden_size"))
    direction = node.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(node.attr("layout", 0))
    if kind == "LSTM" and int(node.attr("input_forget", 0)):
        raise node.fail("input_forget=1 is not supported")
    shape = ctx.shape(x)
    if layout:
        x = ctx.emit1(OpCode.TRANSPOSE, [x], perm=[1, 0, 2])
        shape = (shape[1], shape[0], shape[2])
    seq, batch, _ = shape
    if seq == DYNAMIC or batch == DYNAMIC:
        raise node.fail(
            f"needs a static sequence length and batch (input shape {list(shape)}; "
            "fix it with --input-shape)"
        )
    lens = ctx.static_input(node, 4, "sequence_lens")
    if lens is not None and not np.all(lens == seq):
        raise node.fail("sequence_lens shorter than the sequence are not supported")
    h0_index = node.input(5)
    c0_index = node.input(6) if kind == "LSTM" else -1
    has_bias = node.input(3) != -1
    has_peep = kind == "LSTM" and node.input(7) != -1
    dtype = ctx.dtype(x)
    x = rq(x)
    steps = ctx.emit(OpCode.SPLIT, [x], num_outputs=seq, axis=0) if seq > 1 else [x]
    xs = [ctx.emit1(OpCode.RESHAPE, [s], shape=[batch, -1]) for s in steps]
    zeros = np.zeros((batch, hidden), dtype)

    linear_before_reset = int(node.attr("linear_before_reset", 0))
    gh = gates * hidden
    ys, last_h, last_c = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        cell = _Cell(ctx, node, d, hidden)

        def bias(
            start: int, end: int, recurrent: bool = False, d: int = d, cell: _Cell = cell
        ) -> int:
            """Wb (or Rb) rows start:end; zeros without a B input."""
            if not has_bias:
                return cell.const(f"zeros{end - start}", np.zeros(end - start, dtype))
            offset = gh if recurrent else 0
            return _part(ctx, node, 3, d, offset + start, offset + end)

        def initial(index: int, what: str, d: int = d, cell: _Cell = cell) -> int:
            if index == -1:
                return cell.const(f"{what}0", zeros)
            # States are (dirs, batch, hidden), or (batch, dirs, hidden) with layout 1.
            return ctx.emit1(
                OpCode.RESHAPE,
                [
                    ctx.emit1(
                        OpCode.SLICE, [index], starts=[d], ends=[d + 1], axes=[1 if layout else 0]
                    )
                ],
                shape=[batch, hidden],
            )

        h = initial(h0_index, "h")
        c = initial(c0_index, "c") if kind == "LSTM" else -1
        outputs: list[int] = [0] * seq
        order = range(seq - 1, -1, -1) if reverse else range(seq)
        step: Callable[..., tuple[int, int]]
        if kind == "GRU":
            w_x, b_x = _part(ctx, node, 1, d, 0, gh), bias(0, gh)
            r_zr, b_zr = _part(ctx, node, 2, d, 0, 2 * hidden), bias(0, 2 * hidden, True)
            r_h, b_h = _part(ctx, node, 2, d, 2 * hidden, gh), bias(2 * hidden, gh, True)
            one = cell.const("one", np.array(1, dtype))

            def step(
                xt: int,
                h: int,
                c: int,
                cell: _Cell = cell,
                w_x: int = w_x,
                b_x: int = b_x,
                r_zr: int = r_zr,
                b_zr: int = b_zr,
                r_h: int = r_h,
                b_h: int = b_h,
                one: int = one,
            ) -> tuple[int, int]:
                gx_z, gx_r, gx_h = cell.split(cell.fc(xt, w_x, b_x), 3)
                gh_z, gh_r = cell.split(cell.fc(rq(h), r_zr, b_zr), 2)
                z = cell.act(0, ctx.emit1(OpCode.ADD, [gx_z, gh_z]))
                rr = cell.act(0, ctx.emit1(OpCode.ADD, [gx_r, gh_r]))
                if linear_before_reset:
                    gh_h = ctx.emit1(OpCode.MUL, [rr, cell.fc(rq(h), r_h, b_h)])
                else:
                    gh_h = cell.fc(rq(ctx.emit1(OpCode.MUL, [rr, h])), r_h, b_h)
                candidate = cell.act(1, ctx.emit1(OpCode.ADD, [gx_h, gh_h]))
                keep = ctx.emit1(OpCode.MUL, [z, h])
                new = ctx.emit1(OpCode.MUL, [ctx.emit1(OpCode.SUB, [one, z]), candidate])
                return ctx.emit1(OpCode.ADD, [new, keep]), c
        else:
            w_x, r_all = _part(ctx, node, 1, d, 0, gh), _part(ctx, node, 2, d, 0, gh)
            b_x = ctx.emit1(OpCode.ADD, [bias(0, gh), bias(0, gh, True)])
            if kind == "LSTM":
                p_i, p_o, p_f = (
                    (_part(ctx, node, 7, d, k * hidden, (k + 1) * hidden) for k in range(3))
                    if has_peep
                    else (None, None, None)
                )

                def step(
                    xt: int,
                    h: int,
                    c: int,
                    cell: _Cell = cell,
                    w_x: int = w_x,
                    b_x: int = b_x,
                    r_all: int = r_all,
                    p_i: int | None = p_i,
                    p_o: int | None = p_o,
                    p_f: int | None = p_f,
                ) -> tuple[int, int]:
                    g = ctx.emit1(OpCode.ADD, [cell.fc(xt, w_x, b_x), cell.fc(rq(h), r_all)])
                    gi, go, gf, gc = cell.split(g, 4)

                    def peephole(gate: int, p: int | None, state: int) -> int:
                        if p is None:
                            return gate
                        return ctx.emit1(OpCode.ADD, [gate, ctx.emit1(OpCode.MUL, [p, state])])

                    i = cell.act(0, peephole(gi, p_i, c))
                    f = cell.act(0, peephole(gf, p_f, c))
                    candidate = cell.act(1, gc)
                    c_new = ctx.emit1(
                        OpCode.ADD,
                        [ctx.emit1(OpCode.MUL, [f, c]), ctx.emit1(OpCode.MUL, [i, candidate])],
                    )
                    o = cell.act(0, peephole(go, p_o, c_new))
                    # Clip bounds gate inputs only: onnxruntime does not clip the cell state
                    # before the output activation, and its results are the reference here.
                    return ctx.emit1(OpCode.MUL, [o, cell.act(2, c_new, clip=False)]), c_new
            else:

                def step(
                    xt: int,
                    h: int,
                    c: int,
                    cell: _Cell = cell,
                    w_x: int = w_x,
                    b_x: int = b_x,
                    r_all: int = r_all,
                ) -> tuple[int, int]:
                    g = ctx.emit1(OpCode.ADD, [cell.fc(xt, w_x, b_x), cell.fc(rq(h), r_all)])
                    return cell.act(0, g), c

        for t in order:
            h, c = step(xs[t], h, c)
            outputs[t] = h
        ys.append(outputs)
        last_h.append(h)
        last_c.append(c)

    def stack(states: list[int], axis: int) -> int:
        parts = [ctx.emit1(OpCode.UNSQUEEZE, [s], axes=[axis]) for s in states]
        return parts[0] if len(parts) == 1 else ctx.emit1(OpCode.CONCAT, parts, axis=axis)

    # Y: (seq, dirs, batch, hidden); layout 1: (batch, seq, dirs, hidden).
    per_time = [stack([ys[d][t] for d in range(dirs)], 0) for t in range(seq)]
    y = stack(per_time, 0)
    y_h = stack(last_h, 0)
    results = [y, y_h]
    if kind == "LSTM":
        results.append(stack(last_c, 0))
    if layout:
        results[0] = ctx.emit1(OpCode.TRANSPOSE, [y], perm=[2, 0, 1, 3])
        results[1:] = [ctx.emit1(OpCode.TRANSPOSE, [s], perm=[1, 0, 2]) for s in results[1:]]
    return results
