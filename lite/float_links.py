"""Folded int8 layers that hand their outputs to the next folded layer as float64.

A folded int8 layer (quantized/output_stage.Folded) ends with a clamp, a truncating cast
to bytes and a byte offset; a folded pointwise layer reading those bytes starts by
converting them back to float64 for its product. When a layer's output is read only by
such a layer (a depthwise then a pointwise convolution of a streaming net), the first
writes floor(clamped v), its outputs minus its clamp's low end, straight into the
second's float64 columns, and the second takes that low end into its offset column: two
NumPy calls fewer per pair, the same integers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from sporenet.lite.graph import Node
from sporenet.lite.kernels.base import Kernel
from sporenet.lite.kernels.quantized.conv import QConv2D


def link_floats(nodes: list[Node], kernels: list[Kernel | None], outputs: Collection[int]) -> None:
    """Link each folded QConv2D whose output only a folded pointwise QConv2D reads to
    that reader (QConv2D.float_input), before the plan binds them."""
    readers = Counter(
        i for node, kernel in zip(nodes, kernels, strict=True) if kernel for i in node.inputs
    )
    producer: dict[int, int] = {}
    for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
        for i in node.outputs:
            producer[i] = j
        if not isinstance(kernel, QConv2D) or not node.inputs:
            continue
        t = node.inputs[0]
        p = producer.get(t)
        if p is None or readers[t] != 1 or t in outputs or nodes[p].outputs != [t]:
            continue
        first, size = kernels[p], kernel.input(0).size
        if not isinstance(first, QConv2D) or first.fold is None or first.float_output is not None:
            continue
        if first.output_specs[0].size < 2 or first.output_specs[0].size != size:
            continue
        floats = kernel.float_input(first.fold.lo)
        if floats is not None:
            first.float_output = floats
