"""Ops over subgraphs of the same model: If, Loop and Call (custom gradients)."""

from __future__ import annotations

from sporenet.lite.kernels import control_flow
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare, rule

# Their backward is again an IF/LOOP/CALL over subgraphs: differentiable where the
# subgraphs' ops are.
OPS = (
    declare(
        O.IF,
        kernel=control_flow.If,
        grad=rule("control_flow", "if_"),
        grad_differentiable=True,
        subgraphs=("then_graph", "else_graph"),
    ),
    declare(
        O.LOOP,
        kernel=control_flow.Loop,
        grad=rule("control_flow", "loop"),
        grad_differentiable=True,
        subgraphs=("body",),
    ),
    declare(
        O.CALL,
        kernel=control_flow.Call,
        grad=rule("control_flow", "call"),
        grad_differentiable=True,
        subgraphs=("graph", "grad_graph"),
    ),
)
