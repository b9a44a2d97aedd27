"""Every external-data layout the onnx package writes converts, its weights read as views
of the mapped files (onnx_import/loader.py, in_place.py), and the CLI counts the external
bytes in the sizes it prints."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import external_data_helper

from sporenet.converter import InvalidOnnxError
from sporenet.converter.convert import convert_onnx_model
from sporenet.converter.onnx_import.loader import load_onnx
from sporenet.lite import Interpreter, serialize
from tests.unit.converter.helpers import TensorProto, helper, make_model, onnx

F = TensorProto.FLOAT


def _model() -> onnx.ModelProto:
    """Weights of several sizes (some under onnx's default threshold), a Constant node
    holding a tensor, and an If whose branch holds an initializer of its own."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 16)).astype(np.float32)  # 2 KiB
    w2 = rng.standard_normal((16, 32)).astype(np.float32)
    b1 = rng.standard_normal(32).astype(np.float32)  # 128 bytes: inline by default
    const = helper.make_tensor(
        "cv", F, [16], rng.standard_normal(16).astype(np.float32).tobytes(), raw=True
    )
    branch_w = onnx.numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "bw")
    then = helper.make_graph(
        [helper.make_node("MatMul", ["h", "bw"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2, 16])],
        initializer=[branch_w],
    )
    other = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [2, 16])],
    )
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["a"], transB=1),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Gemm", ["r", "w2"], ["m"], transB=1),
        helper.make_node("Constant", [], ["c"], value=const),
        helper.make_node("Add", ["m", "c"], ["h"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    return make_model(
        nodes,
        {"x": [2, 16], "cond": []},
        ["y"],
        input_dtypes={"cond": TensorProto.BOOL},
        initializers={"w1": w1, "w2": w2, "b1": b1},
        output_shapes={"y": [2, 16]},
    )


def _feeds(flag: bool) -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    return {"x": x, "cond": np.array(flag)}


def _check_converts(path: Path) -> None:
    """The model at `path` converts and runs as onnxruntime runs it, both branches."""
    ir, report = convert_onnx_model(path)
    interpreter = Interpreter(model_content=serialize(ir))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for flag in (True, False):
        got = interpreter.run(_feeds(flag))["y"]
        want = session.run(None, _feeds(flag))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    on_disk = sum(p.stat().st_size for p in path.parent.iterdir() if p.suffix != ".spore")
    assert report.source_bytes == on_disk


def _external_locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        external_data_helper.ExternalDataInfo(t).location
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t)
    }


# The layouts of onnx.save_model: every tensor outside in one file, only those over a
# threshold outside (the rest inline, some of them large enough to be read in place),
# one file per tensor, and tensors held by attributes (Constant values) outside too.
LAYOUTS = {
    "all-one-file": dict(all_tensors_to_one_file=True, size_threshold=0),
    "some-outside": dict(all_tensors_to_one_file=True, size_threshold=1500),
    "file-per-tensor": dict(all_tensors_to_one_file=False, size_threshold=0),
    "attributes-too": dict(all_tensors_to_one_file=True, size_threshold=0, convert_attribute=True),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_onnx_save_layouts_convert(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "model.onnx"
    onnx.save_model(
        _model(),
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        **LAYOUTS[layout],
    )
    locations = _external_locations(path)
    assert locations, "the layout put nothing outside"
    if layout == "file-per-tensor":
        assert len(locations) > 1
    _check_converts(path)


def test_external_weights_are_views_of_the_mapped_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save_model(
        _model(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    loaded = load_onnx(path)
    mapped = loaded.data["w.bin"]
    ir, _ = convert_onnx_model(path)
    w2 = next(t for t in ir.tensors if t.data is not None and t.data.shape == (16, 32))
    base = w2.data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    # The weight's memory is the mapping of w.bin, not a copy.
    assert not w2.data.flags.owndata and not w2.data.flags.writeable
    assert isinstance(base, memoryview | bytes) or "mmap" in type(base).__name__
    assert mapped.nbytes == (tmp_path / "w.bin").stat().st_size


def test_offsets_without_length_and_unaligned_spans(tmp_path: Path) -> None:
    """A hand-laid file: one tensor at an odd offset with a length, the last one running to
    the end of the file with no length (both are valid ONNX external data)."""
    model = _model()
    blob = bytearray(b"\x00" * 3)  # odd start: the reader may not assume alignment
    inits = {t.name: t for t in model.graph.initializer}
    for name in ("w1", "w2"):
        t = inits[name]
        offset = len(blob)
        blob += t.raw_data
        keep_length = name == "w1"
        external_data_helper.set_external_data(
            t, "blob.bin", offset=offset, length=len(t.raw_data) if keep_length else None
        )
        t.ClearField("raw_data")
    (tmp_path / "blob.bin").write_bytes(bytes(blob))
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path))
    _check_converts(path)


def test_truncated_and_escaping_external_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save_model(
        _model(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    data = (tmp_path / "w.bin").read_bytes()
    (tmp_path / "w.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidOnnxError, match=r"external file 'w\.bin', which holds only"):
        convert_onnx_model(path)
    model = onnx.load(str(path), load_external_data=False)
    location = next(e for e in model.graph.initializer[0].external_data if e.key == "location")
    location.value = "../outside.bin"
    onnx.save_model(model, str(path))
    with pytest.raises(InvalidOnnxError, match="outside the model's directory"):
        convert_onnx_model(path)


def test_cli_size_counts_the_external_data(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save_model(
        _model(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    total = path.stat().st_size + (tmp_path / "w.bin").stat().st_size
    out = subprocess.run(
        [sys.executable, "-m", "sporenet.converter", str(path), "-o", str(tmp_path / "m.spore")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    size_line = next(line for line in out.splitlines() if line.strip().startswith("size"))
    assert f"{total / 1024:.1f} KiB .onnx" in size_line, size_line


class _Net:
    """A small Conv + Linear network, built only where torch is installed."""

    @staticmethod
    def build():  # type: ignore[no-untyped-def]
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
                self.fc = torch.nn.Linear(8 * 8 * 8, 10)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))

        return Net().eval()


@pytest.mark.slow  # the dynamo exporter takes ~20 s on a busy 2-core machine
def test_torch_dynamo_export_with_external_data(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is the torch extra")
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    net = _Net.build()
    x = torch.randn(1, 3, 8, 8)
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), dynamo=True, external_data=True, verbose=False)
    assert (tmp_path / "model.onnx.data").is_file()
    ir, report = convert_onnx_model(path)
    got = Interpreter(model_content=serialize(ir)).run({"x": x.numpy()})
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-5)
    assert (
        report.source_bytes == path.stat().st_size + (tmp_path / "model.onnx.data").stat().st_size
    )
