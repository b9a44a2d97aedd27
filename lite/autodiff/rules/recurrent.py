"""Gradients of LSTM, GRU and RNN (kernels: lite/kernels/recurrent.py): one backward node
per layer that runs backpropagation through time (lite/kernels/training/recurrent_grad.py).
An LSTM_TRAINING node (an LSTM of a training graph) hands LSTM_GRAD the steps it saved."""

from __future__ import annotations

from sporenet.lite.autodiff.engine import GradContext
from sporenet.lite.errors import UnsupportedOpError
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
    return _backward_node(ctx, node, node.op, grads, [])


def lstm_training(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Output 3, the saved steps, only feeds LSTM_GRAD: it has no gradient of its own.
    if len(node.outputs) < 4:
        raise UnsupportedOpError(
            f"LSTM_TRAINING {node.name!r}: differentiating needs the saved steps as output 3, "
            f"the node has {len(node.outputs)} outputs"
        )
    return _backward_node(ctx, node, OpCode.LSTM, grads[:3], [node.outputs[3]])


def _backward_node(
    ctx: GradContext, node: Node, op: OpCode, grads: list[int | None], extra: list[int]
) -> list[int | None]:
    """One backward node of forward op `op` taking the node's inputs, its output gradients
    and `extra`; the gradients of the inputs the loss needs."""
    n = NUM_INPUTS[op.name]
    inputs = list(node.inputs) + [-1] * (n - len(node.inputs))
    positions = grad_outputs(op.name, [i != -1 for i in inputs])
    wanted = [k for k in positions if ctx.needs(inputs[k])]
    result: list[int | None] = [None] * len(node.inputs)
    if not wanted:
        return result
    outputs = ctx.op_multi(
        _BACKWARD[op],
        inputs + [-1 if g is None else g for g in grads] + extra,
        len(positions),
        **node.attrs,
    )
    for k, out in zip(positions, outputs, strict=True):
        if k in wanted:
            result[k] = out
    return result
