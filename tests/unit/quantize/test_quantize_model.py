"""quantize_model and the calibration checks on a converted CNN, against the float model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.converter.errors import CalibrationError, ConversionError
from sporenet.converter.quantize import load_calibration, quantize_model
from sporenet.converter.quantize.static import int8_ops
from sporenet.lite import Interpreter, parse
from sporenet.lite.ops import OpCode
from tests.unit.quantize.models import calibration, cnn, conv_act_conv


@pytest.fixture(scope="module")
def float_model() -> bytes:
    return convert_onnx(cnn())


def _outputs(data: bytes, x: np.ndarray) -> np.ndarray:
    return Interpreter(model_content=data).run({"x": x})["y"]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = np.sum((ref.astype(np.float64) - got) ** 2)
    return np.inf if noise == 0 else 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / noise)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_static_int8_is_close_to_float_and_reports_every_tensor(
    float_model: bytes, method: str
) -> None:
    result = quantize_model(float_model, mode="int8", calibration=calibration(), method=method)
    model = parse(result.data)
    ops = [n.op for n in model.graphs[0].nodes]
    assert OpCode.BATCH_NORM not in ops  # folded before quantizing
    report = result.report
    assert report.samples == 64 and report.method == method
    names = {t.name for t in report.tensors}
    assert {"r1", "r2", "p", "f", "y"} <= names
    kept = {f.op for f in report.float_ops}
    assert kept == {op.name for op in set(ops) - int8_ops() - {OpCode.QUANTIZE, OpCode.DEQUANTIZE}}
    x = calibration(32, seed=7)["x"]
    want = _outputs(float_model, x)
    got = _outputs(result.data, x)
    # Min/max ranges keep the int8 outputs within a few percent of float. Entropy clips
    # the long tails of this random net's activations by design, for a lower SQNR.
    bound = 10.0 if method == "entropy" else 25.0
    assert _sqnr(want, got) > bound
    assert report.outputs[0].name == "y" and report.outputs[0].sqnr_db > bound
    if int8_ops():
        assert any(t.dtype == "int8" for t in model.tensors if t.quantization is not None)
        weights = sum(t.data.nbytes for t in model.tensors if t.data is not None)
        float_weights = sum(t.data.nbytes for t in parse(float_model).tensors if t.data is not None)
        assert weights < 0.3 * float_weights  # int8 weights, a few int32 biases
    json.loads(report.to_json())
    assert "worst" in report.summary()


def test_ranges_override_calibration(float_model: bytes) -> None:
    result = quantize_model(
        float_model, mode="int8", ranges={"x": (-4.0, 4.0)}, calibration=calibration(8)
    )
    x_q = [t for t in parse(result.data).tensors if t.name == "x/quantized"]
    if int8_ops() & {OpCode.CONV2D}:
        assert x_q and abs(float(x_q[0].quantization.scale[0]) - 8.0 / 255) < 1e-7
    with pytest.raises(ConversionError, match="needs calibration data"):
        quantize_model(float_model, mode="uint8")


@pytest.mark.parametrize(("mode", "ratio"), [("fp16", 0.6), ("dynamic", 0.35)])
def test_weight_only_modes_shrink_the_file_and_keep_the_outputs(
    float_model: bytes, mode: str, ratio: float
) -> None:
    result = quantize_model(float_model, mode=mode, calibration=calibration(16))

    def weight_bytes(data: bytes) -> int:
        return sum(t.data.nbytes for t in parse(data).tensors if t.data is not None)

    assert weight_bytes(result.data) < ratio * weight_bytes(float_model)
    assert len(result.data) < len(float_model)
    x = calibration(16, seed=3)["x"]
    assert _sqnr(_outputs(float_model, x), _outputs(result.data, x)) > (
        60 if mode == "fp16" else 30
    )


def test_weight_only_files_store_small_weights(float_model: bytes) -> None:
    fp16 = parse(quantize_model(float_model, mode="fp16", report=False).data)
    dyn = parse(quantize_model(float_model, mode="dynamic", per_channel=False, report=False).data)
    assert {str(t.dtype) for t in fp16.tensors if t.data is not None and t.data.size >= 64} == {
        "float16"
    }
    weights = [t for t in dyn.tensors if t.quantization is not None]
    assert len(weights) == 3 and all(
        t.dtype == np.int8 and t.quantization.scale.size == 1 for t in weights
    )


def test_an_already_quantized_model_is_refused(float_model: bytes) -> None:
    fp16 = quantize_model(float_model, mode="fp16", report=False).data
    with pytest.raises(ConversionError, match="already quantized"):
        quantize_model(fp16, mode="dynamic")
    with pytest.raises(ConversionError, match="mode must be one of"):
        quantize_model(float_model, mode="int4")
    with pytest.raises(ConversionError, match="calibration method must be one of"):
        quantize_model(float_model, mode="int8", method="mse", calibration=calibration(4))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"y": np.zeros((4, 1, 8, 8), np.float32)}, r"missing \['x'\], unknown \['y'\]"),
        ({"x": np.zeros((0, 1, 8, 8), np.float32)}, r"'x': expected at least 1 sample"),
        (
            {"x": np.zeros((4, 1, 8, 9), np.float32)},
            r"'x': expected samples of shape \(N, 1, 8, 8\)",
        ),
        ({"x": np.zeros((4, 8, 8), np.float32)}, r"'x': expected samples of shape"),
        ({"x": np.zeros((4, 1, 8, 8), np.float64)}, r"'x': expected dtype float32, found float64"),
        ({"x": np.full((4, 1, 8, 8), np.nan, np.float32)}, r"'x': contains NaN"),
        ({"x": [[0.0]]}, r"'x': expected a NumPy array"),
    ],
)
def test_bad_calibration_data_names_the_input(float_model: bytes, data: dict, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        quantize_model(float_model, mode="int8", calibration=data)


def test_bad_calibration_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CalibrationError, match=r"single \.npy array"):
        load_calibration(tmp_path / "one.npy")
    with pytest.raises(CalibrationError, match="cannot read calibration file"):
        load_calibration(tmp_path / "junk.npz")
    with pytest.raises(CalibrationError, match="cannot read calibration file"):
        load_calibration(tmp_path / "absent.npz")
    np.savez(tmp_path / "ok.npz", x=np.zeros((2, 1, 8, 8), np.float32))
    assert load_calibration(tmp_path / "ok.npz")["x"].shape == (2, 1, 8, 8)


@pytest.mark.parametrize("per_channel", [True, False])
def test_uint8_activations_run_on_integer_kernels(float_model: bytes, per_channel: bool) -> None:
    result = quantize_model(
        float_model, mode="uint8", calibration=calibration(), per_channel=per_channel
    )
    model = parse(result.data)
    activations = [t for t in model.tensors if t.data is None and t.quantization is not None]
    assert activations and all(t.dtype == np.uint8 for t in activations)
    weights = [t for t in model.tensors if t.data is not None and t.dtype == np.int8]
    assert weights and all((t.quantization.scale.size > 1) == per_channel for t in weights)
    x = calibration(32, seed=8)["x"]
    interpreter = Interpreter(model_content=result.data)
    got = interpreter.run({"x": x})["y"]
    assert _sqnr(_outputs(float_model, x), got) > 25.0


def test_convert_onnx_quantizes_in_one_call() -> None:
    data = convert_onnx(
        cnn(),
        quantize="int8",
        calibration=calibration(),
        per_channel=False,
        calibration_method="percentile",
    )
    model = parse(data)
    assert model.metadata["quantization"] == "int8"
    weights = [t for t in model.tensors if t.data is not None and t.dtype == np.int8]
    assert weights and all(t.quantization.scale.size == 1 for t in weights)
    with pytest.raises(CalibrationError, match="missing"):
        convert_onnx(cnn(), quantize="int8", calibration={"z": calibration()["x"]})


def test_an_op_without_int8_kernel_stays_float_between_dequantize_and_quantize() -> None:
    float_model = convert_onnx(conv_act_conv("Elu"))
    result = quantize_model(float_model, mode="int8", calibration=calibration())
    assert [(f.op, f.reason) for f in result.report.float_ops] == [("ELU", "no int8 kernel")]
    ops = [n.op for n in parse(result.data).graphs[0].nodes]
    elu = ops.index(OpCode.ELU)
    assert ops[elu - 1] == OpCode.DEQUANTIZE and ops[elu + 1] == OpCode.QUANTIZE
    assert ops.count(OpCode.CONV2D) == 2
    x = calibration(16, seed=4)["x"]
    assert _sqnr(_outputs(float_model, x), _outputs(result.data, x)) > 25.0
    assert "kept float : 1 op(s)" in result.report.summary()


def test_the_report_names_outputs_by_the_models_output_names(float_model: bytes) -> None:
    import dataclasses

    from sporenet.lite import serialize

    model = parse(float_model)
    sig = model.signatures["infer"]
    (tensor,) = sig.outputs.values()
    model.signatures["infer"] = dataclasses.replace(sig, outputs={"logits": tensor})
    report = quantize_model(serialize(model), mode="int8", calibration=calibration()).report
    assert [t.output for t in report.outputs] == ["logits"]
    assert f"output     : logits ({model.tensors[tensor].name}): SQNR" in report.summary()
