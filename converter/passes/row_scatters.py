"""Row scatters: a 2-D ScatterElements along axis 0 whose indices are one column
broadcast across the rows' width (a graph network's message sums,
`index.unsqueeze(-1).expand_as(messages)` in PyTorch) becomes a ScatterND of whole rows.

SCATTER_ELEMENTS(data [N, F], EXPAND(col [E, 1]), updates [E, F]) writes updates[e] into
row col[e] of data, every element of a row at the same index. That is
SCATTER_ND_UPDATE(data, rows, updates) with the same reduction, rows being the expanded
indices' first column (a GATHER of column 0: [E, 1] whatever EXPAND broadcast, so the
rewrite holds for any shapes the graph runs at). The kernel then checks E indices instead
of E * F and treats whole rows (kernels/scatter.py).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, add_tensor, producers
from sporenet.lite.graph import DYNAMIC, Model, Node
from sporenet.lite.ops import OpCode


def scatter_rows(model: Model) -> int:
    """Rewrite every row scatter (see the module docstring); returns the count."""
    rewritten = 0
    for graph in model.graphs:
        made = producers(graph)
        columns: dict[int, int] = {}  # expanded indices -> their first column
        for node in list(graph.nodes):
            if not _is_row_scatter(model, made, node):
                continue
            expanded = node.inputs[1]
            position = graph.nodes.index(node)
            rows = columns.get(expanded)
            if rows is None:  # one column per expanded index, however many scatters read it
                rows = columns[expanded] = add_tensor(model, f"{node.name}/rows", expanded)
                model.tensors[rows].shape = (model.tensors[expanded].shape[0], 1)
                first = add_constant(model, f"{node.name}/first", np.zeros(1, np.int64))
                gather = Node(OpCode.GATHER, [expanded, first], [rows], {"axis": 1})
                graph.nodes.insert(position, gather)
                position += 1
            graph.nodes[position] = Node(
                OpCode.SCATTER_ND_UPDATE,
                [node.inputs[0], rows, node.inputs[2]],
                list(node.outputs),
                {"reduction": node.attrs.get("reduction", "none")},
                name=node.name,
            )
            rewritten += 1
    return rewritten


def _is_row_scatter(model: Model, made: dict[int, Node], node: Node) -> bool:
    """Whether `node` is a 2-D ScatterElements along axis 0 of indices EXPANDed from one
    [E, 1] column, as wide as data and updates (a static width)."""
    if node.op != OpCode.SCATTER_ELEMENTS or node.attrs.get("axis", 0) != 0:
        return False
    if len(node.inputs) != 3 or -1 in node.inputs:
        return False
    data, indices, updates = (tuple(model.tensors[i].shape) for i in node.inputs)
    expand = made.get(node.inputs[1])
    if expand is None or expand.op != OpCode.EXPAND or not expand.inputs:
        return False
    col = model.tensors[expand.inputs[0]]
    return (
        len(data) == len(indices) == len(updates) == len(col.shape) == 2
        and col.shape[1] == 1
        and data[1] != DYNAMIC
        and data[1] == indices[1] == updates[1]
        and col.dtype.kind in "iu"
    )
