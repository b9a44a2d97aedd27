"""A 1-D convolution exported as Unsqueeze -> Conv -> Squeeze -> Add(bias) -> Relu (tf2onnx's
Keras Conv1D): the bias folds into the Conv through the Squeeze and the activation fuses
into it through the reshape; near misses keep the Add; outputs do not change."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes import fold_biases, fuse_activations
from sporenet.lite import Interpreter, ModelBuilder, OpCode, serialize
from sporenet.lite.graph import Model

RNG = np.random.default_rng(5)
C_IN, C_OUT, WIDTH = 3, 4, 9


def _rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _conv1d(
    bias_shape: tuple[int, ...] = (1, C_OUT, 1),
    squeeze_axes: tuple[int, ...] = (2,),
    dtype: type = np.float32,
    relu: bool = True,
    conv_output: bool = False,
) -> Model:
    b = ModelBuilder()
    x = b.input("x", (1, C_IN, WIDTH), dtype=dtype)
    x4 = b.op(OpCode.UNSQUEEZE, [x], axes=[2])
    w = b.constant("w", _rand(C_OUT, C_IN, 1, 3, dtype=dtype))
    y4 = b.op(OpCode.CONV2D, [x4, w], pads=[0, 1, 0, 1])
    if conv_output:
        b.output(y4, name="conv")
    y = b.op(OpCode.SQUEEZE, [y4], axes=list(squeeze_axes))
    y = b.op(OpCode.ADD, [y, b.constant("bias", _rand(*bias_shape, dtype=dtype))])
    if relu:
        y = b.op(OpCode.RELU, [y])
    b.output(y, name="y")
    return b.build()


def _run(model: Model, x: np.ndarray) -> dict[str, np.ndarray]:
    return Interpreter(model_content=serialize(model)).run({"x": x})


def _rewrite(model: Model, dtype: type = np.float32, tol: float = 1e-6) -> Model:
    x = _rand(1, C_IN, WIDTH, dtype=dtype)
    before = _run(model, x)
    rewritten = copy.deepcopy(model)
    fold_biases(rewritten)
    fuse_activations(rewritten)
    after = _run(rewritten, x)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=tol, atol=tol, err_msg=name)
    return rewritten


def _ops(model: Model) -> list[str]:
    return [n.op.name for n in model.graphs[0].nodes]


@pytest.mark.parametrize("bias_shape", [(1, C_OUT, 1), (C_OUT, 1)], ids=str)
def test_bias_and_relu_fold_into_the_conv_through_the_squeeze(bias_shape) -> None:
    folded = _rewrite(_conv1d(bias_shape))
    assert _ops(folded) == ["UNSQUEEZE", "CONV2D", "SQUEEZE"]
    conv = folded.graphs[0].nodes[1]
    assert len(conv.inputs) == 3 and conv.attrs["activation"] == "relu"


def test_float16_conv1d_folds_within_float16_rounding() -> None:
    # One rounding to float16 instead of two (conv output, then the sum): within a step.
    folded = _rewrite(_conv1d(dtype=np.float16), np.float16, tol=4e-3)
    assert _ops(folded) == ["UNSQUEEZE", "CONV2D", "SQUEEZE"]


@pytest.mark.parametrize(
    "options",
    [
        {"bias_shape": (1, 1, WIDTH)},  # one value per position, not per channel
        {"conv_output": True},  # the conv output has another reader
    ],
    ids=["per-position", "conv-output-read"],
)
def test_near_misses_keep_the_add(options) -> None:
    model = _conv1d(**options)
    rewritten = copy.deepcopy(model)
    assert fold_biases(rewritten) == 0
    fuse_activations(rewritten)
    conv = rewritten.graphs[0].nodes[1]
    assert "ADD" in _ops(rewritten)  # the Relu fuses into the Add instead
    assert len(conv.inputs) == 2 and "activation" not in conv.attrs
    x = _rand(1, C_IN, WIDTH)
    before, after = _run(model, x), _run(rewritten, x)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-6, atol=1e-6)


def test_relu_after_a_reshape_of_a_conv_with_another_reader_stays() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, C_IN, 1, WIDTH))
    y4 = b.op(OpCode.CONV2D, [x, b.constant("w", _rand(C_OUT, C_IN, 1, 3))], pads=[0, 1, 0, 1])
    b.output(b.op(OpCode.RELU, [b.op(OpCode.SQUEEZE, [y4], axes=[2])]), name="y")
    b.output(b.op(OpCode.NEG, [y4]), name="n")
    model = b.build()
    assert fuse_activations(model) == 0
