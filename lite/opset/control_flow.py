"""Ops over subgraphs of the same model: If, Loop and Call (custom gradients)."""

from __future__ import annotations

from sporenet.lite.autodiff.rules import control_flow as r_control_flow
from sporenet.lite.kernels import control_flow
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare

# Their backward is again an IF/LOOP/CALL over subgraphs: differentiable where the
# subgraphs' ops are.
OPS = (
    declare(
        O.IF,
        kernel=control_flow.If,
        grad=r_control_flow.if_,
        grad_differentiable=True,
        subgraphs=("then_graph", "else_graph"),
    ),
    declare(
        O.LOOP,
        kernel=control_flow.Loop,
        grad=r_control_flow.loop,
        grad_differentiable=True,
        subgraphs=("body",),
    ),
    declare(
        O.CALL,
        kernel=control_flow.Call,
        grad=r_control_flow.call,
        grad_differentiable=True,
        subgraphs=("graph", "grad_graph"),
    ),
)
