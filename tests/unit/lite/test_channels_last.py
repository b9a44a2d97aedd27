"""Channels-last storage of tensors between convolutions (planner + Conv2D).

The planner stores a 4-D tensor channels-last when its producer and all its readers
accept it and one prefers it (Kernel.channels_last_input/output). Results must be those
of the all-NCHW plan, which every kernel test checks against references.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite import planner as planner_module
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import im2col
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, _data, conv_reference

RNG = np.random.default_rng(3)


def stored(a: np.ndarray, channels_last: bool) -> np.ndarray:
    """`a` (N, C, H, W) as the planner stores it: contiguous, or a view of NHWC memory."""
    if not channels_last:
        return a.copy()
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _conv(b, x, c_in, c_out, k, *, stride=1, group=1, bias=True, act="none", weights=None):
    w = RNG.normal(size=(c_out, c_in // group, k, k)).astype(np.float32) * 0.3
    ins = [x, b.constant(f"w{len(weights)}", w)]
    bv = RNG.normal(size=c_out).astype(np.float32) if bias else None
    if bias:
        ins.append(b.constant(f"b{len(weights)}", bv))
    pads = [k // 2] * 4
    attrs = dict(strides=[stride, stride], pads=pads, group=group, activation=act)
    weights.append((w, bv, attrs))
    return b.op(OpCode.CONV2D, ins, **attrs)


def _net(batch: int):
    """An inverted-residual block, a strided one, a 1x1 chain, a Winograd-sized 3x3 conv
    after a depthwise, and a depthwise result that is also a graph output."""
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (batch, 8, 12, 12))
    e = _conv(b, x, 8, 48, 1, act="relu6", weights=weights)
    d = _conv(b, e, 48, 48, 3, group=48, act="relu6", weights=weights)
    p = _conv(b, d, 48, 8, 1, bias=False, weights=weights)
    r = b.op(OpCode.ADD, [x, p])
    e2 = _conv(b, r, 8, 40, 1, act="relu", weights=weights)
    d2 = _conv(b, e2, 40, 40, 3, stride=2, group=40, weights=weights)
    p2 = _conv(b, d2, 40, 32, 1, act="relu6", weights=weights)
    q = _conv(b, p2, 32, 32, 1, weights=weights)
    d3 = _conv(b, q, 32, 32, 3, group=32, act="relu6", weights=weights)
    y = _conv(b, d3, 32, 32, 3, weights=weights)
    b.output(y, name="y")
    b.output(d3, name="d3")
    return b.build(), weights


def _reference(x: np.ndarray, weights: list) -> dict[str, np.ndarray]:
    """The same graph op by op with contiguous NCHW arrays (eager kernels)."""

    def conv(t, i):
        w, bv, attrs = weights[i]
        (out,) = run_op(OpCode.CONV2D, [t, w] + ([bv] if bv is not None else []), **attrs)
        return out

    p = conv(conv(conv(x, 0), 1), 2)
    d2 = conv(conv(x + p, 3), 4)
    d3 = conv(conv(conv(d2, 5), 6), 7)
    return {"y": conv(d3, 8), "d3": d3}


def _check_between_depthwise(op, attrs, in_c: int, out_c: int) -> None:
    """depthwise -> op -> depthwise: the middle op reads and writes channels-last storage
    (no transposing pass) and computes what the eager NCHW op does."""
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, in_c, 7, 9))
    d = _conv(b, x, in_c, in_c, 3, group=in_c, weights=weights)
    u = b.op(op, [d], **attrs)
    y = _conv(b, u, out_c, out_c, 3, group=out_c, weights=weights)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, in_c, 7, 9)).astype(np.float32)
    conv = [
        lambda t, i=i: run_op(OpCode.CONV2D, [t, weights[i][0], weights[i][1]], **weights[i][2])[0]
        for i in range(2)
    ]
    (mid,) = run_op(op, [conv[0](xv)], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], conv[1](mid), rtol=1e-5, atol=1e-5)
    node = interp.model.graphs[0].nodes[1]
    assert node.op == op
    for tensor in (node.inputs[0], node.outputs[0]):
        array = interp._plan.arrays[tensor]
        assert not array.flags.c_contiguous
        assert array.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize("batch", [1, 2])
def test_channels_last_plan_matches_the_nchw_ops(batch):
    model, weights = _net(batch)
    interp = Interpreter(model=model, num_threads=1)
    x = RNG.normal(size=(batch, 8, 12, 12)).astype(np.float32)
    ours = interp.run({"x": x})
    ref = _reference(x, weights)
    for name in ("y", "d3"):
        np.testing.assert_allclose(ours[name], ref[name], rtol=1e-4, atol=1e-4)
    # The layout is really in use: the expand, depthwise and 1x1 outputs of the first
    # block are channels-last, graph outputs stay contiguous NCHW.
    arrays = interp._plan.arrays
    last = [i for i, a in arrays.items() if a.ndim == 4 and not a.flags.c_contiguous]
    assert len(last) >= 4
    for a in (arrays[i] for i in last):
        assert a.transpose(0, 2, 3, 1).flags.c_contiguous
    for i in interp._plan.outputs:
        assert arrays[i].flags.c_contiguous


def test_a_reader_that_refuses_keeps_nchw(monkeypatch):
    # With every tensor NCHW the results are the same, and no tensor is channels-last.
    monkeypatch.setattr(planner_module, "channels_last_tensors", lambda *a: set())
    model, weights = _net(1)
    interp = Interpreter(model=model, num_threads=1)
    x = RNG.normal(size=(1, 8, 12, 12)).astype(np.float32)
    ours = interp.run({"x": x})
    np.testing.assert_allclose(ours["y"], _reference(x, weights)["y"], rtol=1e-4, atol=1e-4)
    assert all(a.flags.c_contiguous for a in interp._plan.arrays.values())


def test_add_reading_a_depthwise_output_reads_it_channels_last():
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 16, 6, 6))
    d = _conv(b, x, 16, 16, 3, group=16, weights=weights)
    y = b.op(OpCode.ADD, [d, x])
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 16, 6, 6)).astype(np.float32)
    w, bv, attrs = weights[0]
    (ref,) = run_op(OpCode.CONV2D, [xv, w, bv], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref + xv, rtol=1e-5, atol=1e-5)
    # The Add accepts the depthwise result channels-last (no transposing copy); the graph
    # output it writes stays NCHW.
    arrays = interp._plan.arrays
    assert (
        arrays[interp.model.graphs[0].nodes[0].outputs[0]]
        .transpose(0, 2, 3, 1)
        .flags["C_CONTIGUOUS"]
    )
    assert arrays[interp._plan.outputs[0]].flags.c_contiguous


def test_large_strided_depthwise_runs_channels_last_on_a_channels_last_input():
    # A column-strided depthwise layer on a large map runs planar on NCHW input but
    # channels-last when its input is stored channels-last (no transposing copy).
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 8, 42, 42))
    e = _conv(b, x, 8, 16, 1, act="relu6", weights=weights)
    d = _conv(b, e, 16, 16, 3, stride=2, group=16, act="relu6", weights=weights)
    b.output(_conv(b, d, 16, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 8, 42, 42)).astype(np.float32)
    ref = xv
    for w, bv, attrs in weights:
        (ref,) = run_op(OpCode.CONV2D, [ref, w, bv], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-4)
    last = [a for a in interp._plan.arrays.values() if a.ndim == 4 and not a.flags.c_contiguous]
    assert [a.shape for a in last] == [(1, 16, 42, 42), (1, 16, 21, 21)]


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "row-blocks"])
@pytest.mark.parametrize("bias", [True, False])
def test_im2col_writes_a_channels_last_output(monkeypatch, blocks, bias):
    # A strided 3x3 stem (im2col) before a depthwise layer writes channels-last.
    if blocks:
        monkeypatch.setattr(im2col, "_BLOCK_BYTES", 2000)
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 3, 20, 20))
    s = _conv(b, x, 3, 16, 3, stride=1, bias=bias, act="relu6", weights=weights)
    d = _conv(b, s, 16, 16, 3, group=16, weights=weights)
    b.output(_conv(b, d, 16, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 3, 20, 20)).astype(np.float32)
    ref = xv
    for w, bv, attrs in weights:
        (ref,) = run_op(OpCode.CONV2D, [ref, w] + ([bv] if bv is not None else []), **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-4)
    assert interp._plan.kernels[0].strategy == "im2col"
    stem_out = interp._plan.arrays[interp.model.graphs[0].nodes[0].outputs[0]]
    assert stem_out.transpose(0, 2, 3, 1).flags.c_contiguous
    assert not stem_out.flags.c_contiguous


@pytest.mark.parametrize("shape,o", [((1, 32, 12, 12), 48), ((1, 640, 3, 3), 640)])
def test_pointwise_with_run_time_weights_reads_them_every_call(shape, o):
    # A 1x1 layer whose weights are a graph input (not a constant) must not re-pack them
    # at bind: channels-last storage and the transposed head GEMM need constant weights.
    c = shape[1]
    wd = RNG.normal(size=(c, 1, 3, 3)).astype(np.float32)
    b = ModelBuilder(producer="test")
    x, w = b.input("x", shape), b.input("w", (o, c, 1, 1))
    d = b.op(OpCode.CONV2D, [x, b.constant("wd", wd)], pads=[1, 1, 1, 1], group=c)
    b.output(b.op(OpCode.CONV2D, [d, w]), name="y")
    interp = Interpreter(model=b.build())
    for seed in range(2):
        rng = np.random.default_rng(seed)
        xv = rng.normal(size=shape).astype(np.float32)
        wv = rng.normal(size=(o, c, 1, 1)).astype(np.float32)
        (dv,) = run_op(OpCode.CONV2D, [xv, wd], pads=[1, 1, 1, 1], group=c)
        (want,) = run_op(OpCode.CONV2D, [dv, wv])
        got = interp.run({"x": xv, "w": wv})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "op, attrs",
    [
        (OpCode.FLOOR, {}),
        (OpCode.ABS, {}),
        (OpCode.EXP, {}),
        (OpCode.SQUARE, {}),
        (OpCode.ELU, {"alpha": 0.5}),
        (OpCode.GELU, {}),
        (OpCode.CLIP, {"min": -0.5, "max": 0.7}),
        (OpCode.SILU, {}),
    ],
)
def test_unary_ops_between_depthwise_layers_stay_channels_last(op, attrs):
    _check_between_depthwise(op, attrs, 16, 16)


@pytest.mark.parametrize("batch,size", [(1, 16), (2, 14)], ids=["tiles-divide", "cropped-n2"])
def test_winograd_writes_a_channels_last_output(batch, size):
    # A Winograd layer (bias and fused ReLU) whose result only elementwise ops and a 1x1
    # layer read writes it channels-last; F(4x4) tiles divide 16 but overhang 14.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (batch, 16, size, size))
    c = _conv(b, x, 16, 16, 3, act="relu", weights=weights)
    s = b.op(OpCode.MUL, [c, b.op(OpCode.SIGMOID, [c])])
    b.output(_conv(b, s, 16, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    assert interp._plan.kernels[0].strategy == "winograd4"
    xv = RNG.normal(size=(batch, 16, size, size)).astype(np.float32)
    w, bv, attrs = weights[0]
    f64 = [a.astype(np.float64) for a in (xv, w, bv)]
    (ref,) = run_op(OpCode.CONV2D, f64, **attrs)
    ref = ref / (1 + np.exp(-ref))
    w, bv, attrs = weights[1]
    (ref,) = run_op(OpCode.CONV2D, [ref, w.astype(np.float64), bv.astype(np.float64)], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-4)
    conv_out = interp._plan.arrays[interp.model.graphs[0].nodes[0].outputs[0]]
    assert conv_out.transpose(0, 2, 3, 1).flags.c_contiguous
    assert not conv_out.flags.c_contiguous


def test_strided_im2col_reads_and_writes_channels_last_after_winograd():
    # A strided 3x3 layer (im2col) reading a Winograd result stored channels-last builds
    # its columns channels-last from it and writes channels-last rows for the elementwise
    # op and 1x1 layer after it.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 16, 16, 20))
    c = _conv(b, x, 16, 16, 3, weights=weights)
    s = _conv(b, c, 16, 24, 3, stride=2, act="relu", weights=weights)
    m = b.op(OpCode.MUL, [s, b.op(OpCode.SIGMOID, [s])])
    b.output(_conv(b, m, 24, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    assert [k.strategy for k in interp._plan.kernels[:2]] == ["winograd4", "im2col"]
    xv = RNG.normal(size=(1, 16, 16, 20)).astype(np.float32)
    ref = xv.astype(np.float64)
    for i, (w, bv, attrs) in enumerate(weights):
        if i == 2:
            ref = ref / (1 + np.exp(-ref))
        (ref,) = run_op(OpCode.CONV2D, [ref, w.astype(np.float64), bv.astype(np.float64)], **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-4)
    nodes, arrays = interp.model.graphs[0].nodes, interp._plan.arrays
    for i in (nodes[0].outputs[0], nodes[1].outputs[0]):
        assert arrays[i].transpose(0, 2, 3, 1).flags.c_contiguous
        assert not arrays[i].flags.c_contiguous


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_last", [True, False], ids=["out-last", "out-nchw"])
def test_small_im2col_builds_channels_last_columns_from_channels_last_input(bias, out_last):
    """A strided layer with a small column matrix reads a channels-last input through
    channels-last columns; its output, either layout, is the float64 reference's (with
    the bias and the fused activation)."""
    x, wt, b = _data(np.random.default_rng(15), 1, 12, 11, 14, 20, 1, (3, 3), bias)
    inputs = [x, wt] + ([b] if bias else [])
    spec = [TensorSpec(a.shape, a.dtype, None if k == 0 else a) for k, a in enumerate(inputs)]
    attrs = {"pads": [1, 0, 1, 1], "strides": [2, 2], "activation": "relu"}
    kernel = Conv2D(Attrs("Conv", attrs), spec)
    assert kernel.strategy == "im2col" and kernel.channels_last_follows(0) == 0
    oh, ow = kernel.output_specs[0].shape[2:]
    out = stored(np.full((1, 20, oh, ow), np.nan, np.float32), out_last)
    step = kernel.bind([stored(x, True), wt.copy()] + ([b] if bias else []), [out])
    step()
    step()
    ref = conv_reference(x, wt, b if bias else None, strides=(2, 2), pads=(1, 0, 1, 1))
    np.testing.assert_allclose(out, np.maximum(ref, 0), rtol=RTOL, atol=ATOL)


def test_residual_add_follows_its_channels_last_input():
    # Add(x, conv(x)) with x NCHW (a graph input) and the Winograd result channels-last
    # reads mixed layouts either way; its output follows the channels-last input, so the
    # Sigmoid and 1x1 layer after it run channels-last rather than converting.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 16, 16, 16))
    r = b.op(OpCode.ADD, [x, _conv(b, x, 16, 16, 3, weights=weights)])
    s = b.op(OpCode.SIGMOID, [r])
    b.output(_conv(b, s, 16, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 16, 16, 16)).astype(np.float32)
    (w, bv, attrs), (w1, bv1, attrs1) = weights
    f64 = [a.astype(np.float64) for a in (xv, w, bv)]
    (ref,) = run_op(OpCode.CONV2D, f64, **attrs)
    ref = 1 / (1 + np.exp(-(f64[0] + ref)))
    (ref,) = run_op(OpCode.CONV2D, [ref, w1.astype(np.float64), bv1.astype(np.float64)], **attrs1)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-4)
    nodes, arrays = interp.model.graphs[0].nodes, interp._plan.arrays
    add = next(n for n in nodes if n.op == OpCode.ADD)
    sigmoid = next(n for n in nodes if n.op == OpCode.SIGMOID)
    for i in (add.outputs[0], sigmoid.outputs[0]):
        assert arrays[i].transpose(0, 2, 3, 1).flags.c_contiguous
        assert not arrays[i].flags.c_contiguous


def test_text_line_block_runs_channels_last_from_winograd_to_pointwise():
    # ddddocr's recognizer block: a Winograd layer, a per-channel bias Add, Floor, a
    # scalar Mul, x * Sigmoid(x), DynamicQuantizeLinear and a 1x1 layer. Every tensor from
    # the Winograd result to the 1x1 layer's input stays channels-last (no step converts).
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 16, 8, 20))
    c = _conv(b, x, 16, 32, 3, bias=False, weights=weights)
    bias = RNG.normal(size=(1, 32, 1, 1)).astype(np.float32)
    a = b.op(OpCode.ADD, [c, b.constant("bias", bias)])
    f = b.op(OpCode.MUL, [b.op(OpCode.FLOOR, [a]), b.constant("half", np.float32(0.5))])
    s = b.op(OpCode.MUL, [f, b.op(OpCode.SIGMOID, [f])])
    q = b.op(OpCode.DYNAMIC_QUANTIZE, [s], num_outputs=3)  # the first of its outputs
    b.output(_conv(b, q, 32, 8, 1, bias=False, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 16, 8, 20)).astype(np.float32)
    (w, _, attrs), (w1, _, attrs1) = weights
    (ref,) = run_op(OpCode.CONV2D, [xv, w], **attrs)
    ref = np.floor(ref + bias) * np.float32(0.5)
    ref = ref / (1 + np.exp(-ref))
    (qv, _, _) = run_op(OpCode.DYNAMIC_QUANTIZE, [ref.astype(np.float32)], num_outputs=3)
    (ref,) = run_op(OpCode.CONV2D, [qv, w1], **attrs1)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-4, atol=1e-3)
    nodes, arrays = interp.model.graphs[0].nodes, interp._plan.arrays
    dq = next(n for n in nodes if n.op == OpCode.DYNAMIC_QUANTIZE)
    chain = [n.outputs[0] for n in nodes[: nodes.index(dq) + 1] if arrays[n.outputs[0]].ndim == 4]
    assert len(chain) == 7
    for i in chain:
        assert arrays[i].transpose(0, 2, 3, 1).flags.c_contiguous
        assert not arrays[i].flags.c_contiguous


@pytest.mark.parametrize("op", [OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.DIV, OpCode.MAXIMUM])
@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("n, gate_n, c", [(1, 1, 24), (2, 2, 16), (2, 1, 5), (1, 1, 700)])
def test_per_channel_operand_on_channels_last_storage(op, gate_first, constant, n, gate_n, c):
    # A bias or squeeze-excite gate (N or 1, C, 1, 1) against a channels-last tensor runs
    # as rows of several pixels (elementwise._channel_rows); the result must be NumPy's
    # broadcast, every call, also after the gate changes between calls.
    from sporenet.lite.eager import prepare_kernel
    from sporenet.lite.kernels.base import TensorSpec

    h, w = 6, 10
    x_last = np.empty((n, h, w, c), np.float32)
    out_last = np.empty((n, h, w, c), np.float32)
    x, out = x_last.transpose(0, 3, 1, 2), out_last.transpose(0, 3, 1, 2)
    gate = RNG.uniform(0.5, 2.0, size=(gate_n, c, 1, 1)).astype(np.float32)
    specs = [
        TensorSpec(x.shape, x.dtype),
        TensorSpec(gate.shape, gate.dtype, gate if constant else None),
    ]
    arrays = [x, gate]
    if gate_first:
        specs.reverse()
        arrays.reverse()
    kernel = prepare_kernel(op, {}, specs, 1)
    step = kernel.bind(arrays, [out])
    ufunc = kernel.ufunc
    for _ in range(2):
        x[...] = RNG.normal(size=x.shape)
        if not constant:
            gate[...] = RNG.uniform(0.5, 2.0, size=gate.shape)
        step()
        want = ufunc(gate, x) if gate_first else ufunc(x, gate)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("shape, other", [((2, 3, 4, 20), (20,)), ((1, 5, 6, 8), (1, 1, 8))])
def test_last_axis_operand_on_contiguous_nchw(shape, other):
    # The same row tiling serves any contiguous tensor whose other operand varies along
    # the last axis only (here W of an NCHW tensor): NumPy's broadcast, exactly.
    from sporenet.lite.eager import run_op

    x = RNG.normal(size=shape).astype(np.float32)
    y = RNG.normal(size=other).astype(np.float32)
    for op, ufunc in ((OpCode.SUB, np.subtract), (OpCode.MUL, np.multiply)):
        (got,) = run_op(op, [x, y], constant_inputs=[])
        np.testing.assert_array_equal(got, ufunc(x, y))
        (got,) = run_op(op, [y, x], constant_inputs=[1])
        np.testing.assert_array_equal(got, ufunc(y, x))


@pytest.mark.parametrize(
    "op,attrs",
    [
        (OpCode.MAX_POOL2D, dict(kernel_shape=[2, 2], strides=[2, 2])),
        (OpCode.MAX_POOL2D, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        (OpCode.AVG_POOL2D, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ],
    ids=["max-2x2", "max-3x3-padded", "avg-3x3-padded"],
)
def test_strided_block_with_pool_and_channel_pad_stays_channels_last(op, attrs):
    # A BlazeBlock's strided branch: depthwise -> {strided depthwise, pool -> channel
    # pad} -> add. The pool and the pad read and write channels-last storage, so the
    # depthwise output feeding both branches is stored channels-last too.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 8, 10, 10))
    d = _conv(b, x, 8, 8, 3, group=8, weights=weights)
    s = _conv(b, d, 8, 8, 3, stride=2, group=8, weights=weights)
    p = b.op(op, [d], **attrs)
    pad = b.op(OpCode.PAD, [p], pads=[0, 0, 0, 0, 0, 4, 0, 0])
    w = RNG.normal(size=(12, 8, 1, 1)).astype(np.float32)
    e = b.op(OpCode.CONV2D, [s, b.constant("we", w)])
    y = b.op(OpCode.ADD, [e, pad])
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 8, 10, 10)).astype(np.float32)
    conv = [
        lambda t, i=i: run_op(OpCode.CONV2D, [t, weights[i][0], weights[i][1]], **weights[i][2])[0]
        for i in range(2)
    ]
    dv = conv[0](xv)
    (pv,) = run_op(op, [dv], **attrs)
    (ev,) = run_op(OpCode.CONV2D, [conv[1](dv), w])
    ref = ev + np.pad(pv, [(0, 0), (0, 4), (0, 0), (0, 0)])
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-5, atol=1e-5)
    nodes = interp.model.graphs[0].nodes
    pool = next(n for n in nodes if n.op == op)
    pad_node = next(n for n in nodes if n.op == OpCode.PAD)
    for tensor in (pool.inputs[0], pool.outputs[0], pad_node.outputs[0]):
        array = interp._plan.arrays[tensor]
        assert not array.flags.c_contiguous
        assert array.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize(
    "op,attrs,out_c",
    [
        (OpCode.RESIZE, dict(mode="linear", sizes=[1, 32, 13, 18]), 32),
        (
            OpCode.RESIZE,
            dict(
                mode="linear", coordinate_transformation_mode="align_corners", scales=[1, 1, 2, 2]
            ),
            32,
        ),
        (
            OpCode.RESIZE,
            dict(mode="nearest", coordinate_transformation_mode="asymmetric", sizes=[1, 32, 5, 4]),
            32,
        ),
        (OpCode.DEPTH_TO_SPACE, dict(blocksize=2, mode="DCR"), 8),
        (OpCode.DEPTH_TO_SPACE, dict(blocksize=2, mode="CRD"), 8),
    ],
    ids=["linear-sizes", "linear-x2", "nearest", "d2s-dcr", "d2s-crd"],
)
def test_resize_and_depth_to_space_between_depthwise_layers_stay_channels_last(op, attrs, out_c):
    # a decoder's upsampling between depthwise layers
    _check_between_depthwise(op, attrs, 32, out_c)


@pytest.mark.parametrize("bias", [True, False])
def test_one_by_one_depthwise_on_channels_last_storage(bias):
    # A 1x1 depthwise layer (a per-channel scale and shift) between depthwise layers
    # reads and writes channels-last rows and gives the eager NCHW values.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 8, 6, 7))
    d = _conv(b, x, 8, 8, 3, group=8, weights=weights)
    s = _conv(b, d, 8, 8, 1, group=8, bias=bias, act="relu", weights=weights)
    y = _conv(b, s, 8, 8, 3, group=8, weights=weights)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 8, 6, 7)).astype(np.float32)
    ref = xv
    for w, bv, attrs in weights:
        (ref,) = run_op(OpCode.CONV2D, [ref, w] + ([bv] if bv is not None else []), **attrs)
    np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=1e-5, atol=1e-5)
    node = interp.model.graphs[0].nodes[1]
    for tensor in (node.inputs[0], node.outputs[0]):
        assert interp._plan.arrays[tensor].transpose(0, 2, 3, 1).flags.c_contiguous


def test_a_tensor_read_only_by_a_follower_of_channels_last_output_is_stored_so():
    # conv (im2col, 32 channels) -> PReLU -> depthwise: the depthwise prefers the
    # PReLU output channels-last, and the PReLU follows its input, so the planner stores
    # the conv output channels-last too (no PReLU pass across layouts).
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 3, 16, 16))
    c = _conv(b, x, 3, 32, 3, stride=2, weights=weights)
    slope = RNG.uniform(0, 0.5, size=(32, 1, 1)).astype(np.float32)
    p = b.op(OpCode.PRELU, [c, b.constant("slope", slope)])
    y = _conv(b, p, 32, 32, 3, group=32, weights=weights)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = RNG.normal(size=(1, 3, 16, 16)).astype(np.float32)
    conv = [
        lambda t, i=i: run_op(OpCode.CONV2D, [t, weights[i][0], weights[i][1]], **weights[i][2])[0]
        for i in range(2)
    ]
    (pv,) = run_op(OpCode.PRELU, [conv[0](xv), slope])
    np.testing.assert_allclose(interp.run({"x": xv})["y"], conv[1](pv), rtol=1e-5, atol=1e-5)
    node = interp.model.graphs[0].nodes[1]
    assert node.op == OpCode.PRELU
    for tensor in (node.inputs[0], node.outputs[0]):
        array = interp._plan.arrays[tensor]
        assert not array.flags.c_contiguous
        assert array.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize(
    "size,kernel,stride,pads",
    [
        ((3, 40, 36), 3, 2, [0, 0, 1, 1]),  # a strided stem: columns through the phases
        ((3, 30, 26), 5, 2, [2, 2, 2, 2]),
        ((4, 12, 10), 3, 1, [1, 1, 1, 1]),  # unstrided, padded
        ((3, 9, 11), 2, 1, [0, 0, 0, 0]),  # unstrided, unpadded: the column view itself
    ],
)
def test_an_image_stem_gathers_straight_from_the_nhwc_graph_input(size, kernel, stride, pads):
    # TFLite feeds images NHWC: the transpose to NCHW before an im2col layer is a view of
    # the graph input (no step, no copy), and every run reads the input set for it.
    c, h, w = size
    rng = np.random.default_rng(16)
    wt = (rng.normal(size=(8, c, kernel, kernel)) * 0.3).astype(np.float32)
    bv = rng.normal(size=8).astype(np.float32)
    b = ModelBuilder(producer="test")
    x = b.input("x", (1, h, w, c))
    nchw = b.op(OpCode.TRANSPOSE, [x], perm=[0, 3, 1, 2])
    attrs = {"strides": [stride, stride], "pads": pads}
    y = b.op(OpCode.CONV2D, [nchw, b.constant("w", wt), b.constant("b", bv)], **attrs)
    b.output(b.op(OpCode.RELU, [y]), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    assert [k.strategy for k in interp._plan.step_kernels if hasattr(k, "strategy")] == ["im2col"]
    assert "Transpose" not in [type(k).__name__ for k in interp._plan.step_kernels]
    for _ in range(2):
        xv = rng.normal(size=(1, h, w, c)).astype(np.float32)
        ref = conv_reference(
            xv.transpose(0, 3, 1, 2), wt, bv, strides=(stride, stride), pads=tuple(pads)
        )
        got = interp.run({"x": xv})["y"]
        np.testing.assert_allclose(got, np.maximum(ref, 0), rtol=RTOL, atol=ATOL)


def test_a_residual_add_reads_both_operands_in_one_layout():
    # The stem's output is read by a 1x1 layer and by the residual add (neither prefers
    # a layout); the branch ends channels-last after its depthwise layer. The stem's
    # output is then stored channels-last too, so the add is a pass in one order.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 3, 24, 20))
    s = _conv(b, x, 3, 16, 3, stride=2, weights=weights)
    e = _conv(b, s, 16, 16, 1, act="relu", weights=weights)
    d = _conv(b, e, 16, 16, 3, group=16, weights=weights)
    p = _conv(b, d, 16, 16, 1, weights=weights)
    r = b.op(OpCode.ADD, [s, p])
    b.output(_conv(b, r, 16, 8, 1, weights=weights), name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    nodes, arrays = interp.model.graphs[0].nodes, interp._plan.arrays
    add = next(n for n in nodes if n.op == OpCode.ADD)
    for tensor in add.inputs:
        assert arrays[tensor].transpose(0, 2, 3, 1).flags.c_contiguous
        assert not arrays[tensor].flags.c_contiguous
    xv = RNG.normal(size=(1, 3, 24, 20)).astype(np.float32)

    def conv(t, i):
        w, bv, attrs = weights[i]
        return run_op(OpCode.CONV2D, [t, w, bv], **attrs)[0]

    stem = conv(xv, 0)
    want = conv(stem + conv(conv(conv(stem, 1), 2), 3), 4)
    for _ in range(2):
        np.testing.assert_allclose(interp.run({"x": xv})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "k,stride,pads,group,c_out",
    [
        (2, 2, [0, 0, 0, 0], 1, 3),  # a decoder's 2x upsampling: taps tile the output
        (3, 2, [1, 1, 1, 1], 1, 4),  # overlapping taps: the scatter-add
        (3, 1, [1, 1, 1, 1], 1, 4),  # stride 1: the correlation
        (3, 2, [1, 1, 1, 1], 16, 16),  # one channel per group
    ],
)
def test_a_transposed_convolution_reads_a_channels_last_input(k, stride, pads, group, c_out):
    # After a depthwise layer (stored channels-last), the input gradient kernel that
    # TFLite's TRANSPOSE_CONV imports to reads its input in that layout as it is.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (1, 16, 7, 6))
    d = _conv(b, x, 16, 16, 3, group=16, weights=weights)
    wt = RNG.normal(size=(16, c_out // group, k, k)).astype(np.float32)
    shape = [1, c_out, 6 * stride + k - pads[0] - pads[2], 5 * stride + k - pads[1] - pads[3]]
    attrs = dict(strides=[stride, stride], pads=pads, group=group, input_shape=shape)
    y = b.op(OpCode.CONV2D_BACKPROP_INPUT, [d, b.constant("wt", wt)], **attrs)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    stored_d = interp._plan.arrays[interp.model.graphs[0].nodes[0].outputs[0]]
    assert not stored_d.flags.c_contiguous
    assert stored_d.transpose(0, 2, 3, 1).flags.c_contiguous
    xv = RNG.normal(size=(1, 16, 7, 6)).astype(np.float32)
    w0, b0, a0 = weights[0]
    (dv,) = run_op(OpCode.CONV2D, [xv, w0, b0], **a0)
    (want,) = run_op(OpCode.CONV2D_BACKPROP_INPUT, [dv, wt], **attrs)
    for _ in range(2):
        np.testing.assert_allclose(interp.run({"x": xv})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_widening_pointwise_between_channels_last_layers(batch):
    # depthwise -> 1x1 widening 8 to 40 channels (bias and ReLU6) -> depthwise: the 1x1
    # layer reads and writes channels-last storage, with its constant bias and ReLU6.
    b = ModelBuilder(producer="test")
    weights: list = []
    x = b.input("x", (batch, 8, 9, 11))
    d = _conv(b, x, 8, 8, 3, group=8, weights=weights)
    e = _conv(b, d, 8, 40, 1, act="relu6", weights=weights)
    y = _conv(b, e, 40, 40, 3, group=40, weights=weights)
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    pointwise = interp.model.graphs[0].nodes[1]
    for tensor in (pointwise.inputs[0], pointwise.outputs[0]):
        array = interp._plan.arrays[tensor]
        assert not array.flags.c_contiguous
        assert array.transpose(0, 2, 3, 1).flags.c_contiguous
    for seed in range(2):  # twice: scratch buffers are shared with other steps
        xv = np.random.default_rng(seed).normal(size=(batch, 8, 9, 11)).astype(np.float32)
        ref = xv
        for w, bv, attrs in weights:
            (ref,) = run_op(OpCode.CONV2D, [ref, w, bv], **attrs)
        np.testing.assert_allclose(interp.run({"x": xv})["y"], ref, rtol=RTOL, atol=ATOL)
