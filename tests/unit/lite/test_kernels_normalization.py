"""BatchNorm (inference), LRN and InstanceNorm against NumPy references and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from tests.unit.lite.onnx_reference import run_onnx_op

# float32 arithmetic against float64 references (LRN adds a pow).
RTOL, ATOL = 1e-5, 1e-5


def _bn_params(rng, c):
    scale = rng.normal(size=c).astype(np.float32)
    bias = rng.normal(size=c).astype(np.float32)
    mean = rng.normal(size=c).astype(np.float32)
    var = rng.uniform(0.1, 2.0, size=c).astype(np.float32)
    return scale, bias, mean, var


@pytest.mark.parametrize("shape", [(2, 3), (1, 4, 5), (2, 3, 4, 5), (1, 2, 3, 2, 2)])
@pytest.mark.parametrize("constant", [True, False])
def test_batch_norm(shape, constant):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    params = _bn_params(rng, shape[1])
    (ours,) = run_op(
        OpCode.BATCH_NORM, [x, *params], epsilon=1e-3, constant_inputs=None if constant else [0]
    )
    scale, bias, mean, var = (
        p.astype(np.float64).reshape(-1, *[1] * (len(shape) - 2)) for p in params
    )
    ref = scale * (x - mean) / np.sqrt(var + 1e-3) + bias
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    (ort,) = run_onnx_op(
        "BatchNormalization", [x, *params], initializers=[1, 2, 3, 4], epsilon=1e-3
    )
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)


def lrn_reference(x, size, alpha, beta, bias):
    c = x.shape[1]
    out = np.empty(x.shape)
    x64 = x.astype(np.float64)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + (size - 1) - (size - 1) // 2)
        square_sum = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
        out[:, ch] = x64[:, ch] / (bias + alpha / size * square_sum) ** beta
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1, 6, 4, 4), (2, 3, 5, 2)])
def test_lrn(size, shape):
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32) * 3
    attrs = dict(size=size, alpha=0.2, beta=0.75, bias=2.0)
    (ours,) = run_op(OpCode.LRN, [x], **attrs)
    np.testing.assert_allclose(ours, lrn_reference(x, **attrs), rtol=RTOL, atol=ATOL)
    if size % 2:  # onnxruntime only implements odd sizes; the ONNX spec defines both
        (ort,) = run_onnx_op("LRN", [x], **attrs)
        np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", [(1, 3, 4, 5), (2, 4, 7), (2, 2, 3, 2, 2)])
def test_instance_norm(shape):
    rng = np.random.default_rng(2)
    x = rng.normal(size=shape).astype(np.float32) * 2 + 1
    scale = rng.normal(size=shape[1]).astype(np.float32)
    bias = rng.normal(size=shape[1]).astype(np.float32)
    (ours,) = run_op(OpCode.INSTANCE_NORM, [x, scale, bias], epsilon=1e-4)
    axes = tuple(range(2, len(shape)))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = x64.var(axis=axes, keepdims=True)
    cshape = (-1, *[1] * (len(shape) - 2))
    ref = scale.reshape(cshape) * (x64 - mean) / np.sqrt(var + 1e-4) + bias.reshape(cshape)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    (ort,) = run_onnx_op(
        "InstanceNormalization", [x, scale, bias], initializers=[1, 2], epsilon=1e-4
    )
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)


def test_normalization_shape_errors():
    x = np.zeros((1, 3, 4, 4), np.float32)
    good = [np.ones(3, np.float32)] * 4
    with pytest.raises(ShapeError, match=r"var \(input 4\) must have shape \[3\]"):
        run_op(OpCode.BATCH_NORM, [x, *good[:3], np.ones(4, np.float32)])
    with pytest.raises(ShapeError, match="training_mode"):
        run_op(OpCode.BATCH_NORM, [x, *good], training_mode=1)
    with pytest.raises(ShapeError, match="'size' must be a positive int"):
        run_op(OpCode.LRN, [x])
    with pytest.raises(ShapeError, match="rank >= 3"):
        run_op(OpCode.INSTANCE_NORM, [np.zeros((2, 3), np.float32), *good[:2]])
    with pytest.raises(ShapeError, match=r"scale \(input 1\) must have shape \[3\]"):
        run_op(OpCode.INSTANCE_NORM, [x, np.ones(2, np.float32), good[0]])
