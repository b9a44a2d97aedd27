"""scikit-learn estimators exported by skl2onnx, for the classic-ML import tests and the
benchmark: each case builds a small fitted estimator and its sample input."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    """One estimator type: how to fit it and on which data (classification or not)."""

    name: str
    build: Callable[[], Any]
    data: str  # "multiclass", "binary", "regression", "strings", "mixed"
    slow: bool = False


def dataset(kind: str, n: int = 120) -> tuple[Any, np.ndarray]:
    """(X, y) of a small, fixed data set of `kind`."""
    from sklearn.datasets import make_classification, make_regression

    rng = np.random.default_rng(0)
    if kind == "regression":
        x, y = make_regression(n, 6, noise=0.5, random_state=0)
        return x.astype(np.float32), y.astype(np.float32)
    if kind == "positive":  # non-negative counts, for multinomial naive Bayes
        x, y = make_classification(n, 6, n_informative=4, n_classes=3, random_state=0)
        return np.abs(x * 3).round().astype(np.float32), y
    if kind in ("multiclass", "strings"):
        x, y = make_classification(n, 6, n_informative=4, n_classes=3, random_state=0)
        if kind == "strings":
            y = np.array(["setosa", "versicolor", "virginica"], dtype=object)[y]
        return x.astype(np.float32), y
    if kind == "binary":
        x, y = make_classification(n, 6, n_informative=4, random_state=1)
        return x.astype(np.float32), y
    if kind == "missing":
        x, y = make_classification(n, 6, n_informative=4, n_classes=3, random_state=0)
        x = x.astype(np.float32)
        x[rng.random(x.shape) < 0.1] = np.nan
        return x, y
    if kind == "mixed":  # numeric columns and an integer-coded category column
        x, y = make_classification(
            n, 4, n_informative=3, n_redundant=0, n_classes=3, random_state=0
        )
        cat = rng.integers(0, 4, size=(n, 1)).astype(np.float32)
        return np.hstack([x.astype(np.float32), cat]), y
    raise ValueError(kind)


def _seeded(estimator: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """A factory of `estimator(*args, **kwargs)` with random_state=0 (reproducible fits)."""
    return lambda: estimator(*args, random_state=0, **kwargs)


def _cases() -> list[Case]:
    from sklearn import (
        discriminant_analysis,
        ensemble,
        linear_model,
        naive_bayes,
        neighbors,
        neural_network,
        svm,
        tree,
    )
    from sklearn.compose import ColumnTransformer
    from sklearn.decomposition import PCA
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import (
        Binarizer,
        MinMaxScaler,
        Normalizer,
        OneHotEncoder,
        StandardScaler,
    )

    def mixed_pipeline() -> Any:
        columns = ColumnTransformer(
            [
                ("num", StandardScaler(), [0, 1, 2, 3]),
                ("cat", OneHotEncoder(handle_unknown="ignore"), [4]),
            ]
        )
        return make_pipeline(columns, linear_model.LogisticRegression(max_iter=500))

    return [
        # linear models
        Case(
            "LogisticRegression",
            lambda: linear_model.LogisticRegression(max_iter=500),
            "multiclass",
        ),
        Case("LogisticRegression-binary", lambda: linear_model.LogisticRegression(), "binary"),
        Case("SGDClassifier", _seeded(linear_model.SGDClassifier, loss="log_loss"), "multiclass"),
        Case("RidgeClassifier", lambda: linear_model.RidgeClassifier(), "multiclass"),
        Case("Perceptron", _seeded(linear_model.Perceptron), "binary"),
        Case("LinearRegression", lambda: linear_model.LinearRegression(), "regression"),
        Case("Ridge", lambda: linear_model.Ridge(), "regression"),
        Case("Lasso", lambda: linear_model.Lasso(alpha=0.1), "regression"),
        Case("ElasticNet", lambda: linear_model.ElasticNet(alpha=0.1), "regression"),
        Case("SGDRegressor", _seeded(linear_model.SGDRegressor), "regression"),
        # support vector machines
        Case("SVC-probability", _seeded(svm.SVC, probability=True), "multiclass"),
        Case("SVC-binary-probability", _seeded(svm.SVC, probability=True), "binary"),
        Case("SVC-poly", lambda: svm.SVC(kernel="poly", degree=2), "multiclass"),
        Case("NuSVC", lambda: svm.NuSVC(kernel="sigmoid", gamma=0.05), "binary"),
        Case("LinearSVC", lambda: svm.LinearSVC(), "multiclass"),
        Case("SVR", lambda: svm.SVR(), "regression"),
        Case("NuSVR", lambda: svm.NuSVR(kernel="linear"), "regression"),
        Case("LinearSVR", _seeded(svm.LinearSVR), "regression"),
        # trees and ensembles
        Case("DecisionTreeClassifier", _seeded(tree.DecisionTreeClassifier), "multiclass"),
        Case(
            "DecisionTreeRegressor", lambda: tree.DecisionTreeRegressor(max_depth=8), "regression"
        ),
        Case("RandomForestClassifier", _seeded(ensemble.RandomForestClassifier, 20), "multiclass"),
        Case(
            "RandomForestClassifier-binary", _seeded(ensemble.RandomForestClassifier, 10), "binary"
        ),
        Case("RandomForestRegressor", _seeded(ensemble.RandomForestRegressor, 10), "regression"),
        Case("ExtraTreesClassifier", _seeded(ensemble.ExtraTreesClassifier, 10), "multiclass"),
        Case("ExtraTreesRegressor", _seeded(ensemble.ExtraTreesRegressor, 10), "regression"),
        Case(
            "GradientBoostingClassifier",
            _seeded(ensemble.GradientBoostingClassifier, n_estimators=20),
            "multiclass",
        ),
        Case(
            "GradientBoostingClassifier-binary",
            _seeded(ensemble.GradientBoostingClassifier, n_estimators=20),
            "binary",
        ),
        Case(
            "GradientBoostingRegressor",
            _seeded(ensemble.GradientBoostingRegressor, n_estimators=20),
            "regression",
        ),
        Case(
            "HistGradientBoostingClassifier",
            _seeded(ensemble.HistGradientBoostingClassifier, max_iter=15),
            "missing",
        ),
        Case(
            "HistGradientBoostingRegressor",
            _seeded(ensemble.HistGradientBoostingRegressor, max_iter=15),
            "regression",
        ),
        Case(
            "AdaBoostClassifier",
            _seeded(ensemble.AdaBoostClassifier, n_estimators=10),
            "multiclass",
        ),
        # neighbours, naive Bayes, neural networks, discriminant analysis
        Case("KNeighborsClassifier", lambda: neighbors.KNeighborsClassifier(5), "multiclass"),
        Case("KNeighborsRegressor", lambda: neighbors.KNeighborsRegressor(5), "regression"),
        Case("GaussianNB", lambda: naive_bayes.GaussianNB(), "multiclass"),
        Case("BernoulliNB", lambda: naive_bayes.BernoulliNB(), "binary"),
        Case("MultinomialNB", lambda: naive_bayes.MultinomialNB(), "positive"),
        Case(
            "MLPClassifier",
            lambda: neural_network.MLPClassifier(
                hidden_layer_sizes=(16,), max_iter=300, random_state=0
            ),
            "multiclass",
        ),
        Case(
            "MLPRegressor",
            lambda: neural_network.MLPRegressor(
                hidden_layer_sizes=(16,), max_iter=300, random_state=0
            ),
            "regression",
        ),
        Case(
            "LinearDiscriminantAnalysis",
            lambda: discriminant_analysis.LinearDiscriminantAnalysis(),
            "multiclass",
        ),
        # pipelines with preprocessing, string targets
        Case(
            "StandardScaler+LogisticRegression",
            lambda: make_pipeline(StandardScaler(), linear_model.LogisticRegression(max_iter=500)),
            "multiclass",
        ),
        Case(
            "MinMaxScaler+SVC",
            lambda: make_pipeline(MinMaxScaler(), svm.SVC(probability=True, random_state=0)),
            "multiclass",
        ),
        Case(
            "Imputer+RandomForest",
            lambda: make_pipeline(
                SimpleImputer(), ensemble.RandomForestClassifier(10, random_state=0)
            ),
            "missing",
        ),
        Case(
            "Normalizer+Binarizer+PCA+Ridge",
            lambda: make_pipeline(
                Normalizer(), Binarizer(threshold=0.1), PCA(3), linear_model.Ridge()
            ),
            "regression",
        ),
        Case("ColumnTransformer(OneHotEncoder)+LogisticRegression", mixed_pipeline, "mixed"),
        Case(
            "DecisionTree-string-labels",
            _seeded(tree.DecisionTreeClassifier, max_depth=4),
            "strings",
        ),
        Case(
            "LogisticRegression-string-labels",
            lambda: linear_model.LogisticRegression(max_iter=500),
            "strings",
        ),
        Case("SVC-string-labels", lambda: svm.SVC(), "strings"),
    ]


CASES = _cases
