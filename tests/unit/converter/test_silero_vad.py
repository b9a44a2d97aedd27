"""Silero VAD (an ONNX model with nested If subgraphs) against onnxruntime.

The model ships in the `silero-vad` PyPI package (silero_vad/data/silero_vad.onnx); the
test runs when that package is installed or SPORENET_SILERO_VAD names the .onnx file, and
skips otherwise (the wheel is 11 MB, too large for the test extra).
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from sporenet.lite.errors import ShapeError
from tests.packaged import packaged_file
from tests.references import ort_reference_session

MODEL = packaged_file("silero_vad", "data/silero_vad.onnx", env="SPORENET_SILERO_VAD")
pytestmark = pytest.mark.skipif(
    MODEL is None,
    reason="the silero-vad package is not installed "
    "(or set SPORENET_SILERO_VAD to silero_vad.onnx)",
)


def _audio(samples: int) -> np.ndarray:
    """Silence, then a tone with noise: the speech probability moves across the chunks."""
    t = np.arange(samples) / 16000
    rng = np.random.default_rng(0)
    signal = 0.3 * np.sin(2 * np.pi * 220 * t) * (t > samples / 32000)
    return (signal + 0.01 * rng.standard_normal(samples)).astype(np.float32)


# The package's variants with If subgraphs (besides silero_vad.onnx): an opset-18 export
# whose If selects the rate, a 16 kHz-only one and a float16-weights one (no sr input).
VARIANTS = ("silero_vad_op18_ifless.onnx", "silero_vad_16k_op15.onnx", "silero_vad_half.onnx")


@pytest.mark.parametrize(
    "name, chunk, rate",
    [
        ("silero_vad.onnx", 512, 16000),
        ("silero_vad.onnx", 256, 16000),
        ("silero_vad.onnx", 256, 8000),
        *((v, 512, 16000) for v in VARIANTS),
        ("silero_vad_op18_ifless.onnx", 256, 8000),
    ],
)
def test_streamed_chunks_match_onnxruntime(name: str, chunk: int, rate: int) -> None:
    path = MODEL.with_name(name)  # type: ignore[union-attr]
    if not path.exists():
        pytest.skip(f"{name} is not beside {MODEL}")
    interpreter = Interpreter(
        model_content=convert_onnx(path, input_shapes={"input": (1, chunk), "state": (2, 1, 128)})
    )
    session = ort_reference_session(path)
    takes_rate = any(i.name == "sr" for i in session.get_inputs())
    audio = _audio(chunk * 12)
    state = np.zeros((2, 1, 128), np.float32)
    probabilities = []
    for k in range(12):
        feeds = {
            "input": audio[None, k * chunk : (k + 1) * chunk],
            "state": state,
            "sr": np.array(rate, np.int64),
        }
        if not takes_rate:
            del feeds["sr"]
        want_prob, want_state = session.run(None, feeds)
        got = dict(zip(("output", "stateN"), interpreter.run(feeds).values(), strict=True))
        # Tolerances relative to the output's range: the LSTM state accumulates float32
        # rounding that differs from onnxruntime's fused kernels.
        np.testing.assert_allclose(got["output"], want_prob, rtol=0, atol=1e-5)
        np.testing.assert_allclose(
            got["stateN"], want_state, rtol=0, atol=1e-4 * float(np.abs(want_state).max())
        )
        state = want_state
        probabilities.append(float(want_prob.ravel()[0]))
    assert len(set(probabilities)) > 1  # the carried state and the chunks change the output


def test_8khz_branch_at_16khz_chunk_size_fails_like_onnxruntime() -> None:
    """512-sample chunks fit only the 16 kHz branch; onnxruntime fails on the other too."""
    interpreter = Interpreter(
        model_content=convert_onnx(MODEL, input_shapes={"input": (1, 512), "state": (2, 1, 128)})
    )
    feeds = {
        "input": np.zeros((1, 512), np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(8000, np.int64),
    }
    with pytest.raises(ShapeError, match="branch cannot run at these input shapes"):
        interpreter.run(feeds)
