"""TREE_ENSEMBLE's vectorized walk against a node-by-node walk in Python, on random
forests of uneven depth with every comparison mode, NaN inputs and missing-value routing."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.ml.tree_ensemble import (
    _COMPARE,
    NodeMode,
    TreeEnsemble,
    _float32_threshold,
)


def _forest(rng: np.random.Generator, trees: int, features: int, modes: list[NodeMode]):
    """Random trees grown by splitting random leaves: (tables, roots)."""
    feature, threshold, mode, true, false, missing = [], [], [], [], [], []
    roots = []
    for _ in range(trees):
        roots.append(len(feature))
        open_leaves = [len(feature)]
        for table in (feature, threshold, mode, true, false, missing):
            table.append(0)
        mode[-1] = NodeMode.LEAF
        for _ in range(int(rng.integers(0, 12))):
            node = open_leaves.pop(int(rng.integers(len(open_leaves))))
            kids = [len(feature), len(feature) + 1]
            for _ in kids:
                for table in (feature, threshold, mode, true, false, missing):
                    table.append(0)
                mode[-1] = NodeMode.LEAF
            feature[node] = int(rng.integers(features))
            threshold[node] = float(rng.choice([-0.5, 0.0, 0.3, 1.0]))
            mode[node] = modes[int(rng.integers(len(modes)))]
            true[node], false[node] = kids
            missing[node] = bool(rng.integers(2))
            open_leaves += kids
    leaves = [i for i, m in enumerate(mode) if m == NodeMode.LEAF]
    for row, i in enumerate(leaves):
        true[i] = row
    tables = [
        np.array(feature, np.int64),
        np.array(threshold, np.float64),
        np.array([int(m) for m in mode], np.int64),
        np.array(true, np.int64),
        np.array(false, np.int64),
        np.array(missing, np.bool_),
        np.array(roots, np.int64),
        rng.standard_normal((len(leaves), 1)),
        np.zeros(1),
    ]
    return tables


def _walk(tables, x: np.ndarray) -> np.ndarray:
    feature, threshold, mode, true, false, missing, roots = tables[:7]
    out = np.empty((x.shape[0], roots.size), np.int64)
    for s, row in enumerate(x):
        for t, node in enumerate(roots):
            while mode[node] != NodeMode.LEAF:
                v = row[feature[node]]
                go = bool(_COMPARE[NodeMode(int(mode[node]))](v, threshold[node]))
                go |= bool(missing[node] and np.isnan(v))
                node = true[node] if go else false[node]
            out[s, t] = node
    return out


@pytest.mark.parametrize("route", ["paths", "table", "walk"])
@pytest.mark.parametrize("modes", [[NodeMode.LEQ], [NodeMode.LT, NodeMode.GTE, NodeMode.EQ]])
def test_vectorized_walk_reaches_the_leaves_a_node_by_node_walk_reaches(modes, route, monkeypatch):
    # Every route: the level-by-level walk, the transition table and the path matrix
    # (the last two for one mode only).
    monkeypatch.setattr(TreeEnsemble, "use_table", lambda self, batch: route == "table")
    monkeypatch.setattr(TreeEnsemble, "use_paths", lambda self, batch: route == "paths")
    rng = np.random.default_rng(len(modes))
    # The path matrix holds small forests only (PATH_ELEMENTS).
    tables = _forest(rng, trees=6 if route == "paths" else 40, features=5, modes=modes)
    x = rng.choice([-1.0, -0.5, 0.0, 0.3, 0.7, 1.0, 2.0, np.nan], size=(64, 5)).astype(np.float32)
    specs = [TensorSpec(x.shape, np.dtype(np.float32))]
    specs += [TensorSpec(t.shape, t.dtype, t) for t in tables]
    kernel = TreeEnsemble(Attrs("TREE_ENSEMBLE", {}), specs)
    assert np.array_equal(kernel.leaves(x), _walk(tables, x.astype(np.float64)))
    assert route != "paths" or len(modes) > 1 or kernel.paths is not None


@pytest.mark.parametrize("mode", [NodeMode.LEQ, NodeMode.GT, NodeMode.NEQ])
def test_transition_table_on_one_sample_and_on_many(mode):
    rng = np.random.default_rng(int(mode))
    tables = _forest(rng, trees=7, features=3, modes=[mode])

    def specs_for(x: np.ndarray) -> list[TensorSpec]:
        return [TensorSpec(x.shape, np.dtype(np.float32))] + [
            TensorSpec(t.shape, t.dtype, t) for t in tables
        ]

    for rows in (1, 3, 500):
        x = rng.choice([-1.0, 0.0, 0.3, 1.0, np.nan], size=(rows, 3)).astype(np.float32)
        kernel = TreeEnsemble(Attrs("TREE_ENSEMBLE", {}), specs_for(x))
        assert np.array_equal(kernel.leaves(x), _walk(tables, x.astype(np.float64)))
        assert np.array_equal(kernel.leaves(x), kernel.leaves(x))  # the table is reused


@pytest.mark.parametrize("mode", [m for m in NodeMode if m not in (NodeMode.LEAF, NodeMode.MEMBER)])
def test_float32_thresholds_route_float32_inputs_as_float64_ones(mode):
    rng = np.random.default_rng(int(mode))
    near = rng.standard_normal(200).astype(np.float32)
    threshold = np.concatenate(
        [
            near.astype(np.float64),  # exact in float32
            near.astype(np.float64) * (1 + 1e-9),  # between two float32 values
            [1e300, -1e300, np.inf, -np.inf, np.nan, 3.4028235e38, 1e-320],
        ]
    )
    x = np.concatenate([near, np.nextafter(near, np.float32(np.inf)), [np.inf, -np.inf, np.nan]])
    x = np.concatenate([x, np.finfo(np.float32).max[None], np.float32(0)[None]]).astype(np.float32)
    compare = _COMPARE[mode]
    t32 = _float32_threshold(threshold, mode)
    assert t32.dtype == np.float32
    want = compare(x[:, None].astype(np.float64), threshold[None, :])
    assert np.array_equal(compare(x[:, None], t32[None, :]), want)


def _single_tree(rng: np.random.Generator, targets: int) -> list[np.ndarray]:
    """One random tree (LEQ only) with `targets` weights per leaf."""
    tables = _forest(rng, trees=1, features=3, modes=[NodeMode.LEQ])
    while tables[2].size < 7:  # at least three branch nodes
        tables = _forest(rng, trees=1, features=3, modes=[NodeMode.LEQ])
    leaves = int(np.count_nonzero(tables[2] == NodeMode.LEAF))
    tables[7] = rng.standard_normal((leaves, targets))
    return tables


@pytest.mark.parametrize(
    ("classifier", "targets", "transform", "base"),
    [
        (1, 2, "NONE", 0),
        (1, 2, "LOGISTIC", 2),
        (1, 3, "SOFTMAX", 3),
        (0, 1, "NONE", 1),
        (0, 2, "NONE", 0),
    ],
)
def test_single_tree_outputs_by_path_equal_a_full_evaluation(
    classifier, targets, transform, base, monkeypatch
):
    # A single tree's outputs gathered per path against the same kernel evaluating
    # scores and post transform for every call (the path matrix turned off).
    rng = np.random.default_rng(targets + 10 * classifier)
    tables = _single_tree(rng, targets)
    tables[8] = rng.standard_normal(base)
    x = rng.choice([-1.0, -0.5, 0.0, 0.3, 0.7, 1.0, np.nan], size=(9, 3)).astype(np.float32)
    specs = [TensorSpec(x.shape, np.dtype(np.float32))]
    specs += [TensorSpec(t.shape, t.dtype, t) for t in tables]
    attrs = Attrs("TREE_ENSEMBLE", {"classifier": classifier, "post_transform": transform})

    def run(paths: bool) -> list[np.ndarray]:
        monkeypatch.setattr(TreeEnsemble, "use_paths", lambda self, batch: paths)
        kernel = TreeEnsemble(attrs, specs)
        outputs = [np.empty(s.shape, s.dtype) for s in kernel.output_specs]
        kernel.bind([x], outputs)()
        assert (kernel._path_outputs is not None) == paths  # the route under test ran
        return outputs

    for got, want in zip(run(True), run(False), strict=True):
        assert np.array_equal(got, want)


def test_path_matrix_serves_small_batches_and_leaves_huge_ones_to_the_walk():
    # The path matrix's temporaries grow with the batch (branch nodes plus paths per
    # sample); beyond the table's bound the level-by-level walk takes the call.
    rng = np.random.default_rng(3)
    tables = _single_tree(rng, 1)
    specs = [TensorSpec((5, 3), np.dtype(np.float32))]
    specs += [TensorSpec(t.shape, t.dtype, t) for t in tables]
    kernel = TreeEnsemble(Attrs("TREE_ENSEMBLE", {}), specs)
    x = rng.choice([-1.0, 0.0, 0.3, 1.0], size=(5, 3)).astype(np.float32)
    assert np.array_equal(kernel.leaves(x), _walk(tables, x.astype(np.float64)))
    assert kernel.paths is not None
    assert kernel.use_paths(5)
    assert not kernel.use_paths(10**7)
