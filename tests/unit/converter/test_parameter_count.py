"""sporenet-convert and sporenet-inspect report one parameter count for the same model
(real subprocesses of both commands)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.unit.converter.helpers import assert_matches_ort, helper, make_model


def _run(module: str, *args: str | Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("batch", [2, "N"])
def test_conv_transpose_counts_only_its_weights(tmp_path: Path, batch):
    # ConvTranspose once made a shape-only zero fill the size of its output, which the
    # converter counted as parameters and sporenet-inspect did not.
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 4, 3, 3)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    node = helper.make_node(
        "ConvTranspose",
        ["x", "w", "b"],
        ["y"],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        output_padding=[1, 1],
    )
    model = make_model([node], {"x": [batch, 3, 5, 5]}, ["y"], initializers={"w": w, "b": b})
    assert_matches_ort(
        model, {"x": rng.normal(size=(2, 3, 5, 5)).astype(np.float32)}, rtol=1e-4, atol=1e-5
    )
    source, target = tmp_path / "m.onnx", tmp_path / "m.spore"
    source.write_bytes(model.SerializeToString())
    converted = _run("sporenet.converter.cli", source, "-o", target)
    inspected = _run("sporenet.lite.inspect_cli", target)
    counts = (
        re.search(r"parameters : ([\d,]+)", converted),
        re.search(r"parameters: ([\d,]+)", inspected),
    )
    assert all(counts), (converted, inspected)
    assert [c.group(1) for c in counts] == [f"{w.size + b.size:,}"] * 2
