"""Constants entering an IF's branches are read there as constants, not passed in.

TFLite's IF (and ONNX's outer-scope values, as imported) hands its branches every tensor
they use as an operand, weights included. At run time the IF step copies each operand
into its branch's input on every call, and the branch's kernels see run-time weights:
nothing is folded or pre-packed there (a fully connected layer's bias stays an ADD of a
RESHAPE, its weights are re-read in the layout they were given). A wake-word head whose
second stage sits in an IF copies its 64x1536 weights on every call.

Here an operand that is a stored constant is dropped from the IF and from both branches'
inputs, and the branches read the constant itself (the tensor table is the model's), so
the passes after this one fold and fuse inside the branches as in the main graph. Not
inlined: constants any graph writes (variables, training state: a branch planned on its
own would read the stored value, not the live one), and inputs a branch writes in place
or hands on to a nested subgraph. A branch graph some other node or a signature also
uses is left as it is.
"""

from __future__ import annotations

from collections import Counter

from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES
from sporenet.lite.ops import OpCode
from sporenet.lite.variables import WRITTEN_INPUTS, state_tensors

_BRANCHES = ("then_graph", "else_graph")


def inline_branch_constants(model: Model) -> int:
    """Read every IF operand that is a constant straight from the tensor table inside its
    branches; returns how many operands were inlined."""
    uses = _graph_uses(model)
    state = set(state_tensors(model))
    inlined = 0
    for graph in model.graphs:
        for node in graph.nodes:
            if node.op == OpCode.IF:
                inlined += _inline(model, node, uses, state)
    return inlined


def _graph_uses(model: Model) -> Counter[int]:
    """How many node attributes and signatures name each graph index."""
    uses: Counter[int] = Counter(sig.graph for sig in model.signatures.values())
    for graph in model.graphs:
        for node in graph.nodes:
            for name in SUBGRAPH_ATTRIBUTES.get(node.op, ()):
                index = node.attrs.get(name, -1)
                if isinstance(index, int) and index >= 0:
                    uses[index] += 1
    return uses


def _inline(model: Model, node: Node, uses: Counter[int], state: set[int]) -> int:
    """Inline the constant operands of one IF node; returns how many."""
    branches: list[Graph] = []
    for name in _BRANCHES:
        index = node.attrs.get(name, -1)
        if not isinstance(index, int) or index == -1:
            continue  # a branch that cannot run at these shapes takes no inputs
        if not 0 < index < len(model.graphs) or uses[index] != 1:
            return 0
        branches.append(model.graphs[index])
    operands = node.inputs[1:]
    if not branches or any(len(b.inputs) != len(operands) for b in branches):
        return 0
    keep = [
        k
        for k, i in enumerate(operands)
        if i == -1
        or model.tensors[i].data is None
        or i in state
        or not all(_inlinable(b, b.inputs[k]) for b in branches)
    ]
    if len(keep) == len(operands):
        return 0
    for branch in branches:
        constants = {
            branch.inputs[k]: i for k, i in enumerate(operands) if k not in keep and i != -1
        }
        for reader in branch.nodes:
            reader.inputs = [constants.get(i, i) for i in reader.inputs]
        branch.inputs = [branch.inputs[k] for k in keep]
    node.inputs = [node.inputs[0], *(operands[k] for k in keep)]
    return len(operands) - len(keep)


def _inlinable(branch: Graph, index: int) -> bool:
    """Whether the branch's input `index` may become a constant: not a branch output, not
    written in place and not passed to a nested subgraph."""
    if index in branch.outputs:
        return False
    for reader in branch.nodes:
        if index not in reader.inputs:
            continue
        if reader.op in SUBGRAPH_ATTRIBUTES:
            return False
        written = WRITTEN_INPUTS.get(reader.op, ())
        if any(k < len(reader.inputs) and reader.inputs[k] == index for k in written):
            return False
    return True
