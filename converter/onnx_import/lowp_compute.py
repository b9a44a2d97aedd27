"""Ops on low-precision tensors (bfloat16, float8, float4, 4- and 2-bit integers) run in
float32 (int8/uint8 for the integers): the kernels know NumPy's types only.

A node none of whose handlers reads these types itself gets its low-precision inputs cast
up, is converted as usual, and has the outputs it produced in the wide type cast back down
to the (first) low-precision input type, as ONNX's ops keep their input type. The casts
round as ONNX's Cast does, so each op is exact up to one final rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite import lowp
from sporenet.lite.ops import OpCode

NATIVE = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "If", "Loop", "Scan"})
"""Op types whose handlers read low-precision inputs themselves (casts, quantization,
control flow, whose bodies see the types as they are)."""


def needs_widening(ctx: ImportContext, node: OnnxNode) -> bool:
    if node.op_type in NATIVE:
        return False
    return any(i != -1 and lowp.is_lowp(ctx.dtype(i)) for i in node.inputs)


def convert_widened(
    ctx: ImportContext, node: OnnxNode, convert: Callable[[ImportContext, OnnxNode], list[int]]
) -> list[int]:
    """`convert(ctx, node)` with the node's low-precision inputs cast to their compute
    type and its outputs of that type cast back."""
    narrow: lowp.LowpType | None = None
    inputs = []
    for i in node.inputs:
        kind = lowp.lowp_type(ctx.dtype(i)) if i != -1 else None
        if kind is None:
            inputs.append(i)
            continue
        narrow = narrow or kind
        inputs.append(ctx.emit1(OpCode.CAST, [i], to=str(kind.compute)))
    if narrow is None:
        raise ConversionError(f"{node.op_type}: expected a low-precision input, found none")
    results = convert(ctx, dataclasses.replace(node, inputs=inputs))
    wide = np.dtype(narrow.compute)
    return [
        ctx.emit1(OpCode.CAST, [r], to=narrow.name) if ctx.tensors[r].dtype == wide else r
        for r in results
    ]
