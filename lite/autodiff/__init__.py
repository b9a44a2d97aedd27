"""Reverse-mode autodiff as a transformation of the IR graph (docs/architecture.md).

`append_gradients` appends backward nodes to a graph; the result is an ordinary graph that
the planner and executor run. Cloud training (eager tape and graph tracer) and on-device
transfer learning share this engine.
"""

from sporenet.lite.autodiff.context import GradContext, GradRule
from sporenet.lite.autodiff.engine import append_gradients, append_vjp
from sporenet.lite.autodiff.rules import GRADIENT_RULES

__all__ = ["GRADIENT_RULES", "GradContext", "GradRule", "append_gradients", "append_vjp"]
