"""float16 nodes of BLAS-bound ops run through float32 kernels (lite/kernels/float16.py):
the same values as a float64 reference rounded to float16 where the graph stores
float16, and float16 outputs."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.eager import prepare_kernel
from sporenet.lite.format import serialize
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.kernels.float16 import Float32Compute
from sporenet.lite.ops import OpCode

F16 = np.float16
RNG = np.random.default_rng(3)


def _h(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F16)


def test_conv_fc_and_matmul_in_float16_match_a_float64_reference() -> None:
    x, w1, b1 = _h(2, 8, 5, 5), _h(16, 8, 3, 3), _h(16)
    w2, m = _h(10, 16 * 3 * 3), _h(10, 4)
    b = ModelBuilder()
    xi = b.input("x", x.shape, F16)
    c = b.op(OpCode.CONV2D, [xi, b.constant("w1", w1), b.constant("b1", b1)])
    flat = b.op(OpCode.RESHAPE, [c, b.constant("s", np.array([2, -1], np.int64))])
    fc = b.op(OpCode.FULLY_CONNECTED, [flat, b.constant("w2", w2)])
    b.output(b.op(OpCode.MATMUL, [fc, b.constant("m", m)]), "y")
    model = b.build()
    assert all(t.dtype == F16 for t in model.tensors if t.name in ("y",))
    got = Interpreter(model_content=serialize(model)).run({"x": x})["y"]
    assert got.dtype == F16

    # float64 reference, rounded to float16 where the graph holds a float16 tensor.
    x64, w64 = x.astype(np.float64), w1.astype(np.float64)
    cols = np.lib.stride_tricks.sliding_window_view(x64, (3, 3), axis=(2, 3))
    conv = np.einsum("nchwij,ocij->nohw", cols, w64) + b1.astype(np.float64)[:, None, None]
    conv = conv.astype(F16).astype(np.float64).reshape(2, -1)
    fc_ref = (conv @ w2.astype(np.float64).T).astype(F16).astype(np.float64)
    want = (fc_ref @ m.astype(np.float64)).astype(F16)
    # float32 accumulation rounds differently from float64 only far below float16's step.
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_only_float16_nodes_are_widened(dtype: type) -> None:
    spec = TensorSpec((2, 4), np.dtype(dtype))
    weight = TensorSpec((3, 4), np.dtype(dtype), np.ones((3, 4), dtype))
    kernel = prepare_kernel(OpCode.FULLY_CONNECTED, {}, [spec, weight], 1)
    assert isinstance(kernel, Float32Compute) == (dtype is np.float16)
    assert kernel.output_specs[0].dtype == np.dtype(dtype)
