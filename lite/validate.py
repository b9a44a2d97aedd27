"""Structural validation of an in-memory model: indices, dtypes, shapes, acyclicity.

Run on every parsed file and before every write. Per-op shape checks happen later, when
the planner prepares each kernel.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import lowp, sparse
from sporenet.lite.dtypes import STRING
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.graph import Graph, Model, Node, Quantization, Tensor
from sporenet.lite.ops import OpCode


def _check_index(index: int, count: int, what: str, *, optional: bool = False) -> None:
    if optional and index == -1:
        return
    if not 0 <= index < count:
        raise ModelFormatError(f"{what}: tensor index {index} out of range (0..{count - 1})")


def _check_graph(model: Model, gi: int, graph: Graph, max_versions: dict[int, int]) -> None:
    n = len(model.tensors)
    where = f"graph {gi} ({graph.name!r})"
    available = {i for i, t in enumerate(model.tensors) if t.data is not None}
    for i in graph.inputs:
        _check_index(i, n, f"{where} input")
        if model.tensors[i].data is not None:
            raise ModelFormatError(f"{where}: input tensor {model.tensors[i].name!r} is a constant")
        available.add(i)
    producer: dict[int, int] = {}
    for j, node in enumerate(graph.nodes):
        what = f"{where} node {j} ({node.op.name})"
        supported = max_versions.get(int(node.op), 1)
        if not 1 <= node.version <= supported:
            raise ModelFormatError(
                f"{what}: op version {node.version} is not supported "
                f"(this runtime has 1..{supported})"
            )
        for i in node.outputs:
            _check_index(i, n, f"{what} output")
            if i in producer or i in available:
                first = f"node {producer[i]}" if i in producer else "a graph input or constant"
                raise ModelFormatError(
                    f"{what}: output tensor {model.tensors[i].name!r} is already defined by {first}"
                )
            producer[i] = j
    for j, node in enumerate(graph.nodes):
        what = f"{where} node {j} ({node.op.name})"
        for i in node.inputs:
            _check_index(i, n, f"{what} input", optional=True)
            if i != -1 and i not in available:
                if i in producer:
                    kind = "a cycle" if producer[i] >= j else "an ordering error"
                    raise ModelFormatError(
                        f"{what}: input {model.tensors[i].name!r} is produced by node "
                        f"{producer[i]}, which does not come before it ({kind})"
                    )
                raise ModelFormatError(
                    f"{what}: input {model.tensors[i].name!r} is never produced, not a graph "
                    "input and not a constant"
                )
        available.update(node.outputs)
    for i in graph.outputs:
        _check_index(i, n, f"{where} output")
        if i not in available:
            raise ModelFormatError(f"{where}: output {model.tensors[i].name!r} is never produced")


# Zero points must lie in the quantized dtype's range; other dtypes (float tensors that
# only carry calibration ranges, int32 biases) take any int32 zero point.
_ZERO_POINT_RANGES = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int16): (-32768, 32767),
}
_INT32 = (-(1 << 31), (1 << 31) - 1)


def _check_quantization(index: int, t: Tensor, q: Quantization) -> None:
    """Scales finite and > 0, zero points in the dtype's range, per-axis parameters as
    many as the axis is long."""
    what = f"tensor {index} ({t.name!r})"
    scale, zp = np.asarray(q.scale), np.asarray(q.zero_point)
    channels = scale.size
    if channels == 0:  # only a calibration range (min/max), no affine parameters
        if zp.size:
            raise ModelFormatError(f"{what}: {zp.size} zero points but no scale")
        return
    if not np.isfinite(scale).all() or (scale <= 0).any():
        bad = scale[~(np.isfinite(scale) & (scale > 0))][0]
        raise ModelFormatError(
            f"{what}: quantization scales must be finite and > 0, found {float(bad)!r}"
        )
    if zp.size not in (channels, 0):
        raise ModelFormatError(f"{what}: {channels} scales but {zp.size} zero points")
    lo, hi = _ZERO_POINT_RANGES.get(np.dtype(t.dtype), _INT32)
    points = zp.tolist() if zp.ndim else [zp.item()]  # Python ints: no integer reductions
    if points and (min(points) < lo or max(points) > hi):
        bad = zp[(zp < lo) | (zp > hi)][0]
        raise ModelFormatError(
            f"{what}: zero point {int(bad)} is outside the {t.dtype} range [{lo}, {hi}]"
        )
    axis = q.axis
    if channels > 1:
        if not 0 <= axis < len(t.shape):
            raise ModelFormatError(
                f"{what}: quantization axis {axis} is out of range for shape {list(t.shape)}"
            )
        if t.shape[axis] not in (channels, -1):
            raise ModelFormatError(
                f"{what}: {channels} per-axis scales do not match axis "
                f"{axis} of shape {list(t.shape)} (size {t.shape[axis]})"
            )
    elif axis < 0 or (len(t.shape) and axis >= max(len(t.shape), 1)):
        raise ModelFormatError(
            f"{what}: quantization axis {axis} is out of range for shape {list(t.shape)}"
        )


MAX_SUBGRAPH_DEPTH = 64
"""Deepest nesting of control-flow subgraphs a file may declare (each level is one planner
recursion)."""


def _subgraph_refs(model: Model, gi: int, j: int, node: Node) -> list[int]:
    """The graph indices node j of graph gi names, checked against the node's signature."""
    from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES

    what = f"graph {gi} node {j} ({node.op.name})"
    entries = {0} | {sig.graph for sig in model.signatures.values()}
    refs = []
    for name in SUBGRAPH_ATTRIBUTES[node.op]:
        value = node.attrs.get(name, -1 if name == "grad_graph" else None)  # optional
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelFormatError(
                f"{what}: attribute {name!r} must be a graph index, found {value!r}"
            )
        if value == -1 and (node.op == OpCode.IF or name == "grad_graph"):
            continue  # a branch that cannot run at the planned shapes (the kernel says why)
        if not 0 <= value < len(model.graphs):
            raise ModelFormatError(
                f"{what}: {name} {value} out of range (the model has {len(model.graphs)} graphs)"
            )
        if value in entries:
            raise ModelFormatError(f"{what}: {name} {value} is an entry graph, not a subgraph")
        refs.append(value)
    if not refs:
        raise ModelFormatError(f"{what}: names no subgraph")
    dtype: list[np.dtype | None] = [
        model.tensors[i].dtype if i != -1 else None for i in node.inputs
    ]
    out_dtype: list[np.dtype | None] = [model.tensors[i].dtype for i in node.outputs]
    expected_in: list[np.dtype | None]
    expected_out: list[np.dtype | None]
    if node.op == OpCode.IF:
        expected_in, expected_out = dtype[1:], out_dtype
    elif node.op == OpCode.CALL:
        expected_in, expected_out = dtype, out_dtype
    else:
        carried = node.attrs.get("num_carried")
        if (
            not isinstance(carried, int)
            or not 0 <= carried <= len(node.inputs) - 2
            or (carried > len(node.outputs))
        ):
            raise ModelFormatError(
                f"{what}: num_carried {carried!r} does not fit "
                f"{len(node.inputs)} inputs and {len(node.outputs)} outputs"
            )
        expected_in = [np.dtype(np.int64), np.dtype(np.bool_), *dtype[2:]]
        expected_out = [
            np.dtype(np.bool_),
            *out_dtype[:carried],
            *([None] * (len(node.outputs) - carried)),
        ]
    named = [n for n in SUBGRAPH_ATTRIBUTES[node.op] if node.attrs.get(n, -1) != -1]
    for name, gj in zip(named, refs, strict=True):
        if name == "grad_graph":  # (inputs, outputs, output gradients) -> input gradients
            expected_in, expected_out = [*dtype, *out_dtype, *out_dtype], list(dtype)
        sub = model.graphs[gj]
        got_in = [model.tensors[i].dtype for i in sub.inputs]
        got_out = [model.tensors[i].dtype for i in sub.outputs]
        if len(got_in) != len(expected_in) or any(
            e is not None and e != g for e, g in zip(expected_in, got_in, strict=True)
        ):
            raise ModelFormatError(
                f"{what}: {name} {gj} takes inputs {[str(d) for d in got_in]}, "
                f"the node gives {[str(d) for d in expected_in]}"
            )
        if len(got_out) != len(expected_out) or any(
            e is not None and e != g for e, g in zip(expected_out, got_out, strict=True)
        ):
            raise ModelFormatError(
                f"{what}: {name} {gj} gives outputs "
                f"{[str(d) for d in got_out]}, the node expects "
                f"{[str(d) for d in expected_out]}"
            )
    return refs


def _check_subgraphs(model: Model) -> None:
    """Subgraph references in range, signatures consistent, no cycle, bounded nesting."""
    from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES

    edges: dict[int, set[int]] = {}
    for gi, graph in enumerate(model.graphs):
        for j, node in enumerate(graph.nodes):
            if node.op in SUBGRAPH_ATTRIBUTES:
                edges.setdefault(gi, set()).update(_subgraph_refs(model, gi, j, node))
    depth: dict[int, int] = {}
    on_path: list[int] = []

    def visit(gi: int) -> int:
        if gi in on_path:
            cycle = " -> ".join(map(str, [*on_path[on_path.index(gi) :], gi]))
            raise ModelFormatError(f"subgraph references form a cycle: graphs {cycle}")
        if gi not in depth:
            on_path.append(gi)
            if len(on_path) > MAX_SUBGRAPH_DEPTH:
                raise ModelFormatError(f"subgraphs nest deeper than {MAX_SUBGRAPH_DEPTH} levels")
            depth[gi] = 1 + max((visit(g) for g in sorted(edges.get(gi, ()))), default=0)
            on_path.pop()
        return depth[gi]

    for gi in sorted(edges):
        visit(gi)


def _check_strings(i: int, t: Tensor) -> None:
    """A STRING tensor holds str elements only and is never quantized, sparse or trained."""
    what = f"tensor {i} ({t.name!r})"
    if t.quantization is not None or t.sparsity is not None or t.trainable:
        raise ModelFormatError(f"{what}: a string tensor cannot be quantized, sparse or trainable")
    if t.data is not None:
        bad = next((v for v in t.data.flat if not isinstance(v, str)), None)
        if bad is not None:
            raise ModelFormatError(
                f"{what}: a string tensor holds only str, found {type(bad).__name__}"
            )


def _check_lowp(i: int, t: Tensor, kind: lowp.LowpType) -> None:
    """A low-precision tensor is never quantized, sparse or trained, and a 4- or 2-bit
    constant's bytes hold nothing above its width."""
    what = f"tensor {i} ({t.name!r})"
    if t.quantization is not None or t.sparsity is not None or t.trainable:
        raise ModelFormatError(
            f"{what}: a {kind.name} tensor cannot be quantized, sparse or trainable"
        )
    if t.data is not None and kind.bits < 8 and t.data.size:
        top = int(lowp.bit_patterns(t.data).max())
        if top >= 1 << kind.bits:
            raise ModelFormatError(
                f"{what}: a {kind.name} element must be below {1 << kind.bits}, found {top}"
            )


def validate(model: Model) -> Model:
    """Raise ModelFormatError naming the first structural problem of `model`; return it."""
    from sporenet.lite.kernels import max_op_versions

    for i, t in enumerate(model.tensors):
        if t.data is not None:
            if not isinstance(t.data, np.ndarray):
                raise ModelFormatError(f"tensor {t.name!r}: data is not a NumPy array")
            if t.data.dtype != t.dtype or tuple(t.data.shape) != tuple(t.shape):
                raise ModelFormatError(
                    f"tensor {i} ({t.name!r}): declared {t.dtype}{list(t.shape)} but its data "
                    f"is {t.data.dtype}{list(t.data.shape)}"
                )
        if t.dtype == STRING:
            _check_strings(i, t)
        kind = lowp.lowp_type(t.dtype)
        if kind is not None:
            _check_lowp(i, t, kind)
        sparse.check(t, i)
        if t.quantization is not None:
            _check_quantization(i, t, t.quantization)
    versions = max_op_versions()
    for gi, graph in enumerate(model.graphs):
        _check_graph(model, gi, graph, versions)
    for key, sig in model.signatures.items():
        if not 0 <= sig.graph < len(model.graphs):
            raise ModelFormatError(
                f"signature {key!r}: graph {sig.graph} out of range (the model has "
                f"{len(model.graphs)})"
            )
        graph = model.graphs[sig.graph]
        for name, i in sig.inputs.items():
            if i not in graph.inputs:
                raise ModelFormatError(
                    f"signature {key!r}: input {name!r} (tensor {i}) is not an input of graph "
                    f"{sig.graph}"
                )
        for name, i in sig.outputs.items():
            if i not in graph.outputs:
                raise ModelFormatError(
                    f"signature {key!r}: output {name!r} (tensor {i}) is not an output of graph "
                    f"{sig.graph}"
                )
    _check_subgraphs(model)
    return model
