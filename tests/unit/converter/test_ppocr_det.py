"""The PP-OCR text detector against onnxruntime, and the sigmoid tail it ends in.

The detector ends in Sigmoid. On an input with no text in it (uniform noise in [0, 1),
not normalized) every logit is below about -12, so the whole probability map is under
1e-5. There onnxruntime's Sigmoid, an approximation with an absolute error of about 1e-7
that returns 0 below about -17, is off by up to a few percent of the map's largest value,
while sporenet's 1 / (1 + exp(-x)) is exact to float32 rounding. So the model is checked
on its logits (relative), on its probabilities (absolute, as probabilities are read),
and the sigmoid itself against a float64 reference rather than onnxruntime.

The real-model tests run when the `rapidocr_onnxruntime` package is installed (it ships
models/ch_PP-OCRv4_det_infer.onnx) or SPORENET_PPOCR_DET names that file.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from tests.packaged import packaged_file
from tests.references import ort_reference_session
from tests.unit.converter.helpers import helper, make_model, value_info

MODEL = packaged_file(
    "rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", env="SPORENET_PPOCR_DET"
)
needs_model = pytest.mark.skipif(
    MODEL is None,
    reason="the rapidocr-onnxruntime package is not installed "
    "(or set SPORENET_PPOCR_DET to ch_PP-OCRv4_det_infer.onnx)",
)
SHAPE = (1, 3, 320, 320)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def test_sigmoid_tail_matches_float64() -> None:
    """Deep-negative logits (where the detector's background lies) keep their relative
    precision: an approximate sigmoid fails this, onnxruntime's included."""
    x = np.linspace(-30.0, 30.0, 241, dtype=np.float32)[None]
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": x.shape}, ["y"])
    got = Interpreter(model_content=convert_onnx(model)).run({"x": x})["y"]
    np.testing.assert_allclose(got, _sigmoid64(x), rtol=2e-7, atol=0)


def _image(kind: str) -> np.ndarray:
    """'noise': uniform [0, 1) as a benchmark feeds it; 'text': dark strokes on white,
    normalized to [-1, 1] as RapidOCR feeds the detector."""
    rng = np.random.default_rng(0)
    if kind == "noise":
        return rng.random(SHAPE, dtype=np.float32)
    page = np.ones(SHAPE[2:], np.float32)
    for row in range(16, SHAPE[2] - 32, 36):
        for col in range(8, SHAPE[3] - 16, 14):
            if rng.random() < 0.8:
                page[row : row + 20, col + 2 : col + 6] = 0.05
                page[row + 9 : row + 12, col : col + 10] = 0.05
    return np.broadcast_to((page - 0.5) / 0.5, SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def detector() -> tuple[object, Interpreter, str, str]:
    """onnxruntime and sporenet on the detector with its logits as a second output."""
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(str(MODEL))
    sigmoid = next(n for n in proto.graph.node if n.op_type == "Sigmoid")
    logits, probabilities = sigmoid.input[0], sigmoid.output[0]
    assert [o.name for o in proto.graph.output] == [probabilities]
    proto.graph.output.append(value_info(logits, ["n", 1, "h", "w"]))
    data = proto.SerializeToString()
    session = ort_reference_session(data)
    interpreter = Interpreter(model_content=convert_onnx(data, input_shapes={"x": SHAPE}))
    return session, interpreter, logits, probabilities


@needs_model
@pytest.mark.parametrize("kind", ["noise", "text"])
def test_detector_matches_onnxruntime(
    detector: tuple[object, Interpreter, str, str], kind: str
) -> None:
    session, interpreter, logits, probabilities = detector
    x = _image(kind)
    names = [logits, probabilities]
    want = dict(zip(names, session.run(names, {"x": x}), strict=True))  # type: ignore[attr-defined]
    got = interpreter.run({"x": x})
    # the case is what it says: noise finds no text (the whole map is in the sigmoid's
    # tail), the page does
    assert (float(want[probabilities].max()) > 0.5) == (kind == "text")
    scale = float(np.abs(want[logits]).max())
    assert float(np.abs(got[logits] - want[logits]).max()) <= 1e-5 * scale
    # logits up to ~150 in magnitude carry ~1e-4 absolute float32 noise; the sigmoid's
    # slope is at most 1/4
    np.testing.assert_allclose(got[probabilities], want[probabilities], rtol=0, atol=1e-4)
    np.testing.assert_allclose(got[probabilities], _sigmoid64(got[logits]), rtol=2e-7, atol=1e-12)
