"""The architecture's dependency rules hold: lite needs only numpy and flatbuffers, and
federated never imports cloud (checked in fresh interpreters, so nothing is cached)."""

import json
import subprocess
import sys

import pytest

HEAVY = ["grpc", "google.protobuf", "cryptography", "onnx", "onnxruntime", "torch", "sklearn"]


def _modules_after_import(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_lite_imports_only_numpy_and_flatbuffers() -> None:
    loaded = _modules_after_import(
        "import sporenet.lite, sporenet.lite.training, sporenet.lite.autodiff, "
        "sporenet.lite.eager, sporenet.lite.inspect_cli"
    )
    heavy = sorted(m for m in loaded if m.split(".")[0] in {h.split(".")[0] for h in HEAVY})
    assert heavy == [], f"sporenet.lite pulled in {heavy}"
    ours = {m.split(".")[1] for m in loaded if m.startswith("sporenet.") and m.count(".") >= 1}
    assert ours <= {"lite", "proto"}, f"sporenet.lite imported {sorted(ours - {'lite', 'proto'})}"


@pytest.mark.parametrize("module", ["sporenet.federated", "sporenet.federated.server.cli"])
def test_federated_never_imports_cloud(module: str) -> None:
    loaded = _modules_after_import(f"import {module}")
    assert not [m for m in loaded if m.startswith("sporenet.cloud")]


def test_converter_never_imports_federated() -> None:
    loaded = _modules_after_import("import sporenet.converter, sporenet.converter.cli")
    assert not [m for m in loaded if m.startswith("sporenet.federated")]


def test_cloud_and_the_graph_passes_need_no_onnx() -> None:
    # cloud export runs the converter's passes; only the ONNX importer needs `onnx`.
    loaded = _modules_after_import("import sporenet.cloud, sporenet.converter.passes")
    assert not [m for m in loaded if m.split(".")[0] in ("onnx", "onnxruntime")]
    assert "sporenet.converter.passes.batchnorm_folding" in loaded
