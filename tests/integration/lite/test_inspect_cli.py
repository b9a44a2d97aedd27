"""`sporenet-inspect` as a real subprocess on int8, float16 and float model files."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import save
from sporenet.lite.graph import Quantization
from sporenet.lite.ops import OpCode


def inspect(path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sporenet.lite.inspect_cli", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_inspect_shows_quantization_sparsity_and_size_by_dtype(tmp_path):
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8)
    b.quantize(x, 0.1, -3)
    w = np.zeros((6, 4), np.int8)
    w[0] = 5
    wq = Quantization(np.linspace(0.01, 0.06, 6).astype(np.float32), np.zeros(6, np.int64))
    y = b.op(
        OpCode.FULLY_CONNECTED,
        [
            x,
            b.constant("fc.w", w, quantization=wq),
            b.constant("fc.b", np.arange(6, dtype=np.int32)),
        ],
    )
    b.quantize(y, 0.5, 2, dtype=np.int8)
    h = b.op(OpCode.DEQUANTIZE, [y])
    b.output(b.op(OpCode.MUL, [h, b.constant("gain", np.ones(6, np.float16))]), "y")
    path = save(b.build(), tmp_path / "m.spore")
    out = inspect(path)
    assert "q: scale=0.1 zp=-3" in out  # per-tensor input
    assert "q: axis=0 scale=[0.01, 0.02, 0.03, ... (6)] zp=0 sparsity=83.3%" in out
    assert "q: scale=0.5 zp=2" in out
    assert (
        "constants by dtype: float16 1 tensors 12 bytes, int32 1 tensors 24 bytes, "
        "int8 1 tensors 24 bytes" in out
    )
    assert "parameters: 30 " in out  # 24 int8 weights + 6 float16
