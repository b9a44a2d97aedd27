"""TFLite shapes and signatures: dynamic dimensions resized as LiteRT's
resize_tensor_input does, --input-shape, graphs that hard-code their batch, and
SignatureDefs kept with their own names, each compared with LiteRT on the same file."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sporenet.converter import (
    ConversionError,
    InvalidTfliteError,
    convert_tflite,
    convert_tflite_model,
)
from sporenet.converter.cli import main
from sporenet.lite import Interpreter, parse
from sporenet.proto import tflite_schema_generated as tfl
from tests.unit.converter.tflite_builder import TfliteBuilder, rand

litert = pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

RTOL = 1e-4  # float models: relative to the output's scale


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    scale = max(float(np.max(np.abs(want))), 1e-6)
    assert float(np.max(np.abs(got - want))) / scale < RTOL


def _dense_model(*, batch_signature: int = -1, signature: bool = False) -> bytes:
    """x [batch, 8] -> FULLY_CONNECTED (4 units) -> tanh, the batch dynamic (-1)."""
    b = TfliteBuilder()
    x = b.input("serving_default_img:0", [1, 8], signature=[batch_signature, 8])
    w = b.const("w", rand(4, 8, seed=1))
    bias = b.const("bias", rand(4, seed=2))
    h = b.tensor("h", [1, 4], signature=[batch_signature, 4])
    b.op("FULLY_CONNECTED", [x, w, bias], [h], "FullyConnectedOptions", KeepNumDims=False)
    y = b.output(b.tensor("StatefulPartitionedCall:0", [1, 4], signature=[batch_signature, 4]))
    b.op("TANH", [h], [y])
    if signature:
        b.signature("serving_default", {"img": x}, {"output_0": y})
    return b.build()


def _litert(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """LiteRT's outputs, inputs fed in subgraph order and resized first (strictly)."""
    it = litert.Interpreter(model_content=data)
    details = it.get_input_details()
    for d, value in zip(details, feeds.values(), strict=True):
        if tuple(d["shape"]) != value.shape:
            it.resize_tensor_input(d["index"], value.shape, strict=True)
    it.allocate_tensors()
    for d, value in zip(details, feeds.values(), strict=True):
        it.set_tensor(d["index"], value)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def test_signature_defs_keep_their_names():
    data = _dense_model(signature=True)
    ours = Interpreter(model_content=convert_tflite(data))
    theirs = litert.Interpreter(model_content=data)
    assert ours.get_signature_list() == theirs.get_signature_list()
    assert ours.get_signature_list() == {
        "serving_default": {"inputs": ["img"], "outputs": ["output_0"]}
    }
    x = rand(3, 8, seed=4)
    got = ours.get_signature_runner("serving_default")(img=x)
    want = theirs.get_signature_runner("serving_default")(img=x)
    assert sorted(got) == sorted(want) == ["output_0"]
    _close(got["output_0"], want["output_0"])
    # The default entry point is the file's signature: run() takes its names.
    _close(ours.run({"img": x})["output_0"], want["output_0"])


def test_two_signatures_on_one_subgraph():
    b = TfliteBuilder()
    x = b.input("x", [2, 3])
    y = b.output(b.tensor("y", [2, 3]))
    b.op("RELU", [x], [y])
    b.signature("relu", {"features": x}, {"activated": y})
    b.signature("other", {"values": x}, {"result": y})
    data = b.build()
    ours = Interpreter(model_content=convert_tflite(data))
    theirs = litert.Interpreter(model_content=data)
    assert ours.get_signature_list() == theirs.get_signature_list()
    v = rand(2, 3, seed=5)
    for key, name, out in (("relu", "features", "activated"), ("other", "values", "result")):
        got = ours.get_signature_runner(key)(**{name: v})[out]
        want = theirs.get_signature_runner(key)(**{name: v})[out]
        np.testing.assert_array_equal(got, want)


def test_a_dynamic_batch_resizes_as_litert_does():
    data = _dense_model()
    model = parse(convert_tflite(data))
    assert model.tensors[model.signature().inputs["serving_default_img:0"]].shape == (-1, 8)
    ours = Interpreter(model=model)
    for batch in (1, 3, 5):
        x = rand(batch, 8, seed=batch)
        index = ours.get_input_details()[0]["index"]
        ours.resize_tensor_input(index, [batch, 8])
        ours.allocate_tensors()
        ours.set_tensor(index, x)
        ours.invoke()
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        _close(got, _litert(data, {"x": x})[0])


def test_input_shape_fixes_a_dynamic_batch():
    data = _dense_model()
    model, _ = convert_tflite_model(data, input_shapes={"serving_default_img:0": (4, 8)})
    index = model.signature().inputs["serving_default_img:0"]
    assert model.tensors[index].shape == (4, 8)
    x = rand(4, 8, seed=7)
    got = Interpreter(model=model).run({"serving_default_img:0": x})
    _close(got["StatefulPartitionedCall:0"], _litert(data, {"x": x})[0])


def test_input_shape_by_signature_name_and_bad_shapes():
    data = _dense_model(signature=True)
    model, _ = convert_tflite_model(data, input_shapes={"img": (2, 8)})
    assert model.tensors[model.signature("serving_default").inputs["img"]].shape == (2, 8)
    with pytest.raises(ConversionError, match=r"shape signature \[-1, 8\]"):
        convert_tflite_model(data, input_shapes={"img": (2, 9)})
    with pytest.raises(ConversionError, match=r"not model inputs; inputs are"):
        convert_tflite_model(data, input_shapes={"image": (2, 8)})


def _hard_coded_batch_model() -> bytes:
    """audio [-1, 16000] -> RESHAPE to [1, 200, 80] (the batch written into the graph) ->
    MEAN over time -> [1, 80]: it only runs at batch 1, the size the file was saved with."""
    b = TfliteBuilder()
    x = b.input("audio", [1, 16000], signature=[-1, 16000])
    frames = b.tensor("frames", [1, 200, 80])
    b.op("RESHAPE", [x, b.const("shape", [1, 200, 80], np.int32)], [frames])
    y = b.output(b.tensor("energy", [1, 80]))
    b.op("MEAN", [frames, b.const("axes", [1], np.int32)], [y], "ReducerOptions", KeepDims=False)
    return b.build()


def test_a_graph_that_hard_codes_its_batch_converts_at_that_batch():
    data = _hard_coded_batch_model()
    model, report = convert_tflite_model(data)
    assert model.tensors[model.signature().inputs["audio"]].shape == (1, 16000)
    assert any("saved with (audio [1, 16000])" in note for note in report.notes)
    x = rand(1, 16000, seed=8)
    _close(Interpreter(model=model).run({"audio": x})["energy"], _litert(data, {"x": x})[0])


def test_expand_dims_on_two_dynamic_dimensions():
    b = TfliteBuilder()
    x = b.input("x", [1, 1], signature=[-1, -1])
    y = b.output(b.tensor("y", [1, 1, 1], signature=[-1, 1, -1]))
    b.op("EXPAND_DIMS", [x, b.const("axis", 1, np.int32)], [y])
    data = b.build()
    v = rand(3, 5, seed=9)
    got = Interpreter(model_content=convert_tflite(data)).run({"x": v})["y"]
    np.testing.assert_array_equal(got, _litert(data, {"x": v})[0])


def test_int8_nodes_follow_a_dynamic_batch():
    # A quantized ADD whose output the file declares as [-1, 4]: its size under each
    # batch comes from the int8 kernel, not from the declared -1.
    b = TfliteBuilder()
    q = ([0.05], [3], 0)
    x = b.input("x", [1, 4], np.int8, signature=[-1, 4], quant=q)
    c = b.tensor("c", [1, 4], np.int8, data=np.array([[10, -20, 30, -40]], np.int8), quant=q)
    y = b.output(b.tensor("y", [1, 4], np.int8, signature=[-1, 4], quant=([0.1], [-2], 0)))
    b.op("ADD", [x, c], [y], "AddOptions", FusedActivationFunction=0)
    data = b.build()
    v = np.random.default_rng(3).integers(-128, 128, (3, 4)).astype(np.int8)
    got = Interpreter(model_content=convert_tflite(data)).run({"x": v})["y"]
    want = _litert(data, {"x": v})[0]
    assert got.shape == want.shape == (3, 4)
    assert int(np.max(np.abs(got.astype(np.int32) - want))) <= 1  # one quantization step


def test_cli_takes_input_shape_for_tflite(tmp_path, capsys):
    source = tmp_path / "dense.tflite"
    source.write_bytes(_dense_model(signature=True))
    target = tmp_path / "dense.spore"
    command = [sys.executable, "-m", "sporenet.converter", str(source), "-o", str(target)]
    done = subprocess.run(
        [*command, "--input-shape", "img:6,8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    model = parse(target.read_bytes())
    assert model.tensors[model.signature().inputs["img"]].shape == (6, 8)
    target.unlink()
    assert main([str(source), "-o", str(target), "--input-shape", "img:6,7"]) == 1
    assert "does not fit the input's shape signature [-1, 8]" in capsys.readouterr().err
    assert not target.exists()


def test_a_signature_naming_a_missing_tensor_is_invalid():
    b = TfliteBuilder()
    x = b.input("x", [2, 3])
    y = b.output(b.tensor("y", [2, 3]))
    b.op("RELU", [x], [y])
    b.signature("serving_default", {"x": x}, {"y": 99})
    with pytest.raises(InvalidTfliteError, match=r"signature 'serving_default': output 0"):
        convert_tflite(b.build())


def test_squeeze_and_reshape_with_several_open_dimensions():
    # x [-1, -1, 1, 4] -> SQUEEZE axis 2 -> [-1, -1, 4] -> RESHAPE to its shape input
    # [-1, 4] (the output's declared shape leaves both dimensions open).
    b = TfliteBuilder()
    x = b.input("x", [1, 1, 1, 4], signature=[-1, -1, 1, 4])
    s = b.tensor("s", [1, 1, 4], signature=[-1, -1, 4])
    b.op("SQUEEZE", [x], [s], "SqueezeOptions", SqueezeDims=[2])
    y = b.output(b.tensor("y", [1, 4], signature=[-1, -1]))
    b.op("RESHAPE", [s, b.const("shape", [-1, 4], np.int32)], [y])
    data = b.build()
    v = rand(2, 3, 1, 4, seed=11)
    got = Interpreter(model_content=convert_tflite(data)).run({"x": v})["y"]
    np.testing.assert_array_equal(got, _litert(data, {"x": v})[0])


def test_a_graph_that_runs_at_no_tried_size_asks_for_input_shape():
    # A 1-D "audio" input of open length into a window of 400 samples: neither the probe
    # sizes nor the saved length 1 fit, so the error names --input-shape.
    b = TfliteBuilder()
    x = b.input("audio", [1, 1, 1, 1], signature=[1, 1, -1, 1])
    w = b.const("w", rand(2, 1, 400, 1, seed=12))
    y = b.output(b.tensor("y", [1, 1, 1, 2], signature=[1, 1, -1, 2]))
    b.op(
        "CONV_2D",
        [x, w, b.const("b", rand(2, seed=13))],
        [y],
        "Conv2DOptions",
        Padding=tfl.Padding.VALID,
        StrideW=1,
        StrideH=1,
    )
    data = b.build()
    with pytest.raises(ConversionError, match=r"--input-shape audio:1,1,N,1"):
        convert_tflite(data)
    model, _ = convert_tflite_model(data, input_shapes={"audio": (1, 1, 1000, 1)})
    v = rand(1, 1, 1000, 1, seed=14)
    _close(Interpreter(model=model).run({"audio": v})["y"], _litert(data, {"x": v})[0])
