"""ai.onnx.ml tree ensembles -> TREE_ENSEMBLE: TreeEnsembleRegressor, TreeEnsembleClassifier
(node lists keyed by tree and node id) and TreeEnsemble (ai.onnx.ml opset 5: node arrays
with separate leaves and set membership). Both become one flat node table whose children
are row indices, and a dense leaf-weight matrix."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import ml_common as mc
from sporenet.lite.kernels.ml.tree_ensemble import NodeMode
from sporenet.lite.ops import OpCode

_MODES = {
    "BRANCH_LEQ": NodeMode.LEQ,
    "BRANCH_LT": NodeMode.LT,
    "BRANCH_GTE": NodeMode.GTE,
    "BRANCH_GT": NodeMode.GT,
    "BRANCH_EQ": NodeMode.EQ,
    "BRANCH_NEQ": NodeMode.NEQ,
    "LEAF": NodeMode.LEAF,
}
# TreeEnsemble (opset 5) codes its modes, aggregates and transforms as integers.
_MODES_V5 = [NodeMode.LEQ, NodeMode.LT, NodeMode.GTE, NodeMode.GT, NodeMode.EQ, NodeMode.NEQ]
_AGGREGATES_V5 = ["AVERAGE", "SUM", "MIN", "MAX"]
_TRANSFORMS_V5 = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]


class _Table:
    """The flat node table being built (rows = nodes, leaves included). Stored narrowed
    (`_narrow_index`, `_narrow_threshold`): node mode codes as uint8, row indices as int32."""

    def __init__(self, n: int) -> None:
        self.feature = np.zeros(n, np.int64)
        self.threshold = np.zeros(n, np.float64)
        self.mode = np.zeros(n, np.uint8)
        rows = np.int32 if n < 2**31 else np.int64
        self.true = np.zeros(n, rows)
        self.false = np.zeros(n, rows)
        self.missing = np.zeros(n, np.bool_)


def _narrow_index(values: np.ndarray) -> np.ndarray:
    """Integer indices in the narrowest of int16 / int32 / int64 that holds them all."""
    if values.size == 0:
        return values.astype(np.int16)
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype)
    return values.astype(np.int64)


def _narrow_threshold(values: np.ndarray) -> np.ndarray:
    """Thresholds as float32 when every one is a float32 (a model's float attributes
    always are; a double tensor's only if each value round-trips), else float64. The
    kernel compares in float64 either way, so the routing is the same bit for bit."""
    narrow = values.astype(np.float32)
    exact = np.array_equal(narrow.astype(np.float64), values, equal_nan=True)
    return narrow if exact else values


def _missing_tracks_true(node: OnnxNode, n: int) -> np.ndarray:
    """nodes_missing_value_tracks_true for the first n nodes (absent or empty: none)."""
    missing = node.attrs.get("nodes_missing_value_tracks_true")
    if missing is None or len(missing) == 0:
        return np.zeros(n, bool)
    return np.asarray(missing, bool)[:n]


def _check_targets(target: np.ndarray, n_targets: int, node: OnnxNode) -> None:
    if ((target < 0) | (target >= n_targets)).any():
        raise node.fail(f"a weight names a target or class outside [0, {n_targets})")


def _weights(
    n_rows: int,
    n_targets: int,
    rows: ArrayLike,
    targets: ArrayLike,
    values: ArrayLike,
    node: OnnxNode,
) -> np.ndarray:
    """Dense [rows, targets] weights, summed where entries repeat, NaN where none."""
    row, target = np.asarray(rows, np.int64), np.asarray(targets, np.int64)
    _check_targets(target, n_targets, node)
    total = np.zeros((n_rows, n_targets))
    has = np.zeros((n_rows, n_targets), bool)
    np.add.at(total, (row, target), np.asarray(values, np.float64))
    has[row, target] = True
    total[~has] = np.nan
    return total


def _legacy_table(
    ctx: ImportContext, node: OnnxNode, prefix: str, n_targets: int
) -> tuple[_Table, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node table, roots and leaf weights of TreeEnsembleRegressor/Classifier attributes."""
    tree_ids = np.asarray(node.attrs.get("nodes_treeids", []), np.int64)
    node_ids = np.asarray(node.attrs.get("nodes_nodeids", []), np.int64)
    n = tree_ids.size
    modes = node.attr("nodes_modes", [])
    values = mc.floats(ctx, node, "nodes_values")
    fields = {
        "nodes_nodeids": node_ids.size,
        "nodes_featureids": len(node.attrs.get("nodes_featureids", [])),
        "nodes_modes": len(modes),
        "nodes_truenodeids": len(node.attrs.get("nodes_truenodeids", [])),
        "nodes_falsenodeids": len(node.attrs.get("nodes_falsenodeids", [])),
        "nodes_values": 0 if values is None else values.size,
    }
    if n == 0 or any(size != n for size in fields.values()):
        raise node.fail(
            f"the node attributes must all hold {n} entries (nodes_treeids), got {fields}"
        )
    row = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(tree_ids, node_ids, strict=True))}
    if len(row) != n:
        raise node.fail("two nodes share one (tree id, node id)")
    table = _Table(n)
    table.feature[:] = node.attrs["nodes_featureids"]
    table.threshold[:] = values
    try:
        table.mode[:] = [_MODES[m] for m in modes]
    except KeyError as exc:
        raise node.fail(f"unknown node mode {exc.args[0]!r}; expected {sorted(_MODES)}") from None
    table.missing[:] = _missing_tracks_true(node, n)
    leaf = table.mode == NodeMode.LEAF
    # A leaf's weight row: leaves numbered in table order (interior nodes have none).
    weight_row = np.cumsum(leaf) - 1
    children: set[int] = set()
    for k, (t, true_id, false_id) in enumerate(
        zip(
            tree_ids,
            node.attrs["nodes_truenodeids"],
            node.attrs["nodes_falsenodeids"],
            strict=True,
        )
    ):
        if leaf[k]:
            table.true[k] = weight_row[k]
            continue
        try:
            table.true[k], table.false[k] = (
                row[(int(t), int(true_id))],
                row[(int(t), int(false_id))],
            )
        except KeyError as exc:
            raise node.fail(
                f"node {k} points at node {exc.args[0]}, which does not exist"
            ) from None
        children.update((int(table.true[k]), int(table.false[k])))
    roots = np.asarray([k for k in range(n) if k not in children], np.int64)
    w_tree = node.attrs.get(f"{prefix}_treeids", [])
    w_node = node.attrs.get(f"{prefix}_nodeids", [])
    w_id = node.attrs.get(f"{prefix}_ids", [])
    w_value = mc.floats(ctx, node, f"{prefix}_weights")
    w_value = np.zeros(0) if w_value is None else w_value
    if not len(w_tree) == len(w_node) == len(w_id) == w_value.size:
        raise node.fail(f"the {prefix}_* attributes must have one length")
    try:
        w_rows = [row[(int(t), int(i))] for t, i in zip(w_tree, w_node, strict=True)]
    except KeyError as exc:
        raise node.fail(f"a weight names node {exc.args[0]}, which does not exist") from None
    # Weights on interior nodes are never read (no walk ends there): dropped.
    on_leaf = leaf[np.asarray(w_rows, np.int64)]
    _check_targets(np.asarray(w_id, np.int64), n_targets, node)
    rows = weight_row[np.asarray(w_rows, np.int64)][on_leaf]
    targets = np.asarray(w_id, np.int64)[on_leaf]
    weights = _weights(int(leaf.sum()), n_targets, rows, targets, w_value[on_leaf], node)
    return table, roots, weights, np.asarray(w_id, np.int64), w_value


def _emit(
    ctx: ImportContext,
    node: OnnxNode,
    table: _Table,
    roots: np.ndarray,
    weights: np.ndarray,
    base: np.ndarray,
    members: np.ndarray | None,
    **attrs: Any,
) -> list[int]:
    """One TREE_ENSEMBLE over the node table. Leaf weights are stored as float32: the
    kernel sums them in float32 and takes MIN/MAX before rounding to float32, which
    rounding first does not change (it is monotone), so the scores are the same."""
    name = node.name
    inputs = [mc.as_matrix(ctx, node.input(0))]
    for part, value in (
        ("feature", _narrow_index(table.feature)),
        ("threshold", _narrow_threshold(table.threshold)),
        ("mode", table.mode),
        ("true", table.true),
        ("false", table.false),
        ("missing_true", table.missing),
        ("roots", _narrow_index(roots)),
        ("leaf_weights", weights.astype(np.float32)),
        ("base_values", base),
    ):
        inputs.append(ctx.constant(f"{name}/{part}", value))
    if members is not None:
        inputs.append(ctx.constant(f"{name}/member_sets", members))
    outputs = 2 if attrs.get("classifier") else 1
    return ctx.emit(OpCode.TREE_ENSEMBLE, inputs, num_outputs=outputs, **attrs)


def tree_ensemble_regressor(ctx: ImportContext, node: OnnxNode) -> list[int]:
    n_targets = int(node.attr("n_targets", 1))
    table, roots, weights, _, _ = _legacy_table(ctx, node, "target", n_targets)
    base = mc.floats(ctx, node, "base_values")
    return _emit(
        ctx,
        node,
        table,
        roots,
        weights,
        np.zeros(0) if base is None else base,
        None,
        aggregate=node.attr("aggregate_function", "SUM"),
        post_transform=node.attr("post_transform", "NONE"),
    )


def tree_ensemble_classifier(ctx: ImportContext, node: OnnxNode) -> list[int]:
    labels = mc.class_labels(node)
    table, roots, weights, ids, values = _legacy_table(ctx, node, "class", labels.size)
    base = mc.floats(ctx, node, "base_values")
    mask = 0
    for k in np.unique(ids):
        mask |= 1 << int(k)
    index, scores = _emit(
        ctx,
        node,
        table,
        roots,
        weights,
        np.zeros(0) if base is None else base,
        None,
        aggregate="SUM",
        post_transform=node.attr("post_transform", "NONE"),
        classifier=1,
        weighted_classes=mask,
        all_positive=int(bool((values >= 0).all())),
    )
    return [mc.label_output(ctx, node, index, labels), scores]


def tree_ensemble(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """TreeEnsemble (ai.onnx.ml opset 5): interior nodes are rows 0..n-1, leaves follow."""
    splits = mc.tensor_attr(ctx, node, "nodes_splits")
    modes = mc.tensor_attr(ctx, node, "nodes_modes")
    leaf_weights = mc.tensor_attr(ctx, node, "leaf_weights")
    if splits is None or modes is None or leaf_weights is None:
        raise node.fail("needs nodes_splits, nodes_modes and leaf_weights")
    n = splits.size
    true_ids = np.asarray(node.attrs.get("nodes_truenodeids", []), np.int64)
    false_ids = np.asarray(node.attrs.get("nodes_falsenodeids", []), np.int64)
    true_leaf = np.asarray(node.attrs.get("nodes_trueleafs", []), bool)
    false_leaf = np.asarray(node.attrs.get("nodes_falseleafs", []), bool)
    features = np.asarray(node.attrs.get("nodes_featureids", []), np.int64)
    targets = np.asarray(node.attrs.get("leaf_targetids", []), np.int64)
    if not all(a.size == n for a in (true_ids, false_ids, true_leaf, false_leaf, features)):
        raise node.fail(f"every nodes_* attribute must hold {n} entries (nodes_splits)")
    leaves = leaf_weights.size
    if targets.size != leaves:
        raise node.fail("leaf_targetids and leaf_weights must have one length")
    table = _Table(n + leaves)
    table.feature[:n] = features
    table.threshold[:n] = splits.astype(np.float64)
    codes = modes.astype(np.int64).ravel()
    if ((codes < 0) | (codes > 6)).any():
        raise node.fail("nodes_modes codes must lie in 0..6")
    table.mode[:n] = [NodeMode.MEMBER if c == 6 else _MODES_V5[c] for c in codes]
    table.mode[n:] = NodeMode.LEAF
    table.true[:n] = np.where(true_leaf, n + true_ids, true_ids)
    table.false[:n] = np.where(false_leaf, n + false_ids, false_ids)
    table.true[n:] = np.arange(leaves)
    table.missing[:n] = _missing_tracks_true(node, n)
    members = None
    if (codes == 6).any():
        flat = mc.tensor_attr(ctx, node, "membership_values")
        if flat is None:
            raise node.fail("BRANCH_MEMBER nodes need membership_values")
        sets = np.split(flat.astype(np.float64), np.flatnonzero(np.isnan(flat)) + 1)
        sets = [s[~np.isnan(s)] for s in sets][: int((codes == 6).sum())]
        width = max((s.size for s in sets), default=1) or 1
        members = np.full((n + leaves, width), np.nan)
        for row, values in zip(np.flatnonzero(codes == 6), sets, strict=False):
            members[row, : values.size] = values
    n_targets = int(node.attr("n_targets", 1))
    weights = _weights(leaves, n_targets, np.arange(leaves), targets, leaf_weights, node)
    roots = np.asarray(node.attrs.get("tree_roots", []), np.int64)
    aggregate = int(node.attr("aggregate_function", 1))
    transform = int(node.attr("post_transform", 0))
    if not 0 <= aggregate < 4 or not 0 <= transform < 5:
        raise node.fail(f"aggregate_function {aggregate} or post_transform {transform} unknown")
    (scores,) = _emit(
        ctx,
        node,
        table,
        roots,
        np.nan_to_num(weights, nan=np.nan),
        np.zeros(0),
        members,
        aggregate=_AGGREGATES_V5[aggregate],
        post_transform=_TRANSFORMS_V5[transform],
    )
    dtype = ctx.dtype(node.input(0))
    if dtype != np.float32:
        scores = ctx.emit1(OpCode.CAST, [scores], to=str(dtype))
    return [scores]
