"""Running a single ONNX op in onnxruntime, as the reference for kernel tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is a test extra")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test extra")
from onnx import helper, numpy_helper  # noqa: E402


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
    names, graph_inputs, inits, feeds = [], [], [], {}
    for k, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{k}"
        names.append(name)
        x = np.asarray(x)
        if k in initializers:
            inits.append(numpy_helper.from_array(x, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(x.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(x.shape)))
            feeds[name] = x
    outputs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op_type, names, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        "single_op",
        graph_inputs,
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(outputs, feeds)
