"""TREE_ENSEMBLE's vectorized walk against a node-by-node walk in Python, on random
forests of uneven depth with every comparison mode, NaN inputs and missing-value routing."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.ml.tree_ensemble import _COMPARE, NodeMode, TreeEnsemble


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


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("modes", [[NodeMode.LEQ], [NodeMode.LT, NodeMode.GTE, NodeMode.EQ]])
def test_vectorized_walk_reaches_the_leaves_a_node_by_node_walk_reaches(modes, table, monkeypatch):
    # Both routes: the level-by-level walk and the transition table (one mode only).
    monkeypatch.setattr(TreeEnsemble, "use_table", lambda self, batch: table)
    rng = np.random.default_rng(len(modes))
    tables = _forest(rng, trees=40, features=5, modes=modes)
    x = rng.choice([-1.0, -0.5, 0.0, 0.3, 0.7, 1.0, 2.0, np.nan], size=(64, 5)).astype(np.float32)
    specs = [TensorSpec(x.shape, np.dtype(np.float32))]
    specs += [TensorSpec(t.shape, t.dtype, t) for t in tables]
    kernel = TreeEnsemble(Attrs("TREE_ENSEMBLE", {}), specs)
    assert np.array_equal(kernel.leaves(x), _walk(tables, x.astype(np.float64)))


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
