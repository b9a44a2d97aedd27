"""sporenet's int8 kernels against LiteRT's reference kernels (TFLite's integer
arithmetic itself), bit-exact.

The .tflite models are written in the test with the flatbuffer schema that ai-edge-litert
ships (no TensorFlow needed) and run with OpResolverType.BUILTIN_REF, TFLite's reference
kernels: the optimized ones may hand int8 layers to XNNPACK, which requantizes in float.
Layouts differ (TFLite is NHWC with OHWI filters); the test transposes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is a test extra")
schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
flatbuffers = pytest.importorskip("flatbuffers")

from sporenet.lite.ops import OpCode  # noqa: E402
from tests.unit.lite.quantized_reference import quant, random_q, run_one_op  # noqa: E402

_TYPES = {
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.uint8): schema.TensorType.UINT8,
}


class TFLiteOp:
    """One-op .tflite model: tensors are (shape, dtype, quant (scales, zero points), data)."""

    def __init__(self) -> None:
        self.tensors: list[Any] = []
        self.buffers: list[Any] = [schema.BufferT()]

    def tensor(self, shape, dtype, scales, zero_points, data=None, axis: int = 0) -> int:
        t = schema.TensorT()
        t.shape = list(shape)
        t.type = _TYPES[np.dtype(dtype)]
        t.name = f"t{len(self.tensors)}"
        q = schema.QuantizationParametersT()
        q.scale = [float(s) for s in np.atleast_1d(scales)]
        q.zeroPoint = [int(z) for z in np.atleast_1d(zero_points)]
        q.quantizedDimension = axis
        t.quantization = q
        t.buffer = 0
        if data is not None:
            buf = schema.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def build(
        self,
        code: int,
        version: int,
        inputs: list[int],
        output: int,
        options_type: int,
        options: Any,
    ) -> bytes:
        op = schema.OperatorT()
        op.opcodeIndex = 0
        op.inputs, op.outputs = inputs, [output]
        op.builtinOptionsType, op.builtinOptions = options_type, options
        graph = schema.SubGraphT()
        graph.tensors = self.tensors
        graph.inputs = [i for i in inputs if self.tensors[i].buffer == 0]
        graph.outputs = [output]
        graph.operators = [op]
        opcode = schema.OperatorCodeT()
        opcode.builtinCode = code
        opcode.deprecatedBuiltinCode = code
        opcode.version = version
        model = schema.ModelT()
        model.version = 3
        model.operatorCodes = [opcode]
        model.subgraphs = [graph]
        model.buffers = self.buffers
        b = flatbuffers.Builder(1024)
        b.Finish(model.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def run_litert(model: bytes, feeds: list[np.ndarray]) -> np.ndarray:
    interp = litert.Interpreter(
        model_content=model, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF
    )
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("stride, act", [(1, 0), (2, 3)])  # 3: RELU6
def test_conv2d_per_channel_matches_litert(stride, act):
    rng = np.random.default_rng(stride)
    n, c, h, w, o = 1, 5, 9, 9, 7
    x = random_q(rng, (n, c, h, w), np.int8)
    weights = rng.integers(-127, 128, (o, c, 3, 3)).astype(np.int8)
    sw = rng.uniform(0.002, 0.02, o).astype(np.float32)
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    sx, zx, so, zo = np.float32(0.03), -6, np.float32(0.08), 9
    oh = (h - 3) // stride + 1
    t = TFLiteOp()
    ti = t.tensor((n, h, w, c), np.int8, sx, zx)
    tw = t.tensor((o, 3, 3, c), np.int8, sw, [0] * o, weights.transpose(0, 2, 3, 1))
    tb = t.tensor((o,), np.int32, sx * sw, [0] * o, bias)
    to = t.tensor((n, oh, oh, o), np.int8, so, zo)
    opts = schema.Conv2DOptionsT(
        padding=schema.Padding.VALID, strideW=stride, strideH=stride, fusedActivationFunction=act
    )
    model = t.build(
        schema.BuiltinOperator.CONV_2D,
        3,
        [ti, tw, tb],
        to,
        schema.BuiltinOptions.Conv2DOptions,
        opts,
    )
    want = run_litert(model, [x.transpose(0, 2, 3, 1)]).transpose(0, 3, 1, 2)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(sx, zx), False), (weights, quant(sw), True), (bias, None, True)],
        quant(so, zo),
        np.int8,
        strides=[stride, stride],
        activation="relu6" if act == 3 else "none",
    )
    np.testing.assert_array_equal(got, want)


def test_fully_connected_matches_litert():
    rng = np.random.default_rng(5)
    x = random_q(rng, (3, 40), np.int8)
    weights = rng.integers(-127, 128, (12, 40)).astype(np.int8)
    bias = rng.integers(-3000, 3000, 12).astype(np.int32)
    sx, zx, sw, so, zo = np.float32(0.05), 3, np.float32(0.01), np.float32(0.3), -4
    t = TFLiteOp()
    ti = t.tensor((3, 40), np.int8, sx, zx)
    tw = t.tensor((12, 40), np.int8, sw, 0, weights)
    tb = t.tensor((12,), np.int32, sx * sw, 0, bias)
    to = t.tensor((3, 12), np.int8, so, zo)
    model = t.build(
        schema.BuiltinOperator.FULLY_CONNECTED,
        4,
        [ti, tw, tb],
        to,
        schema.BuiltinOptions.FullyConnectedOptions,
        schema.FullyConnectedOptionsT(),
    )
    want = run_litert(model, [x])
    got = run_one_op(
        OpCode.FULLY_CONNECTED,
        [(x, quant(sx, zx), False), (weights, quant(sw), True), (bias, None, True)],
        quant(so, zo),
        np.int8,
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [OpCode.ADD, OpCode.MUL])
def test_add_and_mul_match_litert(op):
    rng = np.random.default_rng(6)
    a, b = random_q(rng, (2, 6, 5), np.int8), random_q(rng, (2, 6, 5), np.int8)
    params = (np.float32(0.07), -10, np.float32(0.02), 5, np.float32(0.09), 2)
    t = TFLiteOp()
    ta = t.tensor(a.shape, np.int8, params[0], params[1])
    tb = t.tensor(b.shape, np.int8, params[2], params[3])
    to = t.tensor(a.shape, np.int8, params[4], params[5])
    if op == OpCode.ADD:
        code, kind, opts = (
            schema.BuiltinOperator.ADD,
            schema.BuiltinOptions.AddOptions,
            schema.AddOptionsT(),
        )
    else:
        code, kind, opts = (
            schema.BuiltinOperator.MUL,
            schema.BuiltinOptions.MulOptions,
            schema.MulOptionsT(),
        )
    want = run_litert(t.build(code, 2, [ta, tb], to, kind, opts), [a, b])
    got = run_one_op(
        op,
        [(a, quant(params[0], params[1]), False), (b, quant(params[2], params[3]), False)],
        quant(params[4], params[5]),
        np.int8,
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_matches_litert(stride):
    rng = np.random.default_rng(10 + stride)
    n, c, h = 1, 16, 10
    x = random_q(rng, (n, c, h, h), np.int8)
    weights = rng.integers(-127, 128, (c, 1, 3, 3)).astype(np.int8)
    sw = rng.uniform(0.002, 0.02, c).astype(np.float32)
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    sx, zx, so, zo = np.float32(0.04), 11, np.float32(0.05), -20
    oh = (h - 3) // stride + 1
    t = TFLiteOp()
    ti = t.tensor((n, h, h, c), np.int8, sx, zx)
    # TFLite's depthwise filter is (1, kh, kw, C), quantized along axis 3.
    tw = t.tensor((1, 3, 3, c), np.int8, sw, [0] * c, weights[:, 0].transpose(1, 2, 0), axis=3)
    tb = t.tensor((c,), np.int32, sx * sw, [0] * c, bias)
    to = t.tensor((n, oh, oh, c), np.int8, so, zo)
    opts = schema.DepthwiseConv2DOptionsT(
        padding=schema.Padding.VALID, strideW=stride, strideH=stride, depthMultiplier=1
    )
    model = t.build(
        schema.BuiltinOperator.DEPTHWISE_CONV_2D,
        3,
        [ti, tw, tb],
        to,
        schema.BuiltinOptions.DepthwiseConv2DOptions,
        opts,
    )
    want = run_litert(model, [x.transpose(0, 2, 3, 1)]).transpose(0, 3, 1, 2)
    got = run_one_op(
        OpCode.CONV2D,
        [(x, quant(sx, zx), False), (weights, quant(sw), True), (bias, None, True)],
        quant(so, zo),
        np.int8,
        strides=[stride, stride],
        group=c,
    )
    np.testing.assert_array_equal(got, want)


def test_average_pool_matches_litert():
    rng = np.random.default_rng(12)
    x = random_q(rng, (1, 6, 9, 9), np.int8)
    t = TFLiteOp()
    ti = t.tensor((1, 9, 9, 6), np.int8, 0.1, -3)
    to = t.tensor((1, 5, 5, 6), np.int8, 0.1, -3)
    opts = schema.Pool2DOptionsT(
        padding=schema.Padding.SAME, strideW=2, strideH=2, filterWidth=3, filterHeight=3
    )
    model = t.build(
        schema.BuiltinOperator.AVERAGE_POOL_2D,
        2,
        [ti],
        to,
        schema.BuiltinOptions.Pool2DOptions,
        opts,
    )
    want = run_litert(model, [x.transpose(0, 2, 3, 1)]).transpose(0, 3, 1, 2)
    # SAME with stride 2 over 9: one row/column of padding on each side; TFLite averages
    # over the valid elements only (count_include_pad=0).
    got = run_one_op(
        OpCode.AVG_POOL2D,
        [(x, quant(0.1, -3), False)],
        quant(0.1, -3),
        np.int8,
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    np.testing.assert_array_equal(got, want)
