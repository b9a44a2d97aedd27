"""One declaration per op (`OpDecl`), grouped by op family, and the tables derived from them.

Adding an op: write its kernel (and rule, int8 kernel) and one `declare(OpCode.X, ...)` in
its family's module here; every table below follows. docs/architecture.md has the recipe.
"""

from __future__ import annotations

from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import (
    CLAMPS,
    FROM_OUTPUT,
    FUSABLE,
    Activation,
    Channels,
    DerivedMap,
    DerivedSet,
    OpDecl,
    Quant,
    declare,
    derived_map,
    derived_set,
)


def _collect() -> dict[OpCode, OpDecl]:
    # Imported on first use: the family modules import kernels and gradient rules, whose
    # packages read these declarations themselves.
    from sporenet.lite.opset import (
        control_flow,
        elementwise,
        linear,
        ml,
        normalization,
        pooling,
        quantization,
        recurrent,
        reduce,
        structural,
        training,
        unary,
    )

    families = (
        structural,
        linear,
        pooling,
        normalization,
        elementwise,
        unary,
        reduce,
        quantization,
        recurrent,
        control_flow,
        training,
        ml,
    )
    table: dict[OpCode, OpDecl] = {}
    for family in families:
        for decl in family.OPS:
            if decl.op in table:
                raise RuntimeError(f"{decl.op.name} is declared twice ({family.__name__})")
            table[decl.op] = decl
    return table


DECLARATIONS: DerivedMap[OpCode, OpDecl] = DerivedMap(_collect)
"""Every op this runtime knows, by op code (read-only; built on first use)."""


def declaration(op: OpCode) -> OpDecl | None:
    """The declaration of `op`, or None for an op without one."""
    return DECLARATIONS.get(op)


__all__ = [
    "CLAMPS",
    "DECLARATIONS",
    "FROM_OUTPUT",
    "FUSABLE",
    "Activation",
    "Channels",
    "DerivedMap",
    "DerivedSet",
    "OpDecl",
    "Quant",
    "declaration",
    "declare",
    "derived_map",
    "derived_set",
]
