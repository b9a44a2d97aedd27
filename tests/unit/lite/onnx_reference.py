"""Running one ONNX op or a few nodes in onnxruntime, as the reference for kernel tests
(graph optimizations off: tests/references.py says why)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from tests.references import run_ort_reference

onnx = pytest.importorskip("onnx", reason="onnx is a test extra")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test extra")
from onnx import helper, numpy_helper  # noqa: E402


def run_onnx_graph(
    nodes: Sequence[Any],
    feeds: Mapping[str, np.ndarray],
    constants: Mapping[str, Any],
    outputs: Sequence[str] = ("y",),
    *,
    opset: int = 17,
) -> list[np.ndarray]:
    """Run `nodes` (onnx.helper nodes, com.microsoft ones allowed) on `feeds`, with
    `constants` as initializers, and return `outputs`."""
    graph = helper.make_graph(
        list(nodes),
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return run_ort_reference(model, dict(feeds), list(outputs))


def run_onnx_op(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    num_outputs: int = 1,
    initializers: Sequence[int] = (),
    opset: int = 17,
    **attrs: Any,
) -> list[np.ndarray]:
    """Build a one-node ONNX model for `op_type` and run it in onnxruntime (1 thread).

    Inputs listed in `initializers` become graph initializers (constants); None inputs are
    passed as empty names (absent optional inputs).
    """
    names, constants, feeds = [], {}, {}
    for k, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{k}"
        names.append(name)
        if k in initializers:
            constants[name] = np.asarray(x)
        else:
            feeds[name] = np.asarray(x)
    outputs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op_type, names, outputs, **attrs)
    return run_onnx_graph([node], feeds, constants, outputs, opset=opset)
