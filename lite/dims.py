"""Dynamic dimensions: the sizes a graph is probed at, and names carried to inner tensors.

A graph whose inputs have dynamic dimensions (-1, optionally named as ONNX's dim_param) is
planned for concrete sizes. When no size is given, each dynamic dimension takes a probe
size: a batch-like one (axis 0, or named like a batch) 1, any other one of a few families of
sizes (the first under which the graph plans). The converter and the shape-inference pass
look at the graph under two probes: the second gives batch-like dimensions 2 and each other
distinct named dimension its own size (192, 256, ...), so a size that differs between the
two depends on an input dimension, and one that follows a named input dimension under both
takes its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from sporenet.lite.graph import DYNAMIC, Model

BATCH_PROBES = (1, 2, 1)
"""A batch-like dimension (axis 0, or named like a batch): its size under probe 0, under
probe 1, and the step probe 1 adds for each further distinct named one."""
SIZE_FAMILIES = ((128, 192, 64), (48, 56, 8), (64, 96, 32), (32, 40, 8), (256, 320, 64))
"""Any other dynamic dimension, the same way. A graph that cannot be planned under the
first family is tried under the next: a detector that downsamples by 64 plans under the
first, a text-line recognizer whose height must stay near 48 under the second."""
FIXED_BATCH = (1, 1, 0)
"""Batch-like dimensions held at 1 under both probes: for an exporter that declared a
batch dynamic but traced a reshape at batch 1, after every family failed with it varied."""
PROBE_FAMILIES = tuple((BATCH_PROBES, f) for f in SIZE_FAMILIES) + tuple(
    (FIXED_BATCH, f) for f in SIZE_FAMILIES
)
"""The probe families in the order they are tried: (batch-like sizes, other sizes)."""
SMALLEST_FIRST = tuple(
    sorted(range(len(PROBE_FAMILIES)), key=lambda k: (PROBE_FAMILIES[k][1][0], k))
)
"""The families in the order the runtime tries them for a plan at no given size (its
load-time plan, probe 0): the smallest sizes the graph accepts, so the memory planned
and warmed for sizes nobody asked for stays small (attention over 128 positions holds
16 times the scores of 32); a call at other sizes plans for those."""

InputDims = tuple[tuple[int, ...], tuple[str, ...]]
"""An input's declared shape (-1: dynamic) and its dimension names ("" for none)."""


def _key(kind: int, name: str) -> tuple[str, int]:
    """All batch-like dimensions share one size (a train graph's labels and images agree);
    other dimensions that share a name share a size, unnamed ones one size between them."""
    return ("", kind) if kind == 0 or not name else (name, -1)


def _kind(axis: int, name: str) -> int:
    """0 for a batch-like dimension (axis 0, or named like a batch), 1 for any other."""
    return 0 if axis == 0 or "batch" in name.lower() else 1


def probe_shapes(inputs: Sequence[InputDims], probe: int, family: int = 0) -> list[tuple[int, ...]]:
    """The concrete shape of each input under probe 0 or 1 of a size family (static dims
    unchanged)."""
    sizes: dict[tuple[str, int], int] = {}
    counts = [0, 0]  # distinct batch-like and other dimensions seen so far
    # A name is one size wherever it occurs: one an input holds off axis 0 (a graph
    # model's [2, num_edges] edge list) is not batch-like where another holds it first.
    other = {
        name
        for shape, names in inputs
        for axis, (d, name) in enumerate(zip(shape, names or ("",) * len(shape), strict=True))
        if d == DYNAMIC and name and _kind(axis, name) == 1
    }
    shapes = []
    for shape, names in inputs:
        names = names or ("",) * len(shape)
        dims = []
        for axis, (d, name) in enumerate(zip(shape, names, strict=True)):
            if d != DYNAMIC:
                dims.append(d)
                continue
            kind = 1 if name in other else _kind(axis, name)
            key = _key(kind, name)
            if key not in sizes:
                first, second, step = PROBE_FAMILIES[family][kind]
                sizes[key] = first if probe == 0 else second + step * counts[kind]
                counts[kind] += 1
            dims.append(sizes[key])
        shapes.append(tuple(dims))
    return shapes


def is_dynamic(inputs: Sequence[InputDims]) -> bool:
    return any(DYNAMIC in shape for shape, _ in inputs)


def graph_input_dims(model: Model, graph_index: int) -> list[InputDims]:
    """Declared shape and dimension names of each input of a graph, in order."""
    return [
        (tuple(model.tensors[i].shape), tuple(model.tensors[i].dim_names))
        for i in model.graphs[graph_index].inputs
    ]


def default_shapes(model: Model, graph_index: int, family: int = 0) -> dict[int, tuple[int, ...]]:
    """Input tensor -> the shape it is planned at when none is given (probe 0)."""
    inputs = model.graphs[graph_index].inputs
    shapes = probe_shapes(graph_input_dims(model, graph_index), 0, family)
    return dict(zip(inputs, shapes, strict=True))


def inner_dim_names(
    first: tuple[int, ...],
    second: tuple[int, ...],
    named: dict[tuple[int, int], str],
) -> tuple[str, ...]:
    """Names for a tensor's dimensions from its sizes under the two probes: a dimension that
    equals a named input dimension under both takes its name. `named` maps (probe-0 size,
    probe-1 size) pairs of named input dimensions to their names."""
    if len(first) != len(second):
        return ()
    names = tuple(
        named.get((a, b), "") if a != b else "" for a, b in zip(first, second, strict=True)
    )
    return names if any(names) else ()


def named_pairs(inputs: Sequence[InputDims], family: int = 0) -> dict[tuple[int, int], str]:
    """(probe-0 size, probe-1 size) -> name, for the named dynamic input dimensions."""
    shapes = [probe_shapes(inputs, k, family) for k in (0, 1)]
    pairs: dict[tuple[int, int], str] = {}
    for position, (shape, names) in enumerate(inputs):
        for axis, name in enumerate(names or ()):
            if name and shape[axis] == DYNAMIC:
                pair = (shapes[0][position][axis], shapes[1][position][axis])
                if pair[0] != pair[1]:
                    pairs.setdefault(pair, name)
    return pairs


MAX_VALUE_INPUT = 64
"""Most elements a graph input may have to be read as a shape-like value when planning."""


def may_feed_shapes(shape: Sequence[int]) -> bool:
    """Whether a graph input of this declared shape can be a shape-like value (a target
    shape, sizes, axes, `k`, a Range bound) that the planner needs: a scalar or a short
    vector of static length."""
    return (
        len(shape) <= 1 and DYNAMIC not in shape and (not shape or 0 <= shape[0] <= MAX_VALUE_INPUT)
    )


def value_input_candidates(model: Model, graph_index: int) -> list[int]:
    """Graph inputs whose values the planner reads when a plan without them fails."""
    return [i for i in model.graphs[graph_index].inputs if may_feed_shapes(model.tensors[i].shape)]


def batch_names(shape: Sequence[int], names: Sequence[str] = ()) -> tuple[str, ...]:
    """Dimension names for the input of a subgraph built from a traced graph: its unnamed
    dynamic dimensions follow the batch, so one name ("batch") makes shape inference probe
    them all with one size (as the node that runs the subgraph feeds them)."""
    names = tuple(names) or ("",) * len(shape)
    return tuple(n or ("batch" if d == -1 else "") for n, d in zip(names, shape, strict=True))
