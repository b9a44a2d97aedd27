"""The ONNX reference helper and eager runner agree on a simple op (guards the test harness)."""

import numpy as np

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from tests.unit.lite.onnx_reference import run_onnx_op


def test_add_matches_onnxruntime_with_broadcasting():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 3, 4)).astype(np.float32)
    b = rng.normal(size=(3, 1)).astype(np.float32)
    (ours,) = run_op(OpCode.ADD, [a, b])
    (ref,) = run_onnx_op("Add", [a, b])
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    np.testing.assert_allclose(ours, a + b, rtol=1e-6)
