"""The real ONNX models that ship inside PyPI packages, as both lite_inference.py and
real_models.py time them: where each file lies, the inputs it is fed, and the feeds built
from that description.

The models: RapidOCR's text detector, recognizer and angle classifier
(`rapidocr-onnxruntime`), ddddocr's CNN+LSTM captcha recognizers and its YOLO-style
detector (`ddddocr`), the Silero voice-activity detectors (`silero-vad`) and Magika's
file-type classifier (`magika`); `pip install sporenet[bench-models]` installs them.

The scripts run as `python benchmarks/NAME.py`, so this module is imported as
`_packaged_models`. It imports NumPy only when feeds are built, so a parent process that
only starts measuring children stays light.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# name -> (shape, dtype, fill); fill is "uniform", "page", "audio", "zeros", "ones",
# "bytes", "ids:N" (integers in [0, N)) or an integer
Feeds = dict[str, tuple[tuple[int, ...], str, str]]


@dataclass(frozen=True)
class PackagedModel:
    """One real model: where it ships and the inputs it is fed."""

    name: str
    package: str
    path: str  # inside the package's directory
    feeds: Feeds
    quick: bool = False  # part of real_models.py --quick

    def conversion_shapes(self) -> dict[str, tuple[int, ...]]:
        """The fed sizes the model is converted at (scalar inputs keep their own)."""
        return {name: shape for name, (shape, _, _) in self.feeds.items() if shape}


def _img(*shape: int) -> tuple[tuple[int, ...], str, str]:
    return (shape, "float32", "uniform")


_AUDIO: Feeds = {
    "input": ((1, 512), "float32", "audio"),
    "state": ((2, 1, 128), "float32", "zeros"),
}
_SR: Feeds = {"sr": ((), "int64", "16000")}

PACKAGED_MODELS = (
    PackagedModel(
        "ppocr-det",
        "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx",
        # A text-like page: on noise the detector's map stays below 1e-5 everywhere, so a
        # difference relative to its largest value measures only the sigmoid's tail.
        {"x": ((1, 3, 480, 640), "float32", "page")},
    ),
    PackagedModel(
        "ppocr-rec",
        "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_rec_infer.onnx",
        {"x": _img(1, 3, 48, 320)},
        quick=True,
    ),
    PackagedModel(
        "ppocr-cls",
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": _img(1, 3, 48, 192)},
        quick=True,
    ),
    PackagedModel("ddddocr", "ddddocr", "common.onnx", {"input1": _img(1, 1, 64, 160)}, quick=True),
    PackagedModel("ddddocr-old", "ddddocr", "common_old.onnx", {"input1": _img(1, 1, 64, 160)}),
    PackagedModel("ddddocr-det", "ddddocr", "common_det.onnx", {"images": _img(1, 3, 416, 416)}),
    PackagedModel(
        "silero-vad", "silero_vad", "data/silero_vad.onnx", {**_AUDIO, **_SR}, quick=True
    ),
    PackagedModel("silero-op15", "silero_vad", "data/silero_vad_16k_op15.onnx", {**_AUDIO, **_SR}),
    PackagedModel(
        "silero-ifless", "silero_vad", "data/silero_vad_op18_ifless.onnx", {**_AUDIO, **_SR}
    ),
    PackagedModel("silero-half", "silero_vad", "data/silero_vad_half.onnx", dict(_AUDIO)),
    PackagedModel(
        "silero-openvino",
        "silero_vad",
        "data/silero_vad_openvino_16k.onnx",
        {"input": ((1, 576), "float32", "audio"), "state": _AUDIO["state"]},
    ),
    PackagedModel(
        "silero-sequence",
        "silero_vad",
        "data/silero_vad_16k_sequence.onnx",
        {
            "input": ((8, 576), "float32", "audio"),
            "h": ((1, 1, 128), "float32", "zeros"),
            "c": ((1, 1, 128), "float32", "zeros"),
        },
    ),
    PackagedModel(
        "magika",
        "magika",
        "models/standard_v3_3/model.onnx",
        {"bytes": ((1, 2048), "int32", "bytes")},
        quick=True,
    ),
)


def _package_dir(package: str) -> Path | None:
    # Searched without the benchmarks folder, where silero_vad.py is a benchmark.
    here = Path(__file__).resolve().parent
    paths = [p for p in sys.path if Path(p or ".").resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec(package, paths)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def model_path(model: PackagedModel) -> Path | None:
    """The model's .onnx file, or None when its package is not installed."""
    root = _package_dir(model.package)
    path = root / model.path if root is not None else None
    return path if path is not None and path.is_file() else None


def make_feeds(feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Seeded inputs as `feeds` describes them (a `PackagedModel.feeds`, or the same read
    back from JSON, with lists for tuples)."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for name, (shape, dtype, fill) in feeds.items():
        if fill == "uniform":
            out[name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif fill == "page":
            out[name] = _page(rng, shape)
        elif fill == "audio":
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif fill == "zeros":
            out[name] = np.zeros(shape, dtype)
        elif fill == "ones":
            out[name] = np.ones(shape, dtype)
        elif fill == "bytes":
            out[name] = rng.integers(0, 256, shape).astype(dtype)
        elif fill.startswith("ids:"):
            out[name] = rng.integers(0, int(fill[4:]), shape).astype(dtype)
        else:
            out[name] = np.full(shape, int(fill), dtype)
    return out


def _page(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A light page with dark lines of glyph-like strokes, scaled to [-1, 1] as PP-OCR's
    preprocessing scales images."""
    import numpy as np

    *lead, height, width = shape
    page = np.ones((height, width), np.float32)
    line = max(height // 16, 4)
    for top in range(line, height - 2 * line, 2 * line):
        left = int(rng.integers(0, width // 4))
        right = int(rng.integers(width // 2, width))
        strokes = rng.random(right - left) < 0.45
        page[top : top + line, left:right][:, strokes] = -1.0
    return np.broadcast_to(page, (*lead, height, width)).astype(np.float32)
