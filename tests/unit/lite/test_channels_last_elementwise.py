"""Elementwise kernels and global average pooling on channels-last storage.

A squeeze-excite block (depthwise conv, GlobalAveragePool, two 1x1 convs, HardSigmoid,
Mul by the [N, C, 1, 1] gate, a 1x1 projection) runs with no transposing copy: the
pooling and the elementwise kernels accept channels-last operands, and an elementwise
output follows the layout of its input (Kernel.channels_last_follows). Each kernel is also
checked directly on channels-last views against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.kernels.base import TensorSpec

RNG = np.random.default_rng(11)
F32 = np.dtype(np.float32)


def _last(shape: tuple[int, ...]) -> np.ndarray:
    """An (N, C, H, W) view of channels-last memory."""
    n, c, h, w = shape
    return np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)


def _is_last(a: np.ndarray) -> bool:
    return a.ndim == 4 and not a.flags.c_contiguous and a.transpose(0, 2, 3, 1).flags.c_contiguous


def _bind(op: OpCode, inputs: list[np.ndarray], out: np.ndarray, **attrs) -> None:
    """Bind the kernel on exactly these arrays and run its step once."""
    specs = [TensorSpec(a.shape, a.dtype) for a in inputs]
    kernel = prepare_kernel(op, attrs, specs, 1)
    step = kernel.bind(list(inputs), [out])
    if step is not None:
        step()


def _se_block(b, x, c, weights):
    def conv(t, c_in, c_out, k, group=1, act="none"):
        w = RNG.normal(size=(c_out, c_in // group, k, k)).astype(np.float32) * 0.3
        bv = RNG.normal(size=c_out).astype(np.float32) * 0.1
        attrs = dict(pads=[k // 2] * 4, group=group, activation=act)
        weights.append((w, bv, attrs))
        n = len(weights)
        return b.op(OpCode.CONV2D, [t, b.constant(f"w{n}", w), b.constant(f"b{n}", bv)], **attrs)

    e = conv(x, 8, c, 1, act="hard_swish")
    d = conv(e, c, c, 5, group=c, act="hard_swish")
    g = b.op(OpCode.GLOBAL_AVG_POOL, [d])
    s = conv(conv(g, c, c // 4, 1, act="relu"), c // 4, c, 1)
    s = b.op(OpCode.HARD_SIGMOID, [s], alpha=0.2, beta=0.5)
    m = b.op(OpCode.MUL, [d, s])
    p = conv(m, c, 8, 1)
    return b.op(OpCode.ADD, [p, x]), (e, d, m, p)


def test_squeeze_excite_block_runs_channels_last_and_matches_nchw_ops():
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 8, 3, 24))
    y, inner = _se_block(b, x, 32, weights)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 8, 3, 24)).astype(np.float32)

    def conv(t, i):
        w, bv, attrs = weights[i]
        return run_op(OpCode.CONV2D, [t, w, bv], **attrs)[0]

    d = conv(conv(xv, 0), 1)
    s = conv(conv(d.mean(axis=(2, 3), keepdims=True), 2), 3)
    gate = np.clip(0.2 * s + 0.5, 0, 1)
    want = conv(d * gate, 4) + xv
    np.testing.assert_allclose(interp.run({"x": xv})["y"], want, rtol=1e-4, atol=1e-4)
    arrays = interp._plan.arrays
    # The expand, depthwise, gated and projected tensors are all channels-last: the
    # pooling and the Mul read the depthwise result where it is.
    assert all(_is_last(arrays[i]) for i in inner)
    assert arrays[interp._plan.outputs[0]].flags.c_contiguous


@pytest.mark.parametrize(
    "op,formula",
    [
        (OpCode.RELU, lambda x: np.maximum(x, 0)),
        (OpCode.RELU6, lambda x: np.clip(x, 0, 6)),
        (OpCode.HARD_SIGMOID, lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
        (OpCode.HARD_SWISH, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
        (OpCode.SIGMOID, lambda x: 1 / (1 + np.exp(-x))),
        (OpCode.TANH, np.tanh),
        (OpCode.LEAKY_RELU, lambda x: np.where(x > 0, x, 0.01 * x)),
    ],
)
@pytest.mark.parametrize("layouts", ["last-last", "last-nchw", "nchw-last"])
def test_unary_activations_on_channels_last_views(op, formula, layouts):
    shape = (1, 12, 3, 5)
    value = (RNG.normal(size=shape) * 5).astype(np.float32)
    x = _last(shape) if layouts.startswith("last") else np.empty(shape, np.float32)
    out = _last(shape) if layouts.endswith("last") else np.empty(shape, np.float32)
    x[...] = value
    _bind(op, [x], out)
    np.testing.assert_allclose(out, formula(value.astype(np.float64)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "op,ufunc",
    [
        (OpCode.ADD, np.add),
        (OpCode.MUL, np.multiply),
        (OpCode.SUB, np.subtract),
        (OpCode.MAXIMUM, np.maximum),
    ],
)
@pytest.mark.parametrize("b_shape", [(1, 16, 3, 4), (1, 16, 1, 1), (16, 1, 1), (4,), ()])
@pytest.mark.parametrize("b_last", [False, True])
def test_binary_broadcasting_on_channels_last_views(op, ufunc, b_shape, b_last):
    shape = (1, 16, 3, 4)
    a = _last(shape)
    a[...] = RNG.normal(size=shape)
    bv = RNG.normal(size=b_shape).astype(np.float32)
    if b_last and len(b_shape) == 4:
        b = _last(b_shape)
        b[...] = bv
    else:
        b = bv
    out = _last(shape)
    _bind(op, [a, b], out)
    np.testing.assert_allclose(out, ufunc(np.array(a), bv), rtol=1e-6)
    # The operand order is kept (Sub is not symmetric), with `a` broadcast as well.
    out2 = _last(shape)
    _bind(op, [b, a], out2)
    np.testing.assert_allclose(out2, ufunc(bv, np.array(a)), rtol=1e-6)


def test_binary_with_fused_activation_on_channels_last_views():
    shape = (2, 8, 2, 3)
    a, b, out = _last(shape), _last(shape), _last(shape)
    a[...], b[...] = RNG.normal(size=shape) * 4, RNG.normal(size=shape) * 4
    _bind(OpCode.ADD, [a, b], out, activation="relu6")
    np.testing.assert_allclose(out, np.clip(np.array(a) + np.array(b), 0, 6), rtol=1e-6)


@pytest.mark.parametrize("shape", [(1, 40, 3, 96), (2, 7, 5, 5), (1, 1280, 3, 3)])
def test_global_average_pool_reads_channels_last(shape):
    x = _last(shape)
    x[...] = RNG.normal(size=shape)
    out = np.empty((*shape[:2], 1, 1), np.float32)
    _bind(OpCode.GLOBAL_AVG_POOL, [x], out)
    want = np.array(x, np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _pointwise_chain(c_mid: int, hw: int):
    """depthwise -> narrowing 1x1 -> widening 1x1 with a bias -> depthwise."""
    b = ModelBuilder(producer="test")
    weights: list = []

    def conv(t, c_in, c_out, k, group=1):
        w = RNG.normal(size=(c_out, c_in // group, k, k)).astype(np.float32) * 0.3
        bv = RNG.normal(size=c_out).astype(np.float32)
        attrs = dict(pads=[k // 2] * 4, group=group, activation="relu6")
        weights.append((w, bv, attrs))
        n = len(weights)
        return b.op(OpCode.CONV2D, [t, b.constant(f"w{n}", w), b.constant(f"b{n}", bv)], **attrs)

    x = b.input("x", (1, 32, hw, hw))
    d = conv(x, 32, 32, 3, group=32)
    p = conv(d, 32, c_mid, 1)
    e = conv(p, c_mid, 96, 1)
    b.output(conv(e, 96, 96, 3, group=96), name="y")
    return b.build(), weights, p


@pytest.mark.parametrize("hw,p_last", [(24, False), (6, True)])
def test_a_large_widening_pointwise_keeps_its_input_nchw(hw, p_last):
    # The narrowing 1x1 layer reads channels-last rows; its output follows into
    # channels-last unless its only reader, a widening 1x1 layer with a bias and a large
    # output, reads NCHW rows faster (Kernel.leans_nchw).
    model, weights, p = _pointwise_chain(8, hw)
    interp = Interpreter(model=model, num_threads=1)
    xv = RNG.normal(size=(1, 32, hw, hw)).astype(np.float32)
    want = xv
    for w, bv, attrs in weights:
        (want,) = run_op(OpCode.CONV2D, [want, w, bv], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], want, rtol=1e-4, atol=1e-4)
    assert _is_last(interp._plan.arrays[p]) == p_last


@pytest.mark.parametrize("out_last", [False, True])
@pytest.mark.parametrize("op, ufunc", [(OpCode.ADD, np.add), (OpCode.MUL, np.multiply)])
def test_binary_op_whose_output_layout_differs_from_both_inputs(op, ufunc, out_last):
    # Both operands in one layout and the output in the other: the ufunc runs in the
    # operands' layout into a temporary, then one copy writes the output.
    shape = (1, 5, 6, 7)
    a, b = (_last(shape) if not out_last else np.empty(shape, np.float32) for _ in range(2))
    a[...] = RNG.normal(size=shape)
    b[...] = RNG.normal(size=shape)
    out = _last(shape) if out_last else np.empty(shape, np.float32)
    _bind(op, [a, b], out)
    assert _is_last(out) == out_last
    np.testing.assert_array_equal(out, ufunc(np.array(a), np.array(b)))
