"""Peer runtimes as references that compute a graph's own semantics, the same on every CPU.

A peer's optimized kernels depend on the machine: without AVX-512 VNNI, onnxruntime's
u8s8 int8 kernels sum byte pairs into saturating 16-bit lanes (VPMADDUBSW), and its graph
optimizer fuses a QDQ graph's float ops into those kernels; LiteRT may hand int8 layers
to XNNPACK, which requantizes in float. The tests compare with these instead:

- onnxruntime with graph optimizations off: every node runs as written (a QDQ graph's
  float ops stay float). A QOperator graph's QLinear nodes still run onnxruntime's int8
  kernels, which are exact on every CPU only while a pair of products cannot leave int16:
  such tests use 7-bit weights (`|w| <= 64`, onnxruntime's `reduce_range`), for which
  `255 * 64 * 2 < 2**15`. uint8 weights need no such care: u8u8 products are widened to
  16 bits before they are summed in 32.
- LiteRT with its reference kernels (OpResolverType.BUILTIN_REF), TFLite's integer
  arithmetic as written.

The peers are test extras: importing this module skips a test module without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

# The widest weight for which onnxruntime's u8s8 pair sums cannot saturate int16.
EXACT_INT8_WEIGHT = 64


def ort_reference_session(model: Any) -> Any:
    """An onnxruntime CPU session of `model` (a path, serialized bytes or a ModelProto) with
    graph optimizations off, on one thread, warnings silenced."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test extra")
    if isinstance(model, Path):
        model = str(model)
    elif not isinstance(model, str | bytes):
        model = model.SerializeToString()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run_ort_reference(
    model: Any, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
) -> list[np.ndarray]:
    """`outputs` (all by default) of `model` on `feeds`, as `ort_reference_session` runs it."""
    return list(ort_reference_session(model).run(outputs, feeds))


def litert_reference_interpreter(data: bytes) -> Any:
    """A LiteRT interpreter of the .tflite `data` on TFLite's reference kernels."""
    litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT is a test extra")
    return litert.Interpreter(
        model_content=data, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF
    )
