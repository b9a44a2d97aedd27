"""CONV2D_BACKPROP_FILTER's second output, the bias gradient, on every path of the filter
gradient (per-image planes, wide rows, image blocks, whole-batch GEMM, depthwise),
against float64 references; and the training graph that asks for it in place of a
REDUCE_SUM."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.graph import Graph, Model, Node, Signature, Tensor
from sporenet.lite.kernels.training import conv_grad
from sporenet.lite.training import Trainer, make_training_model
from sporenet.lite.training.config import OptimizerConfig

rng = np.random.default_rng(23)

# name: (x shape, w shape, strides, pads, dilations, group, the path it takes)
CASES = {
    "one channel": ((3, 1, 9, 8), (5, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, "_bind_planes"),
    "narrow groups": ((2, 6, 7, 7), (4, 3, 3, 3), [2, 1], [1, 0, 1, 2], [1, 1], 2, "_bind_planes"),
    "wide rows": ((3, 8, 10, 12), (6, 8, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, "_bind_wide_rows"),
    "wide rows dilated": (
        (2, 8, 11, 20),
        (3, 8, 3, 3),
        [1, 1],
        [2, 2, 1, 2],
        [2, 2],
        1,
        "_bind_wide_rows",
    ),
    "strided blocks": (
        (3, 8, 9, 9),
        (4, 8, 3, 3),
        [2, 2],
        [1, 1, 0, 0],
        [1, 1],
        1,
        "_bind_image_blocks",
    ),
    "grouped blocks": (
        (2, 16, 6, 6),
        (6, 8, 3, 3),
        [1, 1],
        [1, 1, 1, 1],
        [1, 1],
        2,
        "_bind_image_blocks",
    ),
    "depthwise": ((2, 4, 7, 6), (8, 1, 3, 3), [1, 2], [1, 1, 1, 1], [1, 1], 4, "_bind_depthwise"),
}


def filter_reference(g, x, w_shape, strides, pads, dilations, group):
    """dW and db in float64: each output's gradient times the input element each tap
    reads, summed over the batch and positions."""
    g, x = g.astype(np.float64), x.astype(np.float64)
    o, cig, kh, kw = w_shape
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh, ow = g.shape[2:]
    (sh, sw), (dh, dw) = strides, dilations
    dw_ref = np.zeros(w_shape)
    cog = o // group
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            tap = xp[:, :, rows, cols]  # (N, C, OH, OW)
            for q in range(group):
                gq = g[:, q * cog : (q + 1) * cog]
                xq = tap[:, q * cig : (q + 1) * cig]
                dw_ref[q * cog : (q + 1) * cog, :, i, j] = np.einsum("nohw,nchw->oc", gq, xq)
    return dw_ref, g.sum(axis=(0, 2, 3))


@pytest.fixture
def paths(monkeypatch):
    """The filter gradient's binds, each recorded by name when it runs."""
    taken: list[str] = []
    cls = conv_grad.Conv2DBackpropFilter
    for name in ("_bind_planes", "_bind_wide_rows", "_bind_image_blocks", "_bind_depthwise"):
        real = getattr(cls, name)

        def recorded(self, *args, _real=real, _name=name):
            taken.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(cls, name, recorded)
    return taken


@pytest.mark.parametrize("name", list(CASES))
def test_bias_gradient_output_on_every_path(name, paths):
    xs, ws, strides, pads, dilations, group, path = CASES[name]
    x = rng.normal(size=xs).astype(np.float32)
    w = np.zeros(ws, np.float32)
    attrs = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    (y,) = run_op(OpCode.CONV2D, [x, rng.normal(size=ws).astype(np.float32)], **attrs)
    g = rng.normal(size=y.shape).astype(np.float32)
    dw_ref, db_ref = filter_reference(g, x, ws, strides, pads, dilations, group)
    (alone,) = run_op(OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], **attrs)
    dw, db = run_op(OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], num_outputs=2, **attrs)
    assert paths == [path, path], "the case did not take the path it checks"
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, db_ref, rtol=1e-4, atol=1e-4)
    # The ones row leaves the filter gradient's own products unchanged.
    np.testing.assert_allclose(dw, alone, rtol=1e-5, atol=1e-5)


def test_whole_batch_gemm_sums_the_bias_too(monkeypatch):
    # Above the per-image budget the filter gradient is one GEMM over the batch, whose
    # columns carry no ones row: the bias gradient is summed from g after it.
    monkeypatch.setattr(conv_grad, "_PER_IMAGE_BYTES", 0)
    xs, ws, strides, pads, dilations, group, _ = CASES["strided blocks"]
    x = rng.normal(size=xs).astype(np.float32)
    attrs = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    g = rng.normal(size=(xs[0], ws[0], 4, 4)).astype(np.float32)
    dw, db = run_op(
        OpCode.CONV2D_BACKPROP_FILTER, [g, x, np.zeros(ws, np.float32)], num_outputs=2, **attrs
    )
    dw_ref, db_ref = filter_reference(g, x, ws, strides, pads, dilations, group)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, db_ref, rtol=1e-4, atol=1e-4)


def _conv_model() -> Model:
    """x (N, 3, 8, 8) -> CONV2D (4 filters, bias) -> RELU -> REDUCE_MEAN over C, H, W (N,)."""
    draw = np.random.default_rng(5)  # the same weights on every call
    w = draw.normal(size=(4, 3, 3, 3)).astype(np.float32) * 0.3
    b = draw.normal(size=4).astype(np.float32)
    tensors = [
        Tensor("x", np.dtype(np.float32), (-1, 3, 8, 8)),
        Tensor("w", np.dtype(np.float32), w.shape, data=w),
        Tensor("b", np.dtype(np.float32), b.shape, data=b),
        Tensor("y", np.dtype(np.float32), (-1, 4, 8, 8)),
        Tensor("r", np.dtype(np.float32), (-1, 4, 8, 8)),
        Tensor("out", np.dtype(np.float32), (-1,)),
    ]
    nodes = [
        Node(OpCode.CONV2D, [0, 1, 2], [3], {"pads": [1, 1, 1, 1]}),
        Node(OpCode.RELU, [3], [4]),
        Node(OpCode.REDUCE_MEAN, [4], [5], {"axes": [1, 2, 3], "keepdims": 0}),
    ]
    graph = Graph(name="main", inputs=[0], outputs=[5], nodes=nodes)
    sig = Signature(key="infer", graph=0, inputs={"x": 0}, outputs={"out": 5})
    return Model(tensors=tensors, graphs=[graph], signatures={"infer": sig})


def test_training_graph_fuses_the_bias_gradient_and_trains_the_same(monkeypatch):
    from sporenet.lite.training import model as training_model

    opt = OptimizerConfig(kind="sgd", lr=0.1)
    fused = make_training_model(_conv_model(), output="out", loss="mse", optimizer=opt)
    monkeypatch.setattr(training_model, "_bias_into_filter_gradients", lambda n, k: n)
    apart = make_training_model(_conv_model(), output="out", loss="mse", optimizer=opt)
    nodes = fused.graphs[fused.signature("train").graph].nodes
    filters = [n for n in nodes if n.op == OpCode.CONV2D_BACKPROP_FILTER]
    assert [len(n.outputs) for n in filters] == [2]
    assert OpCode.REDUCE_SUM not in [n.op for n in nodes]
    x = rng.normal(size=(5, 3, 8, 8)).astype(np.float32)
    target = rng.normal(size=5).astype(np.float32)
    trainers = [Trainer(fused), Trainer(apart)]
    for _ in range(3):
        losses = [t.step({"x": x, "labels": target}) for t in trainers]
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    for name in ("w", "b"):
        ours, ref = (t.weights()[name] for t in trainers)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_gradient_through_both_outputs_matches_finite_differences():
    # Differentiating a graph that holds the fused node (a checkpoint trained further with
    # second-order terms): g's cotangent takes the filter's and the bias's parts.
    from tests.unit.autodiff.gradcheck import check_op

    def build(b, g, x, w):
        dw, db = b.op_multi(
            OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], 2, pads=[1, 0, 1, 1], strides=[1, 2]
        )
        return b.op(OpCode.ADD, [dw, b.op(OpCode.RESHAPE, [db], shape=[3, 1, 1, 1])])

    draw = np.random.default_rng(3)
    check_op(
        build,
        {"g": draw.normal(size=(2, 3, 5, 3)), "x": draw.normal(size=(2, 2, 5, 6))},
        {"w": np.zeros((3, 2, 3, 3))},
        wrt=["g", "x"],
    )
