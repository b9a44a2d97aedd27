"""TopK -> TOP_K; k (an attribute before opset 10, then input 1) becomes an attribute when
static, else stays an input the runtime reads when it plans the graph."""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode


def top_k(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs = [node.input(0)]
    k: int | None = None
    if node.opset < 10:
        k = int(node.attr("k"))
    else:
        value = ctx.value(node.input(1))
        if value is None:
            inputs.append(node.input(1))
        elif np.size(value) != 1:
            raise node.fail("k (input 1) must hold one value")
        else:
            k = int(np.ravel(value)[0])
    return ctx.emit(
        OpCode.TOP_K,
        inputs,
        num_outputs=2,
        k=k,
        axis=int(node.attr("axis", -1)),
        largest=int(node.attr("largest", 1)),
        sorted=int(node.attr("sorted", 1)),
    )
