"""Chains of 8-bit table lookups composed into one lookup when a graph is planned.

An int8/uint8 unary op on its own parameters (SIGMOID, TANH, a REQUANTIZE to uint8, ABS,
...) runs as one lookup of a 256-entry table by its input's bytes. When such a node reads
only what another such node computes (a classifier's SIGMOID then a REQUANTIZE), the
second table indexed by the first one's bytes gives both at once: the plan keeps one step
and never stores the tensor between them. Results are the same integers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import replace

import numpy as np

from sporenet.lite.graph import Node
from sporenet.lite.kernels.base import Kernel
from sporenet.lite.kernels.quantized.activation import _QLookup
from sporenet.lite.kernels.quantized.convert import Requantize
from sporenet.lite.kernels.quantized.lookup import _QTable

BYTE_LOOKUPS = (_QLookup, _QTable, Requantize)
"""Kernels whose step is `table.take(input bytes)` of their `table` (Requantize: when it
has one, i.e. for an 8-bit input)."""


def byte_table(kernel: Kernel | None) -> np.ndarray | None:
    """The 256-entry table a lookup kernel's step indexes by its input's bytes, or None."""
    if not isinstance(kernel, BYTE_LOOKUPS):
        return None
    table = getattr(kernel, "table", None)
    spec = kernel.inputs[0] if kernel.inputs else None
    if table is None or spec is None or spec.dtype.itemsize != 1 or table.shape != (256,):
        return None
    return table


def compose_lookups(
    nodes: list[Node], kernels: list[Kernel | None], outputs: Collection[int]
) -> list[Node]:
    """The graph's nodes with each lookup that reads only another lookup's output reading
    that lookup's input instead, through the composed table; the first lookup's kernel
    becomes None in `kernels` (no step, as a folded node). `nodes` is left as it is."""
    readers = Counter(
        i for node, kernel in zip(nodes, kernels, strict=True) if kernel for i in node.inputs
    )
    producer: dict[int, int] = {}
    planned = list(nodes)
    for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
        for i in node.outputs:
            producer[i] = j
        table = byte_table(kernel)
        if table is None or len(node.inputs) != 1:
            continue
        p = producer.get(node.inputs[0])
        first = None if p is None else byte_table(kernels[p])
        if p is None or first is None or readers[node.inputs[0]] != 1:
            continue
        if node.inputs[0] in outputs or len(planned[p].outputs) != 1:
            continue
        kernel.table = table[first.view(np.uint8)]  # type: ignore[union-attr]
        planned[j] = replace(node, inputs=list(planned[p].inputs))
        kernels[p] = None
    return planned
