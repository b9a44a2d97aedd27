"""Gradients of fused activations (the `activation` attribute of FC, Conv2D, Add, ...)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.kernels.training.activation_grad import FROM_OUTPUT
from sporenet.lite.ops import OpCode

ACTIVATION_PARAMS = ("alpha", "beta", "clip_min", "clip_max", "approximate")


def through_fused_activation(ctx: GradContext, node: Node, grad: int) -> int:
    """The gradient before the node's fused activation, from the gradient after it."""
    name = node.attrs.get("activation", "none")
    if name == "none":
        return grad
    if name not in FROM_OUTPUT:
        # The pre-activation value is not kept; unfuse the activation to train through it.
        raise UnsupportedOpError(
            f"{node.op.name} {node.name!r}: no gradient through the fused activation {name!r}; "
            f"fused activations with gradients: {sorted(FROM_OUTPUT - {'none'})}"
        )
    params = {k: node.attrs[k] for k in ACTIVATION_PARAMS if k in node.attrs}
    return ctx.op(OpCode.ACTIVATION_GRAD, [grad, -1, node.outputs[0]], activation=name, **params)
