"""ai.onnx.ml TreeEnsemble (opset 5), whose node table and leaf weights are TENSOR
attributes, imported and run against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="test extra")
import onnx
from onnx import TensorProto, helper, numpy_helper

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from tests.references import run_ort_reference
from tests.unit.converter.helpers import convert

DEPTH, TREES, FEATURES = 3, 6, 5


def _forest(rng: np.random.Generator) -> onnx.ModelProto:
    """TREES complete trees of depth DEPTH over float64 features: 42 branch nodes and 48
    leaves, so nodes_splits and leaf_weights (float64 tensors) exceed the in-place
    reader's threshold and are read from the file's bytes."""
    inner, leaves = 2**DEPTH - 1, 2**DEPTH
    features, true_ids, false_ids, true_leaf, false_leaf, roots = [], [], [], [], [], []
    for t in range(TREES):
        roots.append(t * inner)
        for k in range(inner):
            features.append(int(rng.integers(FEATURES)))
            if 2 * k + 2 < inner:  # both children are branch nodes
                true_ids.append(t * inner + 2 * k + 1)
                false_ids.append(t * inner + 2 * k + 2)
                true_leaf.append(0)
                false_leaf.append(0)
            else:  # both children are leaves
                first = t * leaves + 2 * (k - (inner - 1) // 2)
                true_ids.append(first)
                false_ids.append(first + 1)
                true_leaf.append(1)
                false_leaf.append(1)
    n_nodes, n_leaves = TREES * inner, TREES * leaves
    tensor = numpy_helper.from_array
    node = helper.make_node(
        "TreeEnsemble",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        nodes_featureids=features,
        nodes_splits=tensor(rng.uniform(0, 1, n_nodes)),
        nodes_modes=tensor(np.zeros(n_nodes, np.uint8)),  # BRANCH_LEQ
        nodes_truenodeids=true_ids,
        nodes_falsenodeids=false_ids,
        nodes_trueleafs=true_leaf,
        nodes_falseleafs=false_leaf,
        leaf_targetids=[int(v) for v in rng.integers(0, 2, n_leaves)],
        leaf_weights=tensor(rng.normal(0, 1, n_leaves)),
        tree_roots=roots,
        n_targets=2,
        aggregate_function=1,  # SUM
        post_transform=0,
    )
    graph = helper.make_graph(
        [node],
        "forest",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [None, FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [None, 2])],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def test_tree_ensemble_with_large_tensor_attributes_matches_onnxruntime(tmp_path) -> None:
    model = _forest(np.random.default_rng(0))
    path = tmp_path / "forest.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).uniform(0, 1, (64, FEATURES))
    got = Interpreter(model_content=convert_onnx(str(path))).run({"X": x})["Y"]
    (want,) = run_ort_reference(model, {"X": x})
    # The kernel's scores are float32 (cast to the input's float64 afterwards), where
    # onnxruntime sums the leaf weights in float64: agreement to float32 rounding.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tree_tables_are_stored_narrow_and_route_the_same(tmp_path) -> None:
    """Node features and rows fit int16/int32, modes uint8, leaf weights float32; float64
    splits that are not all float32 stay float64, float32 ones are stored as float32;
    both match onnxruntime."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (64, FEATURES))
    for splits in (rng.uniform(0, 1, 42), rng.uniform(0, 1, 42).astype(np.float32)):
        model = _forest(np.random.default_rng(0))
        (attr,) = [a for a in model.graph.node[0].attribute if a.name == "nodes_splits"]
        attr.t.CopyFrom(numpy_helper.from_array(splits.astype(np.float64)))
        ir = convert(model)
        stored = {t.name.rsplit("/", 1)[-1]: t.data for t in ir.tensors if t.data is not None}
        assert stored["feature"].dtype == np.int16
        assert stored["true"].dtype == stored["false"].dtype == np.int32
        assert stored["mode"].dtype == np.uint8
        assert stored["leaf_weights"].dtype == np.float32
        want = np.float64 if splits.dtype == np.float64 else np.float32
        assert stored["threshold"].dtype == want
        got = Interpreter(model_content=convert_onnx(model)).run({"X": x})["Y"]
        (reference,) = run_ort_reference(model, {"X": x})
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
