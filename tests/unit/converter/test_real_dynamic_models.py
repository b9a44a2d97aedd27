"""Real variable-size models, converted once without --input-shape, against onnxruntime at
several sizes.

The models ship inside PyPI packages that are not in the test extra (they pull OpenCV and
weigh tens of MB): `rapidocr-onnxruntime` (PP-OCR text detector, recognizer, angle
classifier) and `ddddocr` (a CNN + LSTM captcha reader). Each test skips when its package
is not installed; `pip install --no-deps rapidocr-onnxruntime ddddocr` is enough.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter, parse
from tests.packaged import packaged_file
from tests.references import ort_reference_session


def _model(package: str, relative: str) -> Path:
    path = packaged_file(package, relative)
    if path is None:
        pytest.skip(f"{relative} ships in the {package} package, which is not installed")
    return path


def _image(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Smooth strokes plus noise, normalized as the OCR pipelines do (about -1..1)."""
    rng = np.random.default_rng(seed)
    h, w = shape[-2:]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    strokes = np.sin(xx / 3.0 + rng.uniform(0, 6)) * np.cos(yy / 5.0 + rng.uniform(0, 6))
    image = strokes + 0.2 * rng.standard_normal(shape).astype(np.float32)
    return np.clip(image, -1, 1).astype(np.float32)


def _check(path: Path, sizes: list[tuple[int, ...]], *, atol: float) -> None:
    data = convert_onnx(path)  # no --input-shape: the dynamic dimensions stay symbolic
    ir = parse(data)
    (name,) = ir.signature().inputs
    declared = ir.tensors[ir.signature().inputs[name]].shape
    assert -1 in declared, declared
    session = ort_reference_session(path)
    interpreter = Interpreter(model_content=data, num_threads=1)
    for k, shape in enumerate(sizes):
        x = _image(shape, seed=k)
        want = session.run(None, {name: x})
        got = list(interpreter.run({name: x}).values())
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, (shape, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=atol, err_msg=str(shape))


def test_ppocr_recognizer_runs_at_every_line_width() -> None:
    path = _model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    _check(path, [(1, 3, 48, 320), (2, 3, 48, 136)], atol=1e-4)


def test_ppocr_detector_runs_at_every_image_size() -> None:
    path = _model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
    _check(path, [(1, 3, 320, 256), (1, 3, 96, 160)], atol=1e-4)


def test_ppocr_angle_classifier_runs_at_every_batch() -> None:
    path = _model("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    _check(path, [(1, 3, 48, 192), (4, 3, 48, 192)], atol=1e-5)


@pytest.mark.slow  # a 54 MB model: about 10 s to convert and run here
def test_ddddocr_reader_runs_at_every_width() -> None:
    path = _model("ddddocr", "common.onnx")
    _check(path, [(1, 1, 64, 200), (1, 1, 64, 96)], atol=1e-4)
