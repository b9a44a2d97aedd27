"""The check the single-op TFLite tests share: convert, compare with LiteRT, and check
that every IR op the handlers emitted is one their table entry declares."""

from __future__ import annotations

import numpy as np

from sporenet.converter import convert_tflite
from sporenet.converter.tflite_import.importer import import_tflite
from sporenet.converter.tflite_import.ops import HANDLERS, LAYOUT, RUNS_SUBGRAPHS
from sporenet.converter.tflite_import.reader import read_tflite
from sporenet.lite import Interpreter
from tests.unit.converter.tflite_builder import run_litert

RTOL = 1e-4  # the target for float models, relative to the output's scale


def check_emits(data: bytes) -> None:
    emitted: dict[str, set] = {}
    import_tflite(read_tflite(data), emitted=emitted)
    for name, ops in emitted.items():
        if name in RUNS_SUBGRAPHS:
            continue  # their subgraphs' operators are checked under their own names
        extra = ops - set(HANDLERS[name].emits) - set(LAYOUT)
        assert not extra, f"{name} emitted {sorted(o.name for o in extra)}, not declared"


def assert_matches_litert(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float outputs within RTOL of the output's scale, integer and bool ones exactly,
    int8 ones within one quantization step; optimized and not."""
    check_emits(data)
    want = run_litert(data, feeds)
    for optimize in (True, False):
        got = Interpreter(model_content=convert_tflite(data, optimize=optimize)).run(feeds)
        assert sorted(got) == sorted(want)
        for name, w in want.items():
            g = got[name]
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype)
            if w.dtype.kind == "f":
                scale = max(float(np.max(np.abs(w))), 1e-6) if w.size else 1.0
                error = float(np.max(np.abs(g - w))) / scale if w.size else 0.0
                assert error < RTOL, f"{name}: max error {error:.2e} of the output's scale"
            elif w.dtype in (np.int8, np.uint8):
                assert np.abs(g.astype(np.int32) - w.astype(np.int32)).max() <= 1
            else:
                np.testing.assert_array_equal(g, w)
    return want
