"""SVM: ai.onnx.ml SVMClassifier and SVMRegressor, with onnxruntime's semantics: kernel
values against the support vectors, one-vs-one pair scores and votes, Platt-scaled pair
probabilities coupled into class probabilities (libsvm's iterative method, run for all
samples at once)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.ml import post_transform as pt
from sporenet.lite.ops import OpCode

KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


class SVM(Kernel):
    """inputs: X, support_vectors [V, F] (empty: linear mode, coefficients are per class
    weights [K, F]), coefficients, rho, prob_a, prob_b (absent or empty: no probabilities),
    vectors_per_class."""

    op = OpCode.SVM
    num_inputs = (4, 7)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype.kind not in "iuf" or x.rank not in (1, 2):
            raise self.fail(f"X must be a numeric [N, F] tensor, got {x.dtype}{list(x.shape)}")
        features = x.shape[-1]
        self.sv = self.constant(1, "support_vectors").astype(np.float64)
        coef: np.ndarray = self.constant(2, "coefficients").astype(np.float64).ravel()
        self.rho = self.constant(3, "rho").astype(np.float64).ravel()
        self.kernel = attrs.str("kernel", "LINEAR")
        if self.kernel not in KERNELS:
            raise self.fail(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        self.gamma = attrs.float("gamma", 0.0)
        self.coef0 = attrs.float("coef0", 0.0)
        self.degree = attrs.float("degree", 0.0)
        self.transform = pt.parse(attrs.str("post_transform", "NONE"), self.fail)
        self.classifier = bool(attrs.int("classifier", 0))
        self.one_class = bool(attrs.int("one_class", 0))
        self.linear_mode = self.sv.size == 0
        batch = x.shape[0] if x.rank == 2 else 1
        if self.rho.size == 0:
            raise self.fail("rho must hold at least one value")
        if not self.linear_mode and (self.sv.ndim != 2 or self.sv.shape[1] != features):
            raise self.fail(
                f"support_vectors must be [vectors, {features}], got {list(self.sv.shape)}"
            )
        prob_a = self.optional_input(4)
        self.prob_a = None if prob_a is None else self.constant(4, "prob_a").astype(np.float64)
        self.prob_b = None if prob_a is None else self.constant(5, "prob_b").astype(np.float64)
        if self.prob_a is not None and self.prob_a.size == 0:
            self.prob_a = self.prob_b = None
        if not self.classifier:
            vectors = 1 if self.linear_mode else self.sv.shape[0]
            if coef.size != (features if self.linear_mode else vectors):
                raise self.fail(f"coefficients must hold {vectors} values, got {coef.size}")
            self.coef: np.ndarray = coef
            self.output_specs = [TensorSpec((batch, 1), np.dtype(np.float32))]
            return
        self.n_classes = attrs.int("n_labels", 2)
        k = self.n_classes
        if self.linear_mode:
            if coef.size % features:
                raise self.fail(f"coefficients ({coef.size}) are not whole rows of {features}")
            self.coef = coef.reshape(-1, features)
            self.output_specs = [
                TensorSpec((batch,), np.dtype(np.int64)),
                TensorSpec((batch, self.coef.shape[0]), np.dtype(np.float32)),
            ]
            return
        per_class = self.constant(6, "vectors_per_class").astype(np.int64).ravel()
        vectors = self.sv.shape[0]
        if per_class.size != k or per_class.sum() != vectors or (per_class < 0).any():
            raise self.fail(
                f"vectors_per_class must split the {vectors} support vectors over {k} classes"
            )
        if coef.size != (k - 1) * vectors:
            raise self.fail(f"coefficients must hold {(k - 1) * vectors} values, got {coef.size}")
        pairs = k * (k - 1) // 2
        if self.rho.size < pairs:
            raise self.fail(f"rho must hold {pairs} values (one per class pair)")
        if (
            self.prob_a is not None
            and self.prob_b is not None
            and (self.prob_a.size < pairs or self.prob_b.size < pairs)
        ):
            raise self.fail(f"prob_a and prob_b must hold {pairs} values")
        self.coef = coef.reshape(k - 1, vectors)
        self.starts = np.concatenate([[0], np.cumsum(per_class)[:-1]])
        self.per_class = per_class
        width = k if self.prob_a is not None else (2 if k <= 2 else pairs)
        self.output_specs = [
            TensorSpec((batch,), np.dtype(np.int64)),
            TensorSpec((batch, width), np.dtype(np.float32)),
        ]

    def _kernel(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        if self.kernel == "RBF":
            sq = (x * x).sum(1)[:, None] + (a * a).sum(1)[None, :] - 2 * (x @ a.T)
            return np.exp(-self.gamma * np.maximum(sq, 0))
        dot = x @ a.T
        if self.kernel == "POLY":
            return (self.gamma * dot + self.coef0) ** self.degree
        if self.kernel == "SIGMOID":
            return np.tanh(self.gamma * dot + self.coef0)
        return dot

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        features = self.input(0).shape[-1]

        def compute() -> None:
            xs = x.reshape(-1, features).astype(np.float32).astype(np.float64)
            results = self._regress(xs) if not self.classifier else self._classify(xs)
            for out, value in zip(outputs, results, strict=True):
                out[...] = value

        return compute

    def _regress(self, x: np.ndarray) -> tuple[np.ndarray]:
        if self.linear_mode:
            s = x @ self.coef + self.rho[0]
        else:
            s = self._kernel(x, self.sv) @ self.coef + self.rho[0]
        if self.one_class:
            s = np.where(s > 0, 1.0, -1.0)
        elif self.transform is pt.PostTransform.PROBIT:
            s = pt.probit(s.astype(np.float32))
        return (s.astype(np.float32)[:, None],)

    def _classify(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.linear_mode:
            s = x @ self.coef.T + self.rho[0]  # liblinear mode: a plain dot product
            return np.argmax(s, axis=1), pt.apply(self.transform, s)
        k = self.n_classes
        kern = self._kernel(x, self.sv)
        scores, votes = [], np.zeros((x.shape[0], k), np.int64)
        rows = np.arange(x.shape[0])
        pair = 0
        for i in range(k - 1):
            si = slice(self.starts[i], self.starts[i] + self.per_class[i])
            for j in range(i + 1, k):
                sj = slice(self.starts[j], self.starts[j] + self.per_class[j])
                s = kern[:, si] @ self.coef[j - 1, si] + kern[:, sj] @ self.coef[i, sj]
                s = s + self.rho[pair]
                pair += 1
                scores.append(s)
                np.add.at(votes, (rows, np.where(s > 0, i, j)), 1)
        pairs = np.stack(scores, axis=1).astype(np.float32)
        label = np.argmax(votes, axis=1)
        if self.prob_a is not None and self.prob_b is not None:  # both or neither
            probs = _coupled(pairs, self.prob_a, self.prob_b, k)
            return label, pt.apply(self.transform, probs)
        if k <= 2:
            mode = np.full(pairs.shape[0], 2 if self.transform is pt.PostTransform.NONE else 0)
            if self.transform is pt.PostTransform.PROBIT:
                return label, np.stack([pt.probit(pairs[:, 0]), pairs[:, 0] * 0], 1)
            return label, pt.second_class(pt.PostTransform.NONE, pairs[:, 0], mode)
        return label, pt.apply(self.transform, pairs)


def _coupled(pairs: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray, k: int) -> np.ndarray:
    """Class probabilities [N, k] from one-vs-one scores: Platt's sigmoid per pair, then
    libsvm's pairwise coupling (Wu, Lin and Weng 2004), in float32 as onnxruntime."""
    f32 = np.float32
    n = pairs.shape[0]
    r = np.zeros((n, k, k), f32)
    index = 0
    for i in range(k - 1):
        for j in range(i + 1, k):
            v = pairs[:, index] * f32(prob_a[index]) + f32(prob_b[index])
            p = np.clip(f32(1) - pt.logistic(v.astype(f32)), f32(1e-7), f32(1 - 1e-7))
            r[:, i, j] = p
            r[:, j, i] = 1 - p
            index += 1
    q = np.zeros((n, k, k), f32)
    for i in range(k):
        for j in range(k):
            if j != i:
                q[:, i, i] += r[:, j, i] * r[:, j, i]
        for j in range(k):
            if j < i:
                q[:, i, j] = q[:, j, i]
            elif j > i:
                q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), f32(1.0 / k), f32)
    eps = f32(0.005 / k)
    live = np.ones(n, bool)
    for _ in range(100):
        qp = np.einsum("nij,nj->ni", q, p).astype(f32)
        pqp = (p * qp).sum(1).astype(f32)
        live &= np.abs(qp - pqp[:, None]).max(1) >= eps
        if not live.any():
            break
        for i in range(k):
            diff = np.where(live, (-qp[:, i] + pqp) / q[:, i, i], f32(0)).astype(f32)
            p[:, i] += diff
            pqp = (pqp + diff * (diff * q[:, i, i] + 2 * qp[:, i])) / (1 + diff) / (1 + diff)
            qp = (qp + diff[:, None] * q[:, i, :]) / (1 + diff)[:, None]
            p /= (1 + diff)[:, None]
    return p
