"""LINEAR_CLASSIFIER: ai.onnx.ml LinearClassifier, scores = X coefficients^T + intercepts,
the top class and onnxruntime's post-transform (one score with two labels widens to
[1 - s, s])."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.ml import post_transform as pt
from sporenet.lite.ops import OpCode


class LinearClassifier(Kernel):
    """inputs: X [N, F] (or [F]), coefficients [K, F], intercepts [K]; outputs label index
    int64 [N] and scores float32 [N, K] ([N, 2] when K is 1 and there are two labels)."""

    op = OpCode.LINEAR_CLASSIFIER
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype.kind not in "iuf" or x.rank not in (1, 2):
            raise self.fail(f"X must be a numeric [N, F] tensor, got {x.dtype}{list(x.shape)}")
        coefficients = self.constant(1, "coefficients").astype(np.float32)
        intercepts = self.constant(2, "intercepts").astype(np.float32).ravel()
        features = x.shape[-1]
        if coefficients.ndim != 2 or coefficients.shape[1] != features:
            raise self.fail(
                f"coefficients must be [classes, {features}], got {list(coefficients.shape)}"
            )
        if intercepts.size not in (0, coefficients.shape[0]):
            raise self.fail(
                f"intercepts must hold {coefficients.shape[0]} values, got {intercepts.size}"
            )
        self.weights = np.ascontiguousarray(coefficients.T)
        self.bias = intercepts if intercepts.size else np.zeros(coefficients.shape[0], np.float32)
        self.transform = pt.parse(attrs.str("post_transform", "NONE"), self.fail)
        self.n_labels = attrs.int("n_labels", coefficients.shape[0])
        k = coefficients.shape[0]
        self.widen = k == 1 and self.n_labels == 2
        batch = x.shape[0] if x.rank == 2 else 1
        self.output_specs = [
            TensorSpec((batch,), np.dtype(np.int64)),
            TensorSpec((batch, 2 if self.widen else k), np.dtype(np.float32)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        label, out = outputs
        w, b, transform, widen = self.weights, self.bias, self.transform, self.widen

        def compute() -> None:
            s = x.reshape(-1, w.shape[0]).astype(np.float32, copy=False) @ w + b
            if s.shape[1] == 1:
                label[...] = s[:, 0] > 0
                if transform is pt.PostTransform.PROBIT:
                    out[:, 0] = pt.probit(s[:, 0])
                elif widen:
                    out[...] = np.stack([1 - s[:, 0], s[:, 0]], axis=1)
                else:
                    out[...] = s
                return
            label[...] = np.argmax(s, axis=1)
            out[...] = pt.apply(transform, s)

        return compute
