"""TREE_ENSEMBLE: a forest of decision trees (ai.onnx.ml TreeEnsembleRegressor,
TreeEnsembleClassifier and TreeEnsemble), evaluated for every sample and tree at once.

The trees are one flat node table (all trees' nodes, children as global row indices).
Every (sample, tree) pair starts at its tree's root; each step moves all pairs that are
not yet at a leaf one level down with NumPy gathers and comparisons, and drops those that
reached a leaf, so the work is the total path length and the Python loop runs once per
level of the deepest tree, never per node or per tree.

Small problems (a few samples, or few nodes against the paths walked) take a shorter
route with the same result: every branch node's test is evaluated for every sample at
once, which gives each (sample, node) its child as one transition table, and a level is
then a single gather through that table (see `TreeEnsemble._reached_by_table`). A call
is then a handful of array operations plus one per level, instead of nine per level.

Small forests (few root-to-leaf paths) take the shortest route: the branch tests of every
sample, as 0/1, times a path matrix (+1 where a path takes a node's true child, -1 where
it takes the false one) count the tests each path passes minus those it fails; the path
a sample takes scores its number of true turns and every other path of the tree less, so
one product and one argmax per tree find the leaves with no per-level step (see
`TreeEnsemble._reached_by_paths`). A single tree's outputs are then a function of its
path alone: they are computed once per path and a call gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import NamedTuple, cast

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.ml import post_transform as pt
from sporenet.lite.ops import OpCode


class NodeMode(IntEnum):
    """How a node routes a sample (the IR's nodes_mode codes)."""

    LEQ = 0
    LT = 1
    GTE = 2
    GT = 3
    EQ = 4
    NEQ = 5
    LEAF = 6
    MEMBER = 7


_COMPARE = {
    NodeMode.LEQ: np.less_equal,
    NodeMode.LT: np.less,
    NodeMode.GTE: np.greater_equal,
    NodeMode.GT: np.greater,
    NodeMode.EQ: np.equal,
    NodeMode.NEQ: np.not_equal,
}
AGGREGATES = ("SUM", "AVERAGE", "MIN", "MAX")
TABLE_ELEMENTS = 1 << 16
"""Transition tables of up to this many (sample, node) entries always serve the call;
larger ones when they hold fewer entries than twice the (sample, tree) pairs times the
depth (the elements the walk would visit)."""
PATH_ELEMENTS = 1 << 14
"""Path matrices (branch nodes times paths, trees padded to the widest) up to this size
serve calls whose product costs at most PATH_COST_FACTOR times the walk's elements."""
PATH_COST_FACTOR = 16


class TreeEnsemble(Kernel):
    """inputs: X, nodes_feature, nodes_threshold, nodes_mode, nodes_true, nodes_false,
    nodes_missing_true, roots, leaf_weights, base_values[, member_sets]. For a leaf,
    nodes_true holds its row of leaf_weights (NaN where the leaf gives a target nothing)."""

    op = OpCode.TREE_ENSEMBLE
    num_inputs = (10, 11)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype.kind not in "iuf" or x.rank not in (1, 2):
            raise self.fail(f"X must be a numeric [N, F] tensor, got {x.dtype}{list(x.shape)}")
        # The tables as stored (narrow integers, float32 thresholds and weights where
        # they fit): checked here, widened for the walk only when it first runs.
        feature = self.constant(1, "nodes_feature")
        threshold = self.constant(2, "nodes_threshold")
        mode = self.constant(3, "nodes_mode")
        true = self.constant(4, "nodes_true")
        false = self.constant(5, "nodes_false")
        missing = self.constant(6, "nodes_missing_true").astype(np.bool_, copy=False)
        roots = self.constant(7, "roots").astype(np.intp, copy=False)
        weights = self.constant(8, "leaf_weights")
        base = self.constant(9, "base_values").astype(np.float64).ravel()
        n = feature.size
        for what, table, kinds in (
            ("nodes_feature", feature, "iu"),
            ("nodes_threshold", threshold, "f"),
            ("nodes_mode", mode, "iu"),
            ("nodes_true", true, "iu"),
            ("nodes_false", false, "iu"),
            ("leaf_weights", weights, "f"),
        ):
            if table.dtype.kind not in kinds:
                expected = "an integer" if kinds == "iu" else "a float"
                raise self.fail(f"{what} must have {expected} dtype, got {table.dtype}")
        if any(a.shape != (n,) for a in (threshold, mode, true, false, missing)):
            raise self.fail(f"the node tables must all have shape [{n}]")
        if weights.ndim != 2:
            raise self.fail(f"leaf_weights must be [leaves, targets], got {list(weights.shape)}")
        if not np.isin(mode, list(NodeMode)).all():
            raise self.fail(f"nodes_mode holds codes outside {[int(m) for m in NodeMode]}")
        leaf = mode == NodeMode.LEAF
        features = x.shape[-1]
        branch = ~leaf
        if (feature[branch] < 0).any() or (feature[branch] >= features).any():
            raise self.fail(f"a node reads a feature outside [0, {features})")
        for what, child, bound in (("true", true, n), ("false", false, n)):
            if ((child[branch] < 0) | (child[branch] >= bound)).any():
                raise self.fail(f"a node's {what} child is outside the node table [0, {n})")
        if ((true[leaf] < 0) | (true[leaf] >= weights.shape[0])).any():
            raise self.fail(f"a leaf's weight row is outside [0, {weights.shape[0]})")
        if roots.size == 0 or (roots < 0).any() or (roots >= n).any():
            raise self.fail(f"roots must name rows of the node table [0, {n})")
        self.depth = _depth(roots, true, false, leaf, self.fail)
        members = self.optional_input(10)
        self.members = None if members is None else self.constant(10, "member_sets")
        if (mode == NodeMode.MEMBER).any() and self.members is None:
            raise self.fail("MEMBER nodes need the member_sets input")
        self.aggregate = attrs.str("aggregate", "SUM")
        if self.aggregate not in AGGREGATES:
            raise self.fail(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        self.transform = pt.parse(attrs.str("post_transform", "NONE"), self.fail)
        self.classifier = bool(attrs.int("classifier", 0))
        self.tables = (feature, threshold, mode, true, false, missing, leaf)
        self.roots = roots
        self.any_missing = bool(missing[branch].any())
        # The walk's tables are built when the kernel first walks: prepared only for its
        # output specs (by shape inference or the importer), it never holds them.
        self._walk_ready = False
        self.stored_weights = weights
        self.base = base
        self.modes = sorted({NodeMode(int(m)) for m in np.unique(mode[branch])})
        self.n_targets = weights.shape[1]
        batch = x.shape[0] if x.rank == 2 else 1
        if self.classifier:
            mask = attrs.int("weighted_classes", (1 << self.n_targets) - 1)
            self.weighted = np.array([(mask >> k) & 1 for k in range(self.n_targets)], bool)
            self.all_positive = bool(attrs.int("all_positive", 0))
            self.output_specs = [
                TensorSpec((batch,), np.dtype(np.int64)),
                TensorSpec((batch, self.n_targets), np.dtype(np.float32)),
            ]
        else:
            self.output_specs = [TensorSpec((batch, self.n_targets), np.dtype(np.float32))]

    def _ready(self) -> None:
        """Build the walk's tables on the first walk (see __init__)."""
        if not self._walk_ready:
            feature, threshold, mode, true, false, missing, leaf = self.tables
            self._prepare_walk(
                feature.astype(np.intp, copy=False),
                threshold.astype(np.float64, copy=False),
                mode.astype(np.int64, copy=False),
                true.astype(np.intp, copy=False),
                false.astype(np.intp, copy=False),
                missing,
                leaf,
            )
            self.weights = self.stored_weights.astype(np.float64, copy=False)
            self.sum_weights = np.nan_to_num(self.stored_weights, nan=0.0).astype(np.float32)
            self._walk_ready = True

    def _prepare_walk(
        self,
        feature: np.ndarray,
        threshold: np.ndarray,
        mode: np.ndarray,
        true: np.ndarray,
        false: np.ndarray,
        missing: np.ndarray,
        leaf: np.ndarray,
    ) -> None:
        """The walk's tables, over states: node rows renumbered so that branch nodes come
        first (a pair is done once its state passes them: one comparison, no gather), and
        doubled, so that state + go is the row of the child to take (2i: false, 2i + 1:
        true) and a level is one gather per table. A leaf leads back to itself, so
        finished pairs may ride along until the next compaction."""
        n = feature.size
        order = np.concatenate([np.flatnonzero(~leaf), np.flatnonzero(leaf)])
        renumbered = np.empty(n, np.intp)
        renumbered[order] = np.arange(n, dtype=np.intp)
        self.node_of_state = order  # state // 2 -> the node's row in the tables
        self.branch_states = 2 * int(np.count_nonzero(~leaf))
        rows = np.arange(n, dtype=np.intp)
        next_state = np.empty(2 * n, np.intp)
        next_state[0::2] = 2 * renumbered[np.where(leaf, rows, false)]
        next_state[1::2] = 2 * renumbered[np.where(leaf, rows, true)]
        self.next_state = next_state[np.repeat(2 * order, 2) + np.tile([0, 1], n)]
        self.state_feature = np.repeat(np.where(leaf, 0, feature)[order], 2)
        self.state_threshold = np.repeat(threshold[order], 2)
        self.state_mode = np.repeat(mode[order], 2)
        self.state_missing = np.repeat(missing[order], 2)
        self.state_roots = 2 * renumbered[self.roots]
        self.state_weight_row = np.repeat(true[order], 2)  # read at leaf states only
        self._starts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._position = np.arange(0, dtype=np.intp)
        # The transition table's parts: each branch node's feature, threshold, missing
        # flag and children (as node rows in the renumbered order), per state pair 2k.
        pair = slice(0, self.branch_states, 2)
        self.branch_feature = self.state_feature[pair]
        self.branch_threshold = self.state_threshold[pair]
        self.branch_missing = self.state_missing[pair]
        self.branch_false = self.next_state[0 : self.branch_states : 2] // 2
        self.branch_true = self.next_state[1 : self.branch_states : 2] // 2
        self._tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if len(self.modes) == 1 and self.modes[0] is not NodeMode.MEMBER:
            self.branch_threshold32 = _float32_threshold(self.branch_threshold, self.modes[0])
        self.paths = _path_matrix(self.branch_true, self.branch_false, self.state_roots // 2)
        self._path_outputs: tuple[np.ndarray, ...] | None = None
        self._tests: dict[int, np.ndarray] = {}

    def _start(self, batch: int, features: int) -> tuple[np.ndarray, np.ndarray]:
        """Every (sample, tree) pair's first state and offset into the flattened X, made
        once per batch size (the walk never writes into them)."""
        start = self._starts.get(batch)
        if start is None:
            trees = self.state_roots.size
            # Tree-major: pairs side by side walk the same tree, so a level's gathers
            # from the node tables stay within a few cache lines instead of the forest.
            at = np.repeat(self.state_roots, batch)
            offset = np.tile(np.arange(batch, dtype=np.intp) * features, trees)
            start = self._starts[batch] = (at, offset)
        return start

    def _positions(self, pairs: int) -> np.ndarray:
        """0, 1, ..., pairs - 1: where each pair's leaf goes in the result (read only)."""
        if self._position.size < pairs:
            self._position = np.arange(pairs, dtype=np.intp)
        return self._position[:pairs]

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf each (sample, tree) pair reaches: node rows [N, trees]."""
        self._ready()
        return self.node_of_state[self._reached(x).T >> 1]

    def _reached(self, x: np.ndarray) -> np.ndarray:
        """The state of the leaf each (sample, tree) pair reaches: [trees, N]."""
        self._ready()
        features = x.shape[-1]
        flat = x.reshape(-1).astype(np.float64, copy=False)
        batch, trees = flat.size // max(features, 1), self.state_roots.size
        nan_routing = self.any_missing and bool(np.isnan(flat).any())
        single = self.modes[0] if len(self.modes) == 1 else None
        compare = _COMPARE[single] if single not in (None, NodeMode.MEMBER) else None
        if compare is not None and self.use_paths(batch):
            picked = self._reached_by_paths(x.reshape(batch, features), compare)
            return np.ascontiguousarray(2 * cast(_Paths, self.paths).leaf[picked].T)
        if compare is not None and self.use_table(batch):
            return self._reached_by_table(flat, batch, compare, nan_routing)
        at, offset = self._start(batch, features)
        feature, threshold, next_state = self.state_feature, self.state_threshold, self.next_state
        branches = self.branch_states
        reached, position = np.empty(at.size, np.intp), self._positions(at.size)
        level = 0
        while True:
            # Which pairs are done is looked at every second level: a finished pair's
            # leaf leads back to itself, so it may take one more step, and the check
            # (two passes) costs more than the pairs that ride along.
            if level % 2 == 0:
                done = at >= branches
                finished = int(np.count_nonzero(done))
                if finished == at.size:
                    reached[position] = at
                    return reached.reshape(trees, batch)
                # Drop finished pairs once they are a quarter of those walking: compacting
                # at every level would cost three more passes for a few pairs each time.
                # Every pair's state is written (one scatter, no mask): those still
                # walking write theirs again when they finish. The kept pairs are
                # gathered by their positions, found once: a boolean mask would find them
                # again per array.
                if finished * 4 >= at.size:
                    reached[position] = at
                    keep = np.flatnonzero(~done)
                    at, offset, position = at[keep], offset[keep], position[keep]
            level += 1
            value = flat[offset + feature[at]]
            if compare is not None:
                go = compare(value, threshold[at])
            else:
                go = self._route(value, at, self.state_mode[at])
            if nan_routing:
                go |= self.state_missing[at] & np.isnan(value)
            at = next_state[at + go]

    def use_table(self, batch: int) -> bool:
        """Whether a call on `batch` samples goes through the transition table (when the
        nodes share one comparison mode): see TABLE_ELEMENTS."""
        entries = batch * self.node_of_state.size
        return entries <= TABLE_ELEMENTS or entries <= 2 * batch * self.roots.size * self.depth

    def use_paths(self, batch: int) -> bool:
        """Whether a call on `batch` samples goes through the path matrix (when the nodes
        share one comparison mode and the forest is small enough): see PATH_ELEMENTS."""
        paths = self.paths
        if paths is None:
            return False
        walk = self.node_of_state.size * (self.depth + 3)
        if paths.matrix.size > PATH_COST_FACTOR * walk:
            return False
        # Its temporaries (the tests and the product per sample) bounded as the table's.
        entries = batch * (paths.matrix.shape[0] + paths.matrix.shape[1])
        return entries <= TABLE_ELEMENTS or entries <= 2 * batch * self.roots.size * self.depth

    def _reached_by_paths(self, x: np.ndarray, compare: Callable) -> np.ndarray:
        """The path each (sample, tree) takes, as a column of the path matrix [N, trees]
        (module docstring). `x` is [N, features], of any float or integer dtype: the
        comparisons promote it with the thresholds, as the walk's float64 copy does."""
        paths = cast(_Paths, self.paths)
        value = x[:, self.branch_feature]
        threshold = self.branch_threshold32 if x.dtype == np.float32 else self.branch_threshold
        row = self._tests.get(x.shape[0])
        if row is None:
            # Each sample's tests and a last 1, which takes the true turns off every path.
            row = self._tests[x.shape[0]] = np.ones((x.shape[0], value.shape[1] + 1), np.float32)
        tests = row[:, :-1]
        if self.any_missing:
            go = compare(value, threshold)
            go |= self.branch_missing & np.isnan(value)
            np.copyto(tests, go)
        else:
            compare(value, threshold, out=tests)
        passed = row @ paths.matrix
        picked = passed.reshape(x.shape[0], -1, paths.width).argmax(axis=2)
        picked += paths.first
        return picked

    def _table(self, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For `batch` samples: the transition table [batch, nodes] (flat entries
        sample * nodes + child; a leaf's entry leads back to itself and is written here,
        the branch nodes' are rewritten by each call), each sample's first entry, and
        every (tree, sample) pair's start, tree-major. Made once per batch size."""
        made = self._tables.get(batch)
        if made is None:
            nodes = self.node_of_state.size
            base = np.arange(batch, dtype=np.intp)[:, None] * nodes
            table = base + np.arange(nodes, dtype=np.intp)
            start = (self.state_roots // 2)[:, None] + base[:, 0]  # [trees, batch]
            made = self._tables[batch] = (table, base, start.reshape(-1))
        return made

    def _reached_by_table(
        self, flat: np.ndarray, batch: int, compare: Callable, nan_routing: bool
    ) -> np.ndarray:
        """`_reached` through a transition table (module docstring), for one comparison
        mode: every branch node's test for every sample, then one gather per level."""
        table, base, at = self._table(batch)
        x = flat.reshape(batch, -1)
        value = x[:, self.branch_feature]  # [batch, branch nodes]
        go = compare(value, self.branch_threshold)
        if nan_routing:
            go |= self.branch_missing & np.isnan(value)
        branches = self.branch_false.size
        np.add(np.where(go, self.branch_true, self.branch_false), base, out=table[:, :branches])
        flat_table = table.reshape(-1)
        for _ in range(self.depth - 1):
            at = flat_table[at]
        trees = self.state_roots.size
        reached = at.reshape(trees, batch) - base[:, 0]
        reached *= 2  # node rows back to states
        return reached

    def _route(self, value: np.ndarray, at: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """Where pairs at states `at` go when the nodes mix comparison modes."""
        threshold = self.state_threshold
        go = np.zeros(value.shape, np.bool_)
        for m in self.modes:
            pick = modes == m
            if m is NodeMode.MEMBER:
                # Set whenever a node tests membership (checked when prepared).
                sets = cast(np.ndarray, self.members)[self.node_of_state[at[pick] >> 1]]
                go[pick] = (sets == value[pick, None]).any(axis=1)
            else:
                go[pick] = _COMPARE[m](value[pick], threshold[at[pick]])
        return go

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Aggregated leaf weights [N, targets] (float32), before base values."""
        self._ready()
        return self._aggregate(np.ascontiguousarray(self.state_weight_row[self._reached(x)].T))

    def _aggregate(self, rows: np.ndarray) -> np.ndarray:
        """`scores` from the leaf weight rows each sample reaches [N, trees]."""
        if self.aggregate in ("MIN", "MAX"):
            picked = self.weights[rows]  # [N, trees, targets], NaN: no weight
            pick = np.fmin if self.aggregate == "MIN" else np.fmax
            return np.nan_to_num(pick.reduce(picked, axis=1), nan=0.0).astype(np.float32)
        # Summed in float32 over the trees axis of [N, trees, targets], in the order the
        # results were checked against onnxruntime with (a sum landing on a decision
        # threshold, a vote share of exactly 0.5, must round the same way): NumPy adds the
        # trees one after another for several targets and pairwise for one.
        if self.n_targets == 1:
            # The same sums over a [N, trees] gather: half the bytes, one index stride.
            total = self.sum_weights[:, 0][rows].sum(axis=1, dtype=np.float32)[:, None]
        else:
            total = self.sum_weights[rows].sum(axis=1, dtype=np.float32)
        if self.aggregate == "AVERAGE":
            total /= np.float32(self.roots.size)
        return total

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        samples = x.reshape(-1, x.shape[-1])
        if self._single_tree_by_path(samples.shape[0]):
            return self._bind_by_path(samples, outputs)
        if not self.classifier:
            (out,) = outputs

            def regress() -> None:
                out[...] = self._regressor(self.scores(x))

            return regress
        label, probs = outputs

        def classify() -> None:
            index, z = self._classifier(self.scores(x))
            label[...] = index
            probs[...] = z

        return classify

    def _single_tree_by_path(self, batch: int) -> bool:
        """Whether calls on `batch` samples find a single tree's path by the path matrix
        (its outputs are then those of the path, computed once)."""
        self._ready()
        if self.roots.size != 1 or len(self.modes) != 1 or self.modes[0] is NodeMode.MEMBER:
            return False
        return self.use_paths(batch)

    def _bind_by_path(self, x: np.ndarray, outputs: list[np.ndarray]) -> Compute:
        """The step for a single tree through the path matrix (`_reached_by_paths` with
        its buffers made here): one gather, test, product and argmax, then each output
        gathered from its table by the path."""
        paths = cast(_Paths, self.paths)
        compare = _COMPARE[self.modes[0]]
        threshold = self.branch_threshold32 if x.dtype == np.float32 else self.branch_threshold
        feature, missing, any_missing = self.branch_feature, self.branch_missing, self.any_missing
        row = np.ones((x.shape[0], feature.size + 1), np.float32)
        tests, passed = row[:, :-1], np.empty((x.shape[0], paths.matrix.shape[1]), np.float32)
        pairs = list(zip(outputs, self._outputs_by_path(), strict=True))
        matrix, matmul, isnan, copyto = paths.matrix, np.matmul, np.isnan, np.copyto

        def step() -> None:
            value = x[:, feature]
            if any_missing:
                go = compare(value, threshold)
                go |= missing & isnan(value)
                copyto(tests, go)
            else:
                compare(value, threshold, out=tests)
            matmul(row, matrix, out=passed)
            picked = passed.argmax(axis=1)
            for out, table in pairs:
                out[...] = table[picked]

        return step

    def _outputs_by_path(self) -> tuple[np.ndarray, ...]:
        """The kernel's outputs for a sample taking each path of a single tree, made on
        first use by the same arithmetic as a call (each row depends on its own scores)."""
        if self._path_outputs is None:
            rows = self.state_weight_row[2 * cast(_Paths, self.paths).leaf][:, None]
            s = self._aggregate(rows)
            if self.classifier:
                index, z = self._classifier(s)
                self._path_outputs = (index.astype(np.int64), z.astype(np.float32))
            else:
                self._path_outputs = (self._regressor(s).astype(np.float32),)
        return self._path_outputs

    def _regressor(self, s: np.ndarray) -> np.ndarray:
        if self.base.size == self.n_targets:
            s = s + self.base.astype(np.float32)
        if self.n_targets == 1:
            # onnxruntime applies only PROBIT to a single score.
            return pt.probit(s) if self.transform is pt.PostTransform.PROBIT else s
        return pt.apply(self.transform, s)

    def _classifier(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Label indices and scores, with onnxruntime's rules for two classes."""
        if self.n_targets > 2 or self.n_targets == 1:
            if self.base.size == self.n_targets:
                s = s + self.base.astype(np.float32)
            scored = np.where(self.weighted | (self.base.size == self.n_targets), s, -np.inf)
            return np.argmax(scored, axis=1), pt.apply(self.transform, s)
        return self._binary(s)

    def _binary(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h0, h1 = bool(self.weighted[0]), bool(self.weighted[1])
        s0, s1 = s[:, 0].copy(), s[:, 1].copy()
        base = self.base.astype(np.float32)
        two = True  # whether both scores are kept (else one, widened to two)
        mode = np.full(s0.shape, -1)
        if base.size == 2:
            if h1:
                s1 = base[1] + s0
                s0 = -s1
            else:
                s0, s1 = s0 + base[0], s1 + base[1]
        elif base.size == 1:
            s0 = s0 + base[0]
            two = h1
        elif base.size == 0:
            mode[:] = 3
            two = h1
        positive = s1 if (two and h1) else (s0 if h0 else np.zeros_like(s0))
        if int(self.weighted.sum()) == 1:  # onnxruntime's binary case
            if self.all_positive:
                won = positive > 0.5
                mode = np.where(won, 0, 1)
            else:
                won = positive > 0
                mode = np.where(won, 2, 3)
        else:
            won = positive > 0
        index = won.astype(np.int64)
        if two:
            return index, pt.apply(self.transform, np.stack([s0, s1], axis=1))
        if (mode < 0).any():
            z = np.stack([s0, np.zeros_like(s0)], axis=1).astype(np.float32)
            return index, z
        return index, pt.second_class(self.transform, s0, mode)


def _depth(
    roots: np.ndarray,
    true: np.ndarray,
    false: np.ndarray,
    leaf: np.ndarray,
    fail: Callable[[str], Exception],
) -> int:
    """Levels of the deepest tree; a cycle in the node table is an error."""
    level = np.unique(roots)
    depth = 0
    seen = 0
    limit = leaf.size
    while level.size:
        seen += level.size
        if seen > limit * max(1, roots.size) or depth > limit:
            raise fail("the node table has a cycle (a node is its own descendant)")
        inner = level[~leaf[level]]
        level = np.unique(np.concatenate([true[inner], false[inner]]))
        depth += 1
    return depth


class _Paths(NamedTuple):
    """A forest's root-to-leaf paths as a matrix (see the module docstring): matrix
    [branch nodes + 1, trees * width] (+1: the path takes the node's true child, -1: its
    false one; the last row minus the path's true turns, or -1 for a padding column, which
    scores no test), leaf [columns] (node row where each path ends) and first [trees]
    (each tree's first column)."""

    matrix: np.ndarray
    leaf: np.ndarray
    first: np.ndarray
    width: int


def _path_matrix(true: np.ndarray, false: np.ndarray, roots: np.ndarray) -> _Paths | None:
    """The path matrix of the trees at `roots` (node rows below true.size are branch nodes
    with children `true`, `false`), or None when it exceeds PATH_ELEMENTS."""
    branches = true.size
    budget = PATH_ELEMENTS // max(branches, 1)
    if branches == 0 or roots.size > budget:
        return None
    trees: list[list[tuple[int, tuple[tuple[int, int], ...]]]] = []
    total = 0
    for root in roots.tolist():
        found = []
        stack: list[tuple[int, tuple[tuple[int, int], ...]]] = [(root, ())]
        while stack:
            node, path = stack.pop()
            if node >= branches:
                found.append((node, path))
                total += 1
                if total > budget:
                    return None
                continue
            stack.append((int(false[node]), (*path, (node, -1))))
            stack.append((int(true[node]), (*path, (node, 1))))
        trees.append(found)
    width = max(len(found) for found in trees)
    if branches * width * len(trees) > PATH_ELEMENTS:
        return None
    matrix = np.zeros((branches + 1, width * len(trees)), np.float32)
    true_turns = matrix[branches]
    true_turns[:] = -1
    leaf = np.empty(width * len(trees), np.intp)
    for t, found in enumerate(trees):
        leaf[t * width : (t + 1) * width] = found[0][0]
        for j, (node, path) in enumerate(found):
            column = t * width + j
            for k, sign in path:
                matrix[k, column] = sign
            true_turns[column] = -sum(1 for _, sign in path if sign > 0)
            leaf[column] = node
    first = np.arange(len(trees), dtype=np.intp) * width
    return _Paths(matrix, leaf, first, width)


def _float32_threshold(threshold: np.ndarray, mode: NodeMode) -> np.ndarray:
    """Float32 thresholds that route every float32 input as the float64 ones do under
    `mode`: rounded down for <= and >, up for < and >=; a threshold no float32 equals
    becomes NaN for == and != (never equal). Comparing in float32 spares a cast per call."""
    with np.errstate(over="ignore"):  # beyond float32's range: an infinity, as wanted
        t32 = threshold.astype(np.float32)
        if mode in (NodeMode.LEQ, NodeMode.GT):
            above = t32 > threshold
            t32[above] = np.nextafter(t32[above], np.float32(-np.inf))
        elif mode in (NodeMode.LT, NodeMode.GTE):
            below = t32 < threshold
            t32[below] = np.nextafter(t32[below], np.float32(np.inf))
        else:
            t32[t32 != threshold] = np.nan
    return t32
