"""scikit-learn models exported by skl2onnx convert and match onnxruntime: labels equal,
probabilities and regression outputs within 1e-5. onnxruntime runs with graph
optimizations off, so its float arithmetic is the ops' reference semantics."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

from sporenet.converter import convert_onnx  # noqa: E402
from sporenet.lite import Interpreter, parse  # noqa: E402
from tests.unit.converter.sklearn_cases import CASES, Case, dataset  # noqa: E402

TOLERANCE = 1e-5


@contextlib.contextmanager
def _int_bools() -> Iterator[None]:
    """skl2onnx 1.20 passes NumPy bools in integer attribute lists for scikit-learn >= 1.8's
    missing-value trees, which onnx.helper refuses; as ints they are the file it means to
    write (the attribute is 0/1 by definition)."""
    import onnx.helper

    make_attribute = onnx.helper.make_attribute

    def fixed(key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, list | tuple | np.ndarray) and any(
            isinstance(v, np.bool_ | bool) for v in value
        ):
            value = [int(v) for v in value]
        return make_attribute(key, value, *args, **kwargs)

    onnx.helper.make_attribute = fixed
    try:
        yield
    finally:
        onnx.helper.make_attribute = make_attribute


def export(estimator: Any, x: np.ndarray, *, zipmap: bool = False) -> Any:
    from skl2onnx import to_onnx

    options: dict[Any, Any] = {}
    if hasattr(estimator, "predict_proba") or hasattr(estimator, "decision_function"):
        options = {id(estimator): {"zipmap": zipmap}} if not zipmap else {}
    with warnings.catch_warnings(), _int_bools():
        warnings.simplefilter("ignore")
        try:
            return to_onnx(
                estimator, x[:1], options=options, target_opset={"": 21, "ai.onnx.ml": 3}
            )
        except (NameError, RuntimeError, ValueError):  # estimators without a zipmap option
            return to_onnx(estimator, x[:1], target_opset={"": 21, "ai.onnx.ml": 3})


def reference(onx: Any, x: np.ndarray) -> dict[str, Any]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(onx.SerializeToString(), options)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {session.get_inputs()[0].name: x}), strict=True))


def fitted(case: Case) -> tuple[Any, np.ndarray]:
    x, y = dataset(case.data)
    estimator = case.build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of deliberately short fits
        estimator.fit(x, y)
    return estimator, x


def compare(ours: dict[str, np.ndarray], theirs: dict[str, Any]) -> None:
    assert set(ours) == set(theirs)
    for name, expected in theirs.items():
        got = ours[name]
        if isinstance(expected, list):  # ZipMap: a list of {label: probability}
            continue
        expected = np.asarray(expected)
        assert got.shape == expected.shape, name
        if expected.dtype.kind in "OUSib":
            assert got.tolist() == expected.tolist(), name
        else:
            np.testing.assert_allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE, err_msg=name)


def _params() -> list[Any]:
    return [
        pytest.param(case, id=case.name, marks=[pytest.mark.slow] if case.slow else [])
        for case in CASES()
    ]


@pytest.mark.parametrize("case", _params())
def test_sklearn_export_matches_onnxruntime(case: Case) -> None:
    estimator, x = fitted(case)
    onx = export(estimator, x)
    interpreter = Interpreter(model_content=convert_onnx(onx))
    input_name = onx.graph.input[0].name
    compare(interpreter.run({input_name: x}), reference(onx, x))
    # one sample at a time too: a dynamic batch re-plans
    one = interpreter.run({input_name: x[:1]})
    compare(one, reference(onx, x[:1]))


@pytest.mark.parametrize("kind", ["multiclass", "strings"])
def test_zipmap_output_is_the_probabilities_with_labels_in_metadata(kind: str) -> None:
    from sklearn.ensemble import RandomForestClassifier

    x, y = dataset(kind)
    estimator = RandomForestClassifier(5, random_state=0).fit(x, y)
    onx = export(estimator, x, zipmap=True)
    assert any(n.op_type == "ZipMap" for n in onx.graph.node)
    expected = reference(onx, x)
    data = convert_onnx(onx)
    out = Interpreter(model_content=data).run({onx.graph.input[0].name: x})
    labels = json.loads(parse(data).metadata["zipmap:output_probability"])
    assert labels == sorted(set(y.tolist()))
    maps = [dict(zip(labels, row.tolist(), strict=True)) for row in out["output_probability"]]
    for mine, theirs in zip(maps, expected["output_probability"], strict=True):
        assert mine.keys() == theirs.keys()
        np.testing.assert_allclose(list(mine.values()), list(theirs.values()), atol=TOLERANCE)
    assert out["output_label"].tolist() == expected["output_label"].tolist()


@pytest.mark.parametrize(
    "name",
    [
        "RandomForestClassifier",
        "SVC-probability",
        "LogisticRegression-string-labels",
        "ColumnTransformer(OneHotEncoder)+LogisticRegression",
        "KNeighborsClassifier",
        "Imputer+RandomForest",
        "Normalizer+Binarizer+PCA+Ridge",
    ],
)
def test_handlers_emit_only_the_ops_they_declare(name: str) -> None:
    from sporenet.converter.onnx_import.importer import import_onnx, op_key
    from sporenet.converter.onnx_import.registry import HANDLERS

    case = next(c for c in CASES() if c.name == name)
    estimator, x = fitted(case)
    onx = export(estimator, x)
    declared = {op for n in onx.graph.node for op in HANDLERS[op_key(n)].requires}
    emitted = {node.op for node in import_onnx(onx).graphs[0].nodes}
    assert emitted <= declared, sorted(op.name for op in emitted - declared)


def test_a_model_importing_only_the_ml_domain_converts() -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(
        "TreeEnsembleRegressor",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2],
        nodes_featureids=[1, 0, 0],
        nodes_values=[0.5, 0.0, 0.0],
        nodes_modes=["BRANCH_LT", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0],
        target_nodeids=[1, 2],
        target_ids=[0, 0],
        target_weights=[-3.0, 7.0],
        base_values=[1.0],
        n_targets=1,
    )
    graph = helper.make_graph(
        [node],
        "tree",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.checker.check_model(model)
    x = np.array([[0.0, 0.2], [0.0, 0.9], [1.0, np.nan]], np.float32)
    out = Interpreter(model_content=convert_onnx(model)).run({"X": x})
    np.testing.assert_array_equal(out["Y"], reference(model, x)["Y"])
    np.testing.assert_array_equal(out["Y"][:, 0], [-2.0, 8.0, 8.0])
