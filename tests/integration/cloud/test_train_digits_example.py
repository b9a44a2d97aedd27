"""examples/train_digits.py as a user runs it: a real subprocess writing a real file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet.lite import Interpreter, load

pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_digits.py"


def run_example(out: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_example_writes_a_model_the_runtime_can_use(tmp_path):
    out = tmp_path / "digits.spore"
    stdout = run_example(out, "--epochs", "2")
    assert re.search(r"test accuracy 0\.\d{4}", stdout)
    model = load(out)
    assert json.loads(model.metadata["labels"]) == [str(d) for d in range(10)]
    x = np.full((3, 1, 8, 8), 8.0, np.float32)  # raw pixels, no preprocessing by the caller
    outputs = Interpreter(model_path=out).run({"input": x})
    assert outputs["logits"].shape == (3, 10)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_example_reaches_the_accuracy_target(tmp_path):
    # The target: >= 97% test accuracy within 30 epochs (default epochs).
    stdout = run_example(tmp_path / "digits.spore")
    accuracy = float(re.search(r"test accuracy (0\.\d+)", stdout).group(1))
    assert accuracy >= 0.97, stdout
