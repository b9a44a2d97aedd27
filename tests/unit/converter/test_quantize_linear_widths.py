"""QuantizeLinear/DequantizeLinear to 16 bits and by blocks (run as float ops), against
onnxruntime, with constant parameters (the ONNX suite feeds them as graph inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from sporenet.converter import ConversionError
from tests.unit.converter.helpers import assert_matches_ort, convert, helper, make_model

X = (np.random.default_rng(0).normal(size=(2, 6, 4)) * 300).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_16_bit_round_trip_matches_onnxruntime(dtype):
    inits = {"scale": np.array(0.05, np.float32), "zp": np.array(7, dtype)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"]),
    ]
    model = make_model(nodes, {"x": list(X.shape)}, ["q", "y"], initializers=inits, opset=21)
    assert_matches_ort(model, {"x": X})


def test_blocked_quantization_matches_onnxruntime():
    # x is (2, 6, 4); blocks of 4 along axis 1 (the last one short): 2 scales per column.
    scale = np.random.default_rng(1).uniform(0.5, 4.0, size=(2, 2, 4)).astype(np.float32)
    inits = {"scale": scale, "zp": np.full(scale.shape, 3, np.int8)}
    attrs = {"axis": 1, "block_size": 4}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs),
    ]
    model = make_model(nodes, {"x": list(X.shape)}, ["q", "y"], initializers=inits, opset=21)
    assert_matches_ort(model, {"x": X})


def test_unsupported_width_names_the_supported_ones():
    inits = {"scale": np.array(0.5, np.float32), "zp": np.array(0, np.int32)}
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"])
    model = make_model(
        [node],
        {"x": [3]},
        ["q"],
        initializers=inits,
        opset=21,
        output_shapes={"q": [3]},
    )
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(ConversionError, match=r"int32 is not supported .*int16 and uint16 are"):
        convert(model)


@pytest.mark.parametrize("op", ["Gather", "Unsqueeze"])
def test_dequantized_constant_moved_by_a_data_op_stays_float(op):
    # DequantizeLinear of an integer constant, then an op whose int8 kernel the runtime
    # would pick by its first input (a T5 decoder's relative position bias, folded to a
    # constant at fixed input shapes): the op and the float Add after it compute in float.
    rng = np.random.default_rng(2)
    inits = {
        "q": rng.integers(0, 256, (40, 16)).astype(np.uint8),
        "scale": np.array(0.02, np.float32),
        "zp": np.array(128, np.uint8),
    }
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["w"])]
    inputs: dict = {}
    feeds = {}
    if op == "Gather":
        nodes.append(helper.make_node("Gather", ["w", "ids"], ["moved"]))
        inputs["ids"] = [3]
        feeds["ids"] = np.array([1, 5, 7], np.int64)
        inputs["x"] = [3, 16]
    else:
        inits["axes"] = np.array([0], np.int64)
        nodes.append(helper.make_node("Unsqueeze", ["w", "axes"], ["moved"]))
        inputs["x"] = [1, 40, 16]
    nodes.append(helper.make_node("Add", ["moved", "x"], ["y"]))
    dtypes = {"ids": TensorProto.INT64}
    model = make_model(nodes, inputs, ["y"], initializers=inits, input_dtypes=dtypes)
    feeds["x"] = rng.normal(size=inputs["x"]).astype(np.float32)
    assert_matches_ort(model, feeds)
