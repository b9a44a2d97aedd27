"""The engine itself: path selection, accumulation, errors, dynamic batch, reshape/dropout."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode, ShapeError, UnsupportedOpError
from sporenet.lite.autodiff import GRADIENT_RULES, append_gradients
from sporenet.lite.planner import plan
from tests.unit.autodiff.gradcheck import check_op, rand


def test_gradient_rules_cover_the_differentiable_ops_of_issue_4():
    required = {
        "FULLY_CONNECTED",
        "MATMUL",
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "RELU",
        "RELU6",
        "CLIP",
        "LEAKY_RELU",
        "SIGMOID",
        "TANH",
        "HARD_SWISH",
        "GELU",
        "RESHAPE",
        "FLATTEN",
        "DROPOUT",
        "SOFTMAX_CROSS_ENTROPY",
        "MSE_LOSS",
        "BCE_WITH_LOGITS",
    }
    assert required <= {op.name for op in GRADIENT_RULES}


def test_reshape_flatten_identity():
    def build(b, x):
        y = b.op(OpCode.RESHAPE, [x], shape=[2, 12])
        return b.op(OpCode.IDENTITY, [b.op(OpCode.FLATTEN, [y], axis=1)])

    check_op(build, {"x": rand(2, 3, 4, seed=1)}, torch_fn=lambda x: x.reshape(2, 12))


def test_unsupported_op_lists_the_missing_rule():
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.op(OpCode.FLOOR, [x])
    t = b.constant("t", np.zeros((2, 3), np.float32))
    loss = b.op(OpCode.MSE_LOSS, [y, t])
    b.output(loss)
    model = b.build()
    with pytest.raises(UnsupportedOpError, match="no gradient rule for FLOOR"):
        append_gradients(model, 0, loss, [x])


def test_loss_must_be_a_scalar():
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.op(OpCode.RELU, [x])
    b.output(y)
    model = b.build()
    with pytest.raises(ShapeError, match="must be a float scalar"):
        append_gradients(model, 0, y, [x])


def _mlp(batch=-1):
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (batch, 3))
    w = b.constant("w", rng.normal(size=(4, 3)).astype(np.float32))
    unused = b.constant("unused", np.ones(4, np.float32))
    h = b.op(OpCode.FULLY_CONNECTED, [x, w], activation="relu")
    t = b.input("t", (batch, 4))
    loss = b.op(OpCode.MSE_LOSS, [h, t])
    b.output(loss, "loss")
    return b.build(), x, w, unused, loss


def test_disconnected_tensor_gets_a_zero_gradient_and_batch_stays_dynamic():
    model, x, w, unused, loss = _mlp()
    grads = append_gradients(model, 0, loss, [w, unused])
    model.graphs[0].outputs += [grads[w], grads[unused]]
    # The backward graph is valid for any batch size: plan it for two.
    for n in (2, 5):
        p = plan(model, "infer", {x: (n, 3), model.graphs[0].inputs[1]: (n, 4)})
        p.arrays[x][...] = 1
        p.arrays[model.graphs[0].inputs[1]][...] = 0
        p.run()
        assert p.arrays[grads[w]].shape == (4, 3)
        np.testing.assert_array_equal(p.arrays[grads[unused]], np.zeros(4, np.float32))
        assert np.any(p.arrays[grads[w]] != 0)


def test_backward_nodes_only_for_tensors_that_need_gradients():
    # Differentiating with respect to w only: no data gradient for x (the first layer's
    # input) is computed.
    model, _, w, _, loss = _mlp()
    before = len(model.graphs[0].nodes)
    append_gradients(model, 0, loss, [w])
    new = model.graphs[0].nodes[before:]
    assert OpCode.MATMUL not in {n.op for n in new}  # dx = g @ W is skipped
    assert OpCode.MATMUL_TRANSPOSED in {n.op for n in new}


def test_dropout_training_mode_gradient_is_the_mask():
    b = ModelBuilder()
    x = b.input("x", (8, 16), np.float64)
    y, mask = b.op_multi(OpCode.DROPOUT, [x], 2, ratio=0.25, training=1, seed=3)
    t = b.tensor("t", (8, 16), np.float64, data=np.zeros((8, 16)))
    loss = b.op(OpCode.MSE_LOSS, [y, t])
    b.output(loss)
    b.output(mask)
    model = b.build()
    grads = append_gradients(model, 0, loss, [x])
    model.graphs[0].outputs.append(grads[x])
    p = plan(model)
    xv = rand(8, 16, seed=1)
    p.arrays[x][...] = xv
    p.run()
    m = p.arrays[mask]
    kept = m != 0
    assert 0.5 < kept.mean() < 0.95  # about 75% kept
    np.testing.assert_allclose(m[kept], 1 / 0.75)
    np.testing.assert_allclose(p.arrays[y], xv * m)
    np.testing.assert_allclose(p.arrays[grads[x]], 2 * xv * m / xv.size * m, rtol=1e-12)
    first = m.copy()
    p.run()
    assert not np.array_equal(first, p.arrays[mask])  # a fresh mask every step


def test_without_shape_inference_on_a_graph_with_concrete_shapes():
    # The eager-tape case: shapes are concrete already; gradients are the same.
    from sporenet.lite.eager import run_op

    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (4, 3), np.float64)
    w = b.tensor("w", (2, 3), np.float64, data=rng.normal(size=(2, 3)))
    y = b.op(OpCode.FULLY_CONNECTED, [x, w], activation="tanh")
    t = b.tensor("t", (4, 2), np.float64, data=rng.normal(size=(4, 2)))
    loss = b.op(OpCode.MSE_LOSS, [y, t])
    b.output(loss)
    with_inference = b.build()
    without = b.build(infer_shapes=False)
    for i in (y, loss):  # what an eager tape records
        without.tensors[i] = with_inference.tensors[i]
    xv = rng.normal(size=(4, 3))
    results = []
    for model, infer in ((with_inference, True), (without, False)):
        grads = append_gradients(model, 0, loss, [w], infer_shapes=infer)
        values = {
            x: xv,
            **{i: tt.data for i, tt in enumerate(model.tensors) if tt.data is not None},
        }
        for node in model.graphs[0].nodes:
            outs = run_op(
                node.op,
                [values[i] if i != -1 else None for i in node.inputs],
                num_outputs=len(node.outputs),
                **node.attrs,
            )
            values.update(zip(node.outputs, outs, strict=True))
        results.append(values[grads[w]])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-12)
    assert np.any(results[0] != 0)
