"""Gradients of LSTM, GRU and RNN (kernels: lite/kernels/recurrent.py): one backward node
per layer that runs backpropagation through time (lite/kernels/training/recurrent_grad.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.engine import GradContext
from sporenet.lite.graph import Node
from sporenet.lite.kernels.recurrent import NUM_INPUTS
from sporenet.lite.kernels.training.recurrent_grad import grad_outputs
from sporenet.lite.ops import OpCode

_BACKWARD = {
    OpCode.LSTM: OpCode.LSTM_GRAD,
    OpCode.GRU: OpCode.GRU_GRAD,
    OpCode.RNN: OpCode.RNN_GRAD,
}


def recurrent(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    n = NUM_INPUTS[node.op.name]
    inputs = list(node.inputs) + [-1] * (n - len(node.inputs))
    positions = grad_outputs(node.op.name, [i != -1 for i in inputs])
    wanted = [k for k in positions if ctx.needs(inputs[k])]
    result: list[int | None] = [None] * len(node.inputs)
    if not wanted:
        return result
    outputs = ctx.op_multi(
        _BACKWARD[node.op],
        inputs + [-1 if g is None else g for g in grads],
        len(positions),
        **node.attrs,
    )
    for k, out in zip(positions, outputs, strict=True):
        if k in wanted:
            result[k] = out
    return result
