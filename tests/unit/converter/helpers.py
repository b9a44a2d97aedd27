"""Building small ONNX models and running them in onnxruntime and through the converter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")
ort = pytest.importorskip("onnxruntime", reason="test extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx  # noqa: E402
from sporenet.lite import Interpreter, parse  # noqa: E402
from sporenet.lite.graph import Model  # noqa: E402
from tests.references import run_ort_reference  # noqa: E402


def value_info(name: str, shape: Sequence[int | str] | None, dtype: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def subgraph(
    nodes: Sequence[Any],
    name: str,
    outputs: Sequence[tuple[str, int, Sequence[int | str] | None]],
    inputs: Sequence[Any] = (),
) -> Any:
    """A graph for an If branch or a Loop body: `outputs` as (name, dtype, shape)."""
    return helper.make_graph(
        nodes, name, list(inputs), [helper.make_tensor_value_info(o, t, s) for o, t, s in outputs]
    )


def make_model(
    nodes: Sequence[Any],
    inputs: dict[str, Sequence[int | str]],
    outputs: Sequence[str],
    *,
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    input_dtypes: dict[str, int] | None = None,
    output_shapes: dict[str, Sequence[int]] | None = None,
) -> Any:
    """A checked ONNX model; outputs get inferred types (ONNX shape inference) unless
    `output_shapes` declares them (float)."""
    dtypes = input_dtypes or {}
    graph = helper.make_graph(
        list(nodes),
        "test",
        [value_info(n, s, dtypes.get(n, TensorProto.FLOAT)) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 8)
    inferred = onnx.shape_inference.infer_shapes(model)
    by_name = {v.name: v for v in inferred.graph.value_info}
    for out in model.graph.output:
        if output_shapes and out.name in output_shapes:
            out.CopyFrom(value_info(out.name, output_shapes[out.name]))
        elif out.name in by_name:
            out.CopyFrom(by_name[out.name])
    onnx.checker.check_model(model)
    return model


def run_ort(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return run_ort_reference(model, feeds)


def convert(model: Any, **options: Any) -> Model:
    """Convert to .spore bytes and parse them back (the real file round trip)."""
    return parse(convert_onnx(model, **options))


def run_spore(model: Any, feeds: dict[str, np.ndarray], **options: Any) -> list[np.ndarray]:
    interpreter = Interpreter(model_content=convert_onnx(model, **options))
    outputs = interpreter.run(feeds)
    return [outputs[v.name] for v in model.graph.output]


def assert_matches_ort(
    model: Any,
    feeds: dict[str, np.ndarray],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **options: Any,
) -> list[np.ndarray]:
    """Converted outputs equal onnxruntime's, optimized and not."""
    want = run_ort(model, feeds)
    for optimize in (True, False):
        got = run_spore(model, feeds, optimize=optimize, **options)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, (optimize, g.shape, w.shape)
            assert g.dtype == w.dtype, (optimize, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"optimize={optimize}")
    return want


def op_names(model: Model) -> list[str]:
    return [n.op.name for n in model.graphs[0].nodes]
