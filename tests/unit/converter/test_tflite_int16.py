"""int16x8 kernels (16-bit activations, 8-bit weights) bit-exact with LiteRT's reference
kernels, beyond the conformance suite's cases: every int16 input of the table-driven
ops, power-of-two scales, accumulators past 2^31."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import Interpreter
from sporenet.lite.errors import LiteError
from sporenet.proto import tflite_schema_generated as tfl
from tests.references import litert_reference_interpreter
from tests.unit.converter.tflite_builder import TYPES, TfliteBuilder

TYPES.setdefault(np.dtype(np.int16), tfl.TensorType.INT16)
TYPES.setdefault(np.dtype(np.int64), tfl.TensorType.INT64)
ALL_INT16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)


def _both(data: bytes, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(sporenet's, LiteRT's reference) first output."""
    it = litert_reference_interpreter(data)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    want = it.get_tensor(it.get_output_details()[0]["index"])
    got = next(iter(Interpreter(model_content=convert_tflite(data)).run(feeds).values()))
    return got, want


def _unary(op: str, scale: float, options: str | None = None, **fields) -> bytes:
    b = TfliteBuilder()
    x = b.tensor("x", [1 << 16], np.int16, quant=([scale], [0], 0))
    y = b.tensor("y", [1 << 16], np.int16, quant=([1 / 32768], [0], 0))
    b.inputs.append(x)
    b.op(op, [x], [y], options, **fields)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
@pytest.mark.parametrize("scale", [2**-12, 2**-11, 1e-4, 9.155e-05, 1e-3, 3e-5])
def test_sigmoid_family_every_input(op: str, scale: float) -> None:
    got, want = _both(_unary(op, scale), {"x": ALL_INT16})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("depth", [1, 5, 33])
def test_softmax_rows(depth: int) -> None:
    rng = np.random.default_rng(depth)
    for scale in (1e-5, 2e-4, 5e-4):
        b = TfliteBuilder()
        x = b.tensor("x", [7, depth], np.int16, quant=([scale], [0], 0))
        y = b.tensor("y", [7, depth], np.int16, quant=([1 / 32768], [0], 0))
        b.inputs.append(x)
        b.op("SOFTMAX", [x], [y], "SoftmaxOptions", Beta=1.0)
        b.output(y)
        q = rng.integers(-32768, 32768, (7, depth)).astype(np.int16)
        got, want = _both(b.build(), {"x": q})
        np.testing.assert_array_equal(got, want)


def test_fully_connected_accumulators_past_int32() -> None:
    """A 4096-term reduction of extreme values: sums near 2^34, the single-rounding
    multiply of TFLite's int16 FullyConnected done in two halves."""
    rng = np.random.default_rng(0)
    k, o = 4096, 3
    w = np.where(rng.random((o, k)) < 0.5, -127, 127).astype(np.int8)
    bias = rng.integers(-(1 << 40), 1 << 40, o).astype(np.int64)
    b = TfliteBuilder()
    x = b.tensor("x", [2, k], np.int16, quant=([1e-4], [0], 0))
    wt = b.tensor("w", [o, k], np.int8, data=w, quant=([0.01], [0], 0))
    bt = b.tensor("b", [o], np.int64, data=bias, quant=([1e-6], [0], 0))
    y = b.tensor("y", [2, o], np.int16, quant=([3.0], [0], 0))
    b.inputs.append(x)
    b.op("FULLY_CONNECTED", [x, wt, bt], [y], "FullyConnectedOptions")
    b.output(y)
    q = np.stack([np.where(w[0] > 0, 32767, -32768), rng.integers(-32768, 32768, k)])
    got, want = _both(b.build(), {"x": q.astype(np.int16)})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize(
    "scales", [(2**-12, 2**-10, 2**-10), (2**-10, 2**-13, 2**-10), (2**-11, 2**-11, 2**-11)]
)
def test_power_of_two_add_sub(op: str, scales: tuple[float, float, float]) -> None:
    got, want = _both(*_pot_model(op, scales, (2, 3, 4)))
    np.testing.assert_array_equal(got, want)


def test_power_of_two_add_refuses_broadcasting() -> None:
    # LiteRT aborts the process on this model; sporenet says why it does not run it.
    data, _ = _pot_model("ADD", (2**-12, 2**-10, 2**-10), (4,))
    with pytest.raises(LiteError, match="power-of-two int16 path takes equal shapes"):
        Interpreter(model_content=convert_tflite(data))


def _pot_model(
    op: str, scales: tuple[float, float, float], second: tuple[int, ...]
) -> tuple[bytes, dict[str, np.ndarray]]:
    b = TfliteBuilder()
    x = b.tensor("x", [2, 3, 4], np.int16, quant=([scales[0]], [0], 0))
    y = b.tensor("y", list(second), np.int16, quant=([scales[1]], [0], 0))
    z = b.tensor("z", [2, 3, 4], np.int16, quant=([scales[2]], [0], 0))
    b.inputs += [x, y]
    b.op(op, [x, y], [z], f"{op.title()}Options", FusedActivationFunction=1)
    b.output(z)
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.integers(-32768, 32768, (2, 3, 4)).astype(np.int16),
        "y": rng.integers(-32768, 32768, second).astype(np.int16),
    }
    return b.build(), feeds


def test_batch_matmul_of_int16_operands() -> None:
    rng = np.random.default_rng(3)
    b = TfliteBuilder()
    x = b.tensor("x", [2, 5, 64], np.int16, quant=([2e-4], [0], 0))
    y = b.tensor("y", [2, 64, 3], np.int16, quant=([3e-4], [0], 0))
    z = b.tensor("z", [2, 5, 3], np.int16, quant=([0.02], [0], 0))
    b.inputs += [x, y]
    b.op("BATCH_MATMUL", [x, y], [z], "BatchMatMulOptions")
    b.output(z)
    feeds = {
        "x": rng.integers(-32768, 32768, (2, 5, 64)).astype(np.int16),
        "y": rng.integers(-32768, 32768, (2, 64, 3)).astype(np.int16),
    }
    got, want = _both(b.build(), feeds)
    np.testing.assert_array_equal(got, want)


def test_transpose_conv_with_an_int64_bias() -> None:
    rng = np.random.default_rng(4)
    b = TfliteBuilder()
    w = rng.integers(-127, 128, (2, 3, 3, 3)).astype(np.int8)
    shape = b.const("shape", np.array([1, 8, 8, 2], np.int32), np.int32)
    wt = b.tensor("w", [2, 3, 3, 3], np.int8, data=w, quant=([0.01, 0.02], [0, 0], 0))
    x = b.tensor("x", [1, 4, 4, 3], np.int16, quant=([1e-4], [0], 0))
    bias = rng.integers(-(1 << 20), 1 << 20, 2).astype(np.int64)
    bt = b.tensor("b", [2], np.int64, data=bias, quant=([1e-6, 2e-6], [0, 0], 0))
    y = b.tensor("y", [1, 8, 8, 2], np.int16, quant=([2e-4], [0], 0))
    b.inputs.append(x)
    b.op(
        "TRANSPOSE_CONV",
        [shape, wt, x, bt],
        [y],
        "TransposeConvOptions",
        Padding=0,
        StrideW=2,
        StrideH=2,
    )
    b.output(y)
    q = rng.integers(-32768, 32768, (1, 4, 4, 3)).astype(np.int16)
    got, want = _both(b.build(), {"x": q})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("source", "target"), [(np.int16, np.int16), (np.int8, np.int16), (np.int16, np.int8)]
)
def test_requantize_to_and_from_int16(source, target) -> None:
    """QUANTIZE between integer types: int8 -> int16 where a model enters int16x8, int16
    -> int8 where it leaves it, int16 -> int16 with new parameters."""
    zero = {np.int8: 5, np.int16: 0}
    b = TfliteBuilder()
    x = b.tensor("x", [64], source, quant=([0.003], [zero[source]], 0))
    y = b.tensor("y", [64], target, quant=([0.0071], [zero[target]], 0))
    b.inputs.append(x)
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    info = np.iinfo(source)
    q = np.random.default_rng(5).integers(info.min, info.max + 1, 64).astype(source)
    got, want = _both(b.build(), {"x": q})
    np.testing.assert_array_equal(got, want)


def test_an_int16x8_network_end_to_end() -> None:
    """float -> QUANTIZE -> CONV_2D (relu) -> MAX_POOL_2D -> RESHAPE -> FULLY_CONNECTED
    -> SOFTMAX -> DEQUANTIZE: the layout's transposes carry int16 through, every layer
    is TFLite's int16x8 arithmetic."""
    rng = np.random.default_rng(6)
    b = TfliteBuilder()
    x = b.input("x", [1, 6, 6, 2])
    q = b.tensor("q", [1, 6, 6, 2], np.int16, quant=([1e-4], [0], 0))
    b.op("QUANTIZE", [x], [q])
    w = rng.integers(-127, 128, (4, 3, 3, 2)).astype(np.int8)
    wt = b.tensor("w", [4, 3, 3, 2], np.int8, data=w, quant=([0.01] * 4, [0] * 4, 0))
    bias = rng.integers(-5000, 5000, 4).astype(np.int64)
    bt = b.tensor("b", [4], np.int64, data=bias, quant=([1e-6] * 4, [0] * 4, 0))
    conv = b.tensor("conv", [1, 6, 6, 4], np.int16, quant=([3e-3], [0], 0))
    b.op(
        "CONV_2D",
        [q, wt, bt],
        [conv],
        "Conv2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        FusedActivationFunction=1,
    )
    pooled = b.tensor("pooled", [1, 3, 3, 4], np.int16, quant=([3e-3], [0], 0))
    b.op(
        "MAX_POOL_2D",
        [conv],
        [pooled],
        "Pool2DOptions",
        Padding=1,
        StrideW=2,
        StrideH=2,
        FilterWidth=2,
        FilterHeight=2,
    )
    flat = b.tensor("flat", [1, 36], np.int16, quant=([3e-3], [0], 0))
    b.op("RESHAPE", [pooled, b.const("shape", np.array([1, 36], np.int32), np.int32)], [flat])
    fw = rng.integers(-127, 128, (5, 36)).astype(np.int8)
    fwt = b.tensor("fw", [5, 36], np.int8, data=fw, quant=([0.0005], [0], 0))
    logits = b.tensor("logits", [1, 5], np.int16, quant=([1e-3], [0], 0))
    b.op("FULLY_CONNECTED", [flat, fwt], [logits], "FullyConnectedOptions")
    probs = b.tensor("probs", [1, 5], np.int16, quant=([1 / 32768], [0], 0))
    b.op("SOFTMAX", [logits], [probs], "SoftmaxOptions", Beta=1.0)
    y = b.output(b.tensor("y", [1, 5]))
    b.op("DEQUANTIZE", [probs], [y])
    data = b.build()
    for seed in range(3):
        feed = {"x": np.random.default_rng(seed).uniform(-3, 3, (1, 6, 6, 2)).astype(np.float32)}
        got, want = _both(data, feed)
        np.testing.assert_array_equal(got, want)
