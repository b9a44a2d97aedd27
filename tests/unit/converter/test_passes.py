"""Each graph pass alone, on small IR models built with ModelBuilder and run for real."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes import (
    eliminate_dead_nodes,
    fold_batch_norms,
    fold_biases,
    fold_constants,
    fuse_activations,
    fuse_hard_swish,
    infer_shapes,
    remove_identities,
    remove_noop_layout,
)
from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize
from sporenet.lite.graph import Model
from tests.unit.lite.quantized_reference import quant

RNG = np.random.default_rng(1)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(model: Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model after a serialize/parse round trip (a pass must leave a valid file)."""
    return Interpreter(model_content=serialize(model)).run(feeds)


def ops(model: Model) -> list[str]:
    return [n.op.name for n in model.graphs[0].nodes]


def check_rewrite(
    model: Model,
    rewrite,
    feeds: dict[str, np.ndarray],  # type: ignore[no-untyped-def]
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> Model:
    """Apply `rewrite` to a copy; outputs must agree with the original."""
    before = run(model, feeds)
    rewritten = copy.deepcopy(model)
    count = rewrite(rewritten)
    assert count > 0, "the pass found nothing to rewrite"
    after = run(rewritten, feeds)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=rtol, atol=atol, err_msg=name)
    return rewritten


def conv_bn(bias: bool, activation: str | None = None) -> Model:
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 8, 8))
    inputs = [x, b.constant("w", rand(4, 3, 3, 3))]
    if bias:
        inputs.append(b.constant("b", rand(4)))
    y = b.op(OpCode.CONV2D, inputs, pads=[1, 1, 1, 1])
    stats = [
        b.constant("gamma", rand(4)),
        b.constant("beta", rand(4)),
        b.constant("mean", rand(4)),
        b.constant("var", np.abs(rand(4)) + 0.5),
    ]
    y = b.op(OpCode.BATCH_NORM, [y, *stats], epsilon=1e-3)
    if activation:
        y = b.op(OpCode.RELU, [y])
    b.output(y, name="y")
    return b.build()


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_folds_into_conv(bias: bool) -> None:
    model = conv_bn(bias)
    folded = check_rewrite(model, fold_batch_norms, {"x": rand(2, 3, 8, 8)})
    assert ops(folded) == ["CONV2D"]


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_folding_rewrites_parameters_in_place(bias: bool) -> None:
    # A weight (and bias) read only by the folded convolution keeps its tensor and name.
    # atol: the folded float32 weights round differently from conv-then-normalize, which
    # shows as about 1e-6 absolute on outputs near zero.
    folded = check_rewrite(conv_bn(bias), fold_batch_norms, {"x": rand(2, 3, 8, 8)}, atol=1e-5)
    conv = folded.graphs[0].nodes[0]
    names = [folded.tensors[i].name for i in conv.inputs[1:]]
    assert names == (["w", "b"] if bias else ["w", "w/bn_bias"])


def test_batchnorm_folding_leaves_a_shared_weight_alone() -> None:
    # Two convolutions read the same weight; only the one before the BatchNorm is folded.
    b = ModelBuilder()
    x = b.input("x", (1, 3, 6, 6))
    w = b.constant("w", rand(3, 3, 1, 1))
    y = b.op(OpCode.CONV2D, [x, w])
    stats = [
        b.constant(n, v)
        for n, v in (("g", rand(3)), ("be", rand(3)), ("m", rand(3)), ("v", np.abs(rand(3)) + 0.1))
    ]
    y = b.op(OpCode.BATCH_NORM, [y, *stats])
    b.output(b.op(OpCode.CONV2D, [y, w]), name="y")
    model = b.build()
    original = model.tensors[w].data.copy()
    folded = check_rewrite(model, fold_batch_norms, {"x": rand(1, 3, 6, 6)})
    first, second = folded.graphs[0].nodes
    assert folded.tensors[first.inputs[1]].name == "w/bn_folded"
    assert folded.tensors[second.inputs[1]].name == "w"
    np.testing.assert_array_equal(folded.tensors[second.inputs[1]].data, original)


def test_batchnorm_folds_into_fully_connected() -> None:
    b = ModelBuilder()
    x = b.input("x", (5, 6))
    y = b.op(OpCode.FULLY_CONNECTED, [x, b.constant("w", rand(4, 6)), b.constant("b", rand(4))])
    stats = [
        b.constant(n, v)
        for n, v in (("g", rand(4)), ("be", rand(4)), ("m", rand(4)), ("v", np.abs(rand(4)) + 0.1))
    ]
    b.output(b.op(OpCode.BATCH_NORM, [y, *stats]), name="y")
    folded = check_rewrite(b.build(), fold_batch_norms, {"x": rand(5, 6)})
    assert ops(folded) == ["FULLY_CONNECTED"]


def test_batchnorm_folds_into_weights_the_runtime_computes() -> None:
    # Weights produced by a node (a fill kept small in the file) get a Mul node instead.
    b = ModelBuilder()
    x = b.input("x", (1, 2, 5, 5))
    w = b.op(OpCode.EXPAND, [b.constant("fill", np.array(0.1, np.float32))], shape=[3, 2, 1, 1])
    y = b.op(OpCode.CONV2D, [x, w])
    stats = [
        b.constant(n, v)
        for n, v in (("g", rand(3)), ("be", rand(3)), ("m", rand(3)), ("v", np.abs(rand(3)) + 0.1))
    ]
    b.output(b.op(OpCode.BATCH_NORM, [y, *stats]), name="y")
    folded = check_rewrite(b.build(), fold_batch_norms, {"x": rand(1, 2, 5, 5)})
    assert "BATCH_NORM" not in ops(folded) and "MUL" in ops(folded)


def test_batchnorm_is_not_folded_when_the_conv_output_has_other_readers() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 2, 4, 4))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(2, 2, 1, 1))])
    stats = [
        b.constant(n, v)
        for n, v in (("g", rand(2)), ("be", rand(2)), ("m", rand(2)), ("v", np.abs(rand(2)) + 0.1))
    ]
    b.output(b.op(OpCode.BATCH_NORM, [y, *stats]), name="bn")
    b.output(y, name="conv")
    model = b.build()
    assert fold_batch_norms(model) == 0


@pytest.mark.parametrize(
    ("act", "attrs", "expected"),
    [
        (OpCode.RELU, {}, {"activation": "relu"}),
        (OpCode.RELU6, {}, {"activation": "relu6"}),
        (OpCode.CLIP, {"min": 0.0, "max": 6.0}, {"activation": "relu6"}),
        (OpCode.CLIP, {"min": -0.5, "max": 0.5}, {"activation": "clip"}),
        (OpCode.SIGMOID, {}, {"activation": "sigmoid"}),
        (OpCode.TANH, {}, {"activation": "tanh"}),
        (OpCode.LEAKY_RELU, {"alpha": 0.2}, {"activation": "leaky_relu", "alpha": 0.2}),
        (OpCode.HARD_SWISH, {}, {"activation": "hard_swish"}),
    ],
)
@pytest.mark.parametrize("producer", [OpCode.CONV2D, OpCode.FULLY_CONNECTED, OpCode.ADD])
def test_activation_fuses_into_producer(
    act: OpCode, attrs: dict, expected: dict, producer: OpCode
) -> None:
    b = ModelBuilder()
    if producer == OpCode.CONV2D:
        x = b.input("x", (1, 2, 5, 5))
        y = b.op(producer, [x, b.constant("w", rand(3, 2, 3, 3)), b.constant("b", rand(3))])
        feeds = {"x": rand(1, 2, 5, 5) * 3}
    elif producer == OpCode.FULLY_CONNECTED:
        x = b.input("x", (4, 6))
        y = b.op(producer, [x, b.constant("w", rand(5, 6))])
        feeds = {"x": rand(4, 6) * 3}
    else:
        x = b.input("x", (4, 6))
        y = b.op(producer, [x, b.constant("c", rand(6))])
        feeds = {"x": rand(4, 6) * 3}
    b.output(b.op(act, [y], **attrs), name="y")
    fused = check_rewrite(b.build(), fuse_activations, feeds)
    assert ops(fused) == [producer.name]
    node = fused.graphs[0].nodes[0]
    assert {k: node.attrs[k] for k in expected} == expected


def test_identity_and_dropout_are_removed() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.op(OpCode.IDENTITY, [x])
    y = b.op(OpCode.RELU, [y])
    b.output(b.op(OpCode.IDENTITY, [y]), name="y")
    removed = check_rewrite(b.build(), remove_identities, {"x": rand(2, 3)})
    assert ops(removed) == ["RELU"]


def test_identity_from_input_to_output_is_kept() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    b.output(b.op(OpCode.IDENTITY, [x]), name="y")
    model = b.build()
    assert remove_identities(model) == 0
    assert ops(model) == ["IDENTITY"]


def test_noop_reshape_and_identity_transpose_are_removed() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4))
    y = b.op(OpCode.RESHAPE, [x], shape=[2, 3, 4])
    y = b.op(OpCode.TRANSPOSE, [y], perm=[0, 1, 2])
    y = b.op(OpCode.RELU, [y])
    b.output(y, name="y")
    removed = check_rewrite(b.build(), remove_noop_layout, {"x": rand(2, 3, 4)})
    assert ops(removed) == ["RELU"]


def test_transpose_pairs_cancel_and_reshape_chains_merge() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4))
    y = b.op(OpCode.TRANSPOSE, [x], perm=[2, 0, 1])
    y = b.op(OpCode.TRANSPOSE, [y], perm=[1, 2, 0])  # composes to the identity
    y = b.op(OpCode.RESHAPE, [y], shape=[6, 4])
    y = b.op(OpCode.RESHAPE, [y], shape=[4, 6])
    b.output(b.op(OpCode.RELU, [y]), name="y")
    removed = check_rewrite(b.build(), remove_noop_layout, {"x": rand(2, 3, 4)})
    assert ops(removed) == ["RESHAPE", "RELU"]


def test_transposes_compose_into_one() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4))
    y = b.op(OpCode.TRANSPOSE, [x], perm=[1, 0, 2])
    y = b.op(OpCode.TRANSPOSE, [y], perm=[0, 2, 1])
    b.output(b.op(OpCode.RELU, [y]), name="y")
    merged = check_rewrite(b.build(), remove_noop_layout, {"x": rand(2, 3, 4)})
    assert ops(merged) == ["TRANSPOSE", "RELU"]


def test_reshape_with_a_dynamic_dimension_is_kept() -> None:
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    b.output(b.op(OpCode.RELU, [b.op(OpCode.RESHAPE, [x], shape=[-1, 4])]), name="y")
    model = b.build()
    assert remove_noop_layout(model) == 0


def test_constant_folding_evaluates_constant_subgraphs() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    c = b.op(OpCode.MUL, [b.constant("a", rand(3)), b.constant("k", np.array(2, np.float32))])
    c = b.op(OpCode.EXP, [c])
    b.output(b.op(OpCode.ADD, [x, c]), name="y")
    folded = check_rewrite(b.build(), fold_constants, {"x": rand(2, 3)})
    assert ops(folded) == ["ADD"]


def test_constant_folding_computes_with_the_int8_kernel_that_runs() -> None:
    """An Add of two quantized int8 constants folds to what the runtime's int8 Add gives
    (requantized to the output's scale), not to the sum of the stored integers."""
    b = ModelBuilder()
    x = b.input("x", (4,), np.int8)
    b.quantize(x, 0.5, 0)
    values = np.array([100, -100, 60, 7], np.int8)
    a = b.constant("a", values, quantization=quant(0.05, 0))
    k = b.constant("k", values, quantization=quant(0.1, 3))
    c = b.quantize(b.op(OpCode.ADD, [a, k]), 0.25, -2, dtype=np.int8)
    b.output(b.quantize(b.op(OpCode.ADD, [x, c]), 0.5, 0, dtype=np.int8), name="y")
    model = b.build()
    feeds = {"x": np.array([1, -2, 3, 0], np.int8)}
    folded = copy.deepcopy(model)
    assert fold_constants(folded) == 1
    assert ops(folded) == ["ADD"]
    # The planner folds the same node at load time with the int8 kernel: same bits.
    np.testing.assert_array_equal(run(folded, feeds)["y"], run(model, feeds)["y"])
    real = values * 0.05 + (values.astype(np.float64) - 3) * 0.1
    expected = np.clip(np.round(real / 0.25) - 2, -128, 127)
    (stored,) = [t.data for t in folded.tensors if t.name == model.tensors[c].name]
    np.testing.assert_allclose(stored, expected, atol=1)  # rounding of the half cases


def test_constant_folding_keeps_large_fills_as_nodes() -> None:
    b = ModelBuilder()
    x = b.input("x", (256, 256))
    fill = b.op(OpCode.EXPAND, [b.constant("v", np.array(0.5, np.float32))], shape=[256, 256])
    b.output(b.op(OpCode.ADD, [x, fill]), name="y")
    model = b.build()
    assert fold_constants(model) == 0
    assert ops(model) == ["EXPAND", "ADD"]


def test_dead_nodes_and_their_tensors_are_removed() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    b.op(OpCode.SIGMOID, [b.op(OpCode.TANH, [x])])  # reaches no output
    unused = b.constant("unused", rand(100))
    b.output(b.op(OpCode.RELU, [x]), name="y")
    model = b.build()
    tensors = len(model.tensors)
    cleaned = check_rewrite(model, eliminate_dead_nodes, {"x": rand(2, 3)})
    assert ops(cleaned) == ["RELU"]
    assert len(cleaned.tensors) == tensors - 3
    assert all(t.name != model.tensors[unused].name for t in cleaned.tensors)


def test_shape_inference_fills_shapes_and_keeps_dynamic_dims() -> None:
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 8, 8))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(4, 3, 3, 3))], strides=[2, 2])
    b.output(b.op(OpCode.FLATTEN, [y]), name="y")
    model = b.build(infer_shapes=False)
    assert infer_shapes(model) == 2
    out = model.tensors[model.graphs[0].outputs[0]]
    assert out.shape == (-1, 36) and out.dtype == np.float32
    conv_out = model.tensors[model.graphs[0].nodes[0].outputs[0]]
    assert conv_out.shape == (-1, 4, 3, 3)
    parse(serialize(model))


@pytest.mark.parametrize("gate_first", [False, True])
def test_hard_sigmoid_times_x_becomes_hard_swish(gate_first: bool) -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4, 4))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(3, 3, 1, 1))])
    gate = b.op(OpCode.HARD_SIGMOID, [y], alpha=1 / 6, beta=0.5)
    b.output(b.op(OpCode.MUL, [gate, y] if gate_first else [y, gate]), name="y")
    model = b.build()
    fused = check_rewrite(model, fuse_hard_swish, {"x": rand(2, 3, 4, 4) * 4})
    assert ops(fused) == ["CONV2D", "HARD_SWISH"]
    assert fuse_activations(fused) == 1 and ops(fused) == ["CONV2D"]


def test_other_hard_sigmoids_are_left_alone() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    gate = b.op(OpCode.HARD_SIGMOID, [x], alpha=0.2, beta=0.5)
    b.output(b.op(OpCode.MUL, [x, gate]), name="y")
    assert fuse_hard_swish(b.build()) == 0


@pytest.mark.parametrize("form", ["div", "mul_sixth", "swapped"])
def test_x_times_clip_x_plus_3_over_6_becomes_hard_swish(form: str) -> None:
    # Paddle's export of HardSwish: x * Clip(x + 3, 0, 6) / 6.
    b = ModelBuilder()
    x = b.input("x", (1, 3, 4, 4))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(3, 3, 1, 1))])
    three = b.constant("three", np.array(3, np.float32))
    shifted = b.op(OpCode.ADD, [three, y] if form == "swapped" else [y, three])
    gate = b.op(OpCode.CLIP, [shifted], min=0.0, max=6.0)
    product = b.op(OpCode.MUL, [gate, y] if form == "swapped" else [y, gate])
    if form == "mul_sixth":
        out = b.op(OpCode.MUL, [product, b.constant("k", np.array(1 / 6, np.float32))])
    else:
        out = b.op(OpCode.DIV, [product, b.constant("k", np.array(6, np.float32))])
    b.output(out, name="y")
    fused = check_rewrite(b.build(), fuse_hard_swish, {"x": rand(1, 3, 4, 4) * 4})
    assert ops(fused) == ["CONV2D", "HARD_SWISH"]
    assert fuse_activations(fused) == 1 and ops(fused) == ["CONV2D"]


def test_clip_form_with_other_constants_is_left_alone() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    shifted = b.op(OpCode.ADD, [x, b.constant("two", np.array(2, np.float32))])
    gate = b.op(OpCode.CLIP, [shifted], min=0.0, max=6.0)
    product = b.op(OpCode.MUL, [x, gate])
    b.output(b.op(OpCode.DIV, [product, b.constant("k", np.array(6, np.float32))]), name="y")
    assert fuse_hard_swish(b.build()) == 0


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), (1,)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_add_of_a_per_channel_constant_folds_into_the_conv_bias(shape, bias: bool) -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 3, 5, 5))
    inputs = [x, b.constant("w", rand(4, 3, 3, 3))] + ([b.constant("b", rand(4))] if bias else [])
    y = b.op(OpCode.CONV2D, inputs, pads=[1, 1, 1, 1])
    b.output(b.op(OpCode.ADD, [y, b.constant("offset", rand(*shape))]), name="y")
    folded = check_rewrite(b.build(), fold_biases, {"x": rand(1, 3, 5, 5)})
    assert ops(folded) == ["CONV2D"]
    assert len(folded.graphs[0].nodes[0].inputs) == 3


def test_add_that_is_not_a_per_channel_constant_stays() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 3, 5, 5))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(4, 3, 3, 3))], pads=[1, 1, 1, 1])
    spatial = b.op(OpCode.ADD, [y, b.constant("map", rand(1, 1, 5, 5))])
    other = b.op(OpCode.CONV2D, [x, b.constant("w2", rand(4, 3, 1, 1))])
    b.output(b.op(OpCode.ADD, [other, spatial]), name="y")
    assert fold_biases(b.build()) == 0
