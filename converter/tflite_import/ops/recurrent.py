"""TFLite's sequence recurrent builtins onto the IR's LSTM and RNN (ONNX semantics, the
existing recurrent kernels): UNIDIRECTIONAL_SEQUENCE_LSTM, BIDIRECTIONAL_SEQUENCE_LSTM and
UNIDIRECTIONAL_SEQUENCE_RNN, float (int8 weights are widened at conversion).

The variants the ONNX LSTM cannot express (coupled input and forget gates, a projection
layer, layer normalization, cell or projection clipping) map onto the IR's SEQUENCE_LSTM
instead, TFLite's own float LSTM step (lite/kernels/sequence_lstm.py), with the 24
inputs as TFLite lists them.

TFLite keeps the gates' weights as separate tensors (input, forget, cell, output); the IR
stacks them in ONNX's order (input, output, forget, cell). The state inputs are TFLite
variable tensors: the runs leave their final state there and the next invoke starts from
it, as in LiteRT (reset_all_variables() zeroes them), so they become IR variables written
by ASSIGN from the layer's final states.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import LayoutContext
from sporenet.converter.tflite_import.ops.variables import state_variable
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode
from sporenet.proto import tflite_schema_generated as tfl

_ACT = tfl.ActivationFunctionType
_CELL_ACTIVATIONS = {_ACT.TANH: "Tanh", _ACT.RELU: "Relu"}


def _weight(lc: LayoutContext, index: int, what: str) -> np.ndarray:
    """A constant weight as float32 (int8 weights dequantized: hybrid models)."""
    value = lc.constant_value(index, what)
    q = lc.tensor(index).quant
    if value.dtype.kind in "iu" and q is not None:
        axis = q.axis if q.scale.size > 1 else None
        shape = [1] * value.ndim
        if axis is not None:
            shape[axis] = -1
        scale = q.scale.reshape(shape) if axis is not None else q.scale[0]
        zero = q.zero_point.reshape(shape) if axis is not None else q.zero_point[0]
        return ((value.astype(np.float64) - zero) * scale).astype(np.float32)
    return np.asarray(value, np.float32)


def _present(op: TfliteOperator, k: int) -> bool:
    return k < len(op.inputs) and op.inputs[k] != -1


def _activation(lc: LayoutContext, code: int) -> str:
    if code not in _CELL_ACTIVATIONS:
        raise lc.fail(f"cell activation {code} is not supported (TANH or RELU)")
    return _CELL_ACTIVATIONS[code]


def _lstm_weights(lc: LayoutContext, op: TfliteOperator, base: int) -> dict[str, np.ndarray]:
    """W, R, B (and P) of one direction whose 17 weight inputs follow `base`: inputs
    base + 1.. the input-gate weights (i, f, c, o), + 5.. the recurrent ones, + 9.. the
    peepholes (i, f, o), + 12.. the biases, + 16, 17 the projection."""
    if not _present(op, base + 1):  # no input-gate weights: CIFG
        raise lc.fail("coupled input and forget gates (CIFG) are not supported")
    if _present(op, base + 16) or _present(op, base + 17):
        raise lc.fail("a projection layer is not supported")
    gates = (0, 3, 1, 2)  # TFLite (i, f, c, o) -> ONNX (i, o, f, c)
    w = [_weight(lc, op.inputs[base + 1 + g], "input weights") for g in gates]
    r = [_weight(lc, op.inputs[base + 5 + g], "recurrent weights") for g in gates]
    b = [_weight(lc, op.inputs[base + 12 + g], "gate bias") for g in gates]
    out = {
        "W": np.stack(w)[None].reshape(1, -1, w[0].shape[1]),
        "R": np.stack(r)[None].reshape(1, -1, r[0].shape[1]),
        "B": np.concatenate([*b, np.zeros(4 * b[0].size, np.float32)])[None],
    }
    peep = [_present(op, base + 9 + k) for k in range(3)]
    if any(peep):
        if not all(peep):
            raise lc.fail("peephole weights must be given for all three gates")
        p = [_weight(lc, op.inputs[base + 9 + k], "peephole") for k in (0, 2, 1)]  # i, o, f
        out["P"] = np.concatenate(p)[None]
    return out


def _state(lc: LayoutContext, index: int, layout: int) -> tuple[int, int]:
    """A TFLite state tensor [batch, n] as (IR variable, its [1, batch, n] or [batch, 1, n]
    view for the IR layer)."""
    var = state_variable(lc, index)
    shape = [-1, 1, lc.tensor(index).shape[-1]] if layout else [1, *lc.tensor(index).shape]
    return var, lc.emit(OpCode.RESHAPE, [_read(lc, var)], shape=shape)


def _read(lc: LayoutContext, var: int) -> int:
    spec = lc.ctx.spec(var)
    return lc.raw(OpCode.READ_VARIABLE, [var], spec.shape, spec.dtype, None, {})


def _assign(lc: LayoutContext, var: int, final: int) -> None:
    value = lc.emit(OpCode.RESHAPE, [final], shape=list(lc.ctx.spec(var).shape))
    lc.ctx.nodes.append(
        Node(op=OpCode.ASSIGN, inputs=[var, value], outputs=[], attrs={}, name=f"{lc.where}/state")
    )


def _lstm(
    lc: LayoutContext,
    op: TfliteOperator,
    x: int,
    base: int,
    h: int,
    c: int,
    *,
    layout: int,
    reverse: bool,
    act: str,
) -> tuple[int, list[tuple[int, int]]]:
    """One direction: the IR LSTM's Y squeezed to (time, batch, n) or (batch, time, n),
    and the (variable, final state) pairs to write back."""
    ctx = lc.ctx
    weights = _lstm_weights(lc, op, base)
    hv, h0 = _state(lc, h, layout)
    cv, c0 = _state(lc, c, layout)
    name = lc.tensor(op.outputs[0]).name
    inputs = [
        x,
        ctx.constant(f"{name}/W", weights["W"]),
        ctx.constant(f"{name}/R", weights["R"]),
        ctx.constant(f"{name}/B", weights["B"]),
        -1,
        h0,
        c0,
        ctx.constant(f"{name}/P", weights["P"]) if "P" in weights else -1,
    ]
    if inputs[-1] == -1:
        inputs.pop()
    hidden = weights["R"].shape[2]
    y, y_h, y_c = ctx.emit(
        OpCode.LSTM,
        inputs,
        num_outputs=3,
        hidden_size=hidden,
        layout=layout,
        direction="reverse" if reverse else "forward",
        activations=f"Sigmoid,{act},{act}",
    )
    y = ctx.emit1(OpCode.SQUEEZE, [y], axes=[2 if layout else 1])
    return y, [(hv, y_h), (cv, y_c)]


# TFLite ActivationFunctionType -> SEQUENCE_LSTM's activation
_SEQUENCE_ACTIVATIONS = {
    _ACT.NONE: "none",
    _ACT.RELU: "relu",
    _ACT.RELU6: "relu6",
    _ACT.TANH: "tanh",
}


def _needs_sequence_lstm(op: TfliteOperator, o: object) -> bool:
    """CIFG, a projection, layer norm or clipping: what the ONNX LSTM cannot express."""
    clips = float(o.CellClip()) or float(o.ProjClip())  # type: ignore[attr-defined]
    return bool(
        clips
        or not _present(op, 1)
        or _present(op, 16)
        or any(_present(op, k) for k in range(20, 24))
    )


def _sequence_lstm(
    lc: LayoutContext, op: TfliteOperator, o: object, *, one_step: bool = False
) -> None:
    """UNIDIRECTIONAL_SEQUENCE_LSTM as the IR's SEQUENCE_LSTM (TFLite's own step); with
    `one_step`, the LSTM builtin: one step of a [batch, input] input."""
    x = lc.get(op.inputs[0])
    if one_step:
        x = lc.emit(OpCode.UNSQUEEZE, [x], axes=[0])  # a sequence of one, time first
    inputs = [op.inputs[k] if _present(op, k) else -1 for k in range(1, 24)]
    time_major = one_step or bool(o.TimeMajor())  # type: ignore[attr-defined]
    y = _sequence_direction(lc, op, o, x, inputs, time_major=time_major, reverse=False)
    lc.set(op.outputs[0], lc.emit(OpCode.SQUEEZE, [y], axes=[0]) if one_step else y)


def _sequence_direction(
    lc: LayoutContext,
    op: TfliteOperator,
    o: object,
    x: int,
    inputs: list[int],
    *,
    time_major: bool,
    reverse: bool,
) -> int:
    """One SEQUENCE_LSTM over `x`: `inputs` are the TFLite tensors of its inputs 1..23
    (-1 absent; 18 and 19 the state variables, written back after it); returns y."""
    code = o.FusedActivationFunction()  # type: ignore[attr-defined]
    if code not in _SEQUENCE_ACTIVATIONS:
        raise lc.fail(f"activation {code} is not supported (NONE, RELU, RELU6 or TANH)")
    name, ctx = f"{lc.tensor(op.outputs[0]).name}{'/bw' if reverse else ''}", lc.ctx
    args: list[int] = [x]
    states = []
    for k, tensor in enumerate(inputs, start=1):
        if k in (18, 19):
            var = state_variable(lc, tensor)
            states.append(var)
            args.append(_read(lc, var))
        elif tensor != -1:
            args.append(ctx.constant(f"{name}/input{k}", _weight(lc, tensor, f"input {k}")))
        else:
            args.append(-1)
    y, h, c = ctx.emit(
        OpCode.SEQUENCE_LSTM,
        args,
        num_outputs=3,
        activation=_SEQUENCE_ACTIVATIONS[code],
        cell_clip=float(o.CellClip()),  # type: ignore[attr-defined]
        proj_clip=float(o.ProjClip()),  # type: ignore[attr-defined]
        time_major=int(time_major),
        reverse=int(reverse),
    )
    for var, final in zip(states, (h, c), strict=True):
        _assign(lc, var, final)
    return y


def lstm(lc: LayoutContext, op: TfliteOperator) -> None:
    """The one-step LSTM builtin with the full kernel (TFLite's LSTM step on [batch,
    input], states in variable inputs 18 and 19, one output)."""
    o = op.options
    if o is not None and o.KernelType() != tfl.LSTMKernelType.FULL:
        raise lc.fail("the BASIC LSTM kernel (4 outputs, concatenated weights) is not supported")
    if len(op.outputs) != 1 or len(op.inputs) < 20:
        raise lc.fail(
            f"an LSTM with {len(op.inputs)} inputs and {len(op.outputs)} outputs: the full "
            "kernel takes 20 or 24 inputs (states as variables) and gives one output"
        )
    _sequence_lstm(lc, op, o, one_step=True)


def unidirectional_sequence_lstm(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    if _needs_sequence_lstm(op, o):
        _sequence_lstm(lc, op, o)
        return
    layout = 0 if o.TimeMajor() else 1
    act = _activation(lc, o.FusedActivationFunction())
    y, states = _lstm(
        lc,
        op,
        lc.get(op.inputs[0]),
        0,
        op.inputs[18],
        op.inputs[19],
        layout=layout,
        reverse=False,
        act=act,
    )
    for var, final in states:
        _assign(lc, var, final)
    lc.set(op.outputs[0], y)


def bidirectional_sequence_lstm(lc: LayoutContext, op: TfliteOperator) -> None:
    # inputs: 0 x; 1-17 forward weights; 18-34 backward weights; 35-36 forward h, c;
    # 37-38 backward h, c; 39-47 auxiliary input and its weights (unsupported).
    o = op.options
    if any(_present(op, k) for k in range(39, 48)):
        raise lc.fail("auxiliary inputs are not supported")
    backward = [op.inputs[k] if _present(op, k) else -1 for k in range(18, 35)]
    clips = float(o.CellClip()) or float(o.ProjClip())
    # CIFG (no input-gate weights) or a projection in either direction, or clipping
    if clips or not _present(op, 1) or _present(op, 16) or backward[0] == -1 or backward[15] != -1:
        _bidirectional_sequence(lc, op, o, backward)
        return
    layout = 0 if o.TimeMajor() else 1
    act = _activation(lc, o.FusedActivationFunction())
    x = lc.get(op.inputs[0])
    fw, fw_states = _lstm(
        lc, op, x, 0, op.inputs[35], op.inputs[36], layout=layout, reverse=False, act=act
    )
    bw, bw_states = _lstm(
        lc, op, x, 17, op.inputs[37], op.inputs[38], layout=layout, reverse=True, act=act
    )
    for var, final in fw_states + bw_states:
        _assign(lc, var, final)
    if o.MergeOutputs():
        lc.set(op.outputs[0], lc.emit(OpCode.CONCAT, [fw, bw], axis=2))
    else:
        lc.set(op.outputs[0], fw)
        lc.set(op.outputs[1], bw)


def _bidirectional_sequence(
    lc: LayoutContext, op: TfliteOperator, o: object, backward: list[int]
) -> None:
    """BIDIRECTIONAL_SEQUENCE_LSTM's variants as two SEQUENCE_LSTMs, the backward one
    running the sequence from its end (its outputs at their own time steps)."""
    x, time_major = lc.get(op.inputs[0]), bool(o.TimeMajor())  # type: ignore[attr-defined]
    forward = [op.inputs[k] if _present(op, k) else -1 for k in range(1, 18)]
    fw_states, bw_states, norms = (
        [op.inputs[35], op.inputs[36]],
        [op.inputs[37], op.inputs[38]],
        [-1] * 4,
    )
    fw = _sequence_direction(
        lc, op, o, x, [*forward, *fw_states, *norms], time_major=time_major, reverse=False
    )
    bw = _sequence_direction(
        lc, op, o, x, [*backward, *bw_states, *norms], time_major=time_major, reverse=True
    )
    if o.MergeOutputs():  # type: ignore[attr-defined]
        lc.set(op.outputs[0], lc.emit(OpCode.CONCAT, [fw, bw], axis=2))
    else:
        lc.set(op.outputs[0], fw)
        lc.set(op.outputs[1], bw)


def unidirectional_sequence_rnn(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, w, r, b, h = op.inputs[:5]
    layout = 0 if o.TimeMajor() else 1
    act = _activation(lc, o.FusedActivationFunction())
    name = lc.tensor(op.outputs[0]).name
    bias = _weight(lc, b, "bias")
    ctx = lc.ctx
    hv, h0 = _state(lc, h, layout)
    weights = [
        ctx.constant(f"{name}/W", _weight(lc, w, "input weights")[None]),
        ctx.constant(f"{name}/R", _weight(lc, r, "recurrent weights")[None]),
        ctx.constant(f"{name}/B", np.concatenate([bias, np.zeros_like(bias)])[None]),
    ]
    y, y_h = ctx.emit(
        OpCode.RNN,
        [lc.get(x), *weights, -1, h0],
        num_outputs=2,
        hidden_size=int(bias.size),
        layout=layout,
        activations=act,
    )
    _assign(lc, hv, y_h)
    lc.set(op.outputs[0], ctx.emit1(OpCode.SQUEEZE, [y], axes=[2 if layout else 1]))
