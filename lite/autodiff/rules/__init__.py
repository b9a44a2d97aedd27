"""Gradient rules, one function per differentiable op, in modules named after their
forward kernels' modules (rules/linear.py for lite/kernels/linear.py, ...). Ops built
from differentiable primitives need no rule.

Which op uses which rule is declared with the op (lite/opset/); `GRADIENT_RULES` and
`SECOND_ORDER` are read-only views of those declarations.
"""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradRule
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import DerivedMap, DerivedSet, derived_map, derived_set

GRADIENT_RULES: DerivedMap[OpCode, GradRule] = derived_map(lambda d: d.grad)
SECOND_ORDER: DerivedSet[OpCode] = derived_set(
    lambda d: d.grad is not None and d.grad_differentiable
)
"""Ops whose rule emits only ops that have rules themselves, so grad(grad(f)) works."""
