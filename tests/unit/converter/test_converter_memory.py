"""The converter's peak memory: values folded only to fold their readers are not all held
at once (weights stored int8 and dequantized by Cast and Mul, an embedding table), and
shape inference keeps no kernel or folded value."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx  # noqa: E402
from sporenet.converter.onnx_import.importer import LARGE_ATTRIBUTE, attribute_value  # noqa: E402
from sporenet.lite import Interpreter  # noqa: E402
from sporenet.lite.planner import infer  # noqa: E402
from tests.references import run_ort_reference  # noqa: E402

WIDTH, LAYERS, VOCAB = 256, 6, 8192


def _weight_only_int8_model() -> bytes:
    """ids -> Gather of an int8 embedding table [VOCAB, WIDTH] (8 MiB in float32), then
    LAYERS MatMuls with int8 weights [WIDTH, WIDTH]: each int8 tensor Cast to float and
    multiplied by its scale in the graph itself, as weight-only exporters write them."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def dequantized(name: str, shape: tuple[int, ...]) -> str:
        q = rng.integers(-127, 128, shape, dtype=np.int8)
        inits.append(numpy_helper.from_array(q, f"{name}_q"))
        inits.append(numpy_helper.from_array(np.array(0.01, np.float32), f"{name}_s"))
        nodes.append(helper.make_node("Cast", [f"{name}_q"], [f"{name}_f"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [f"{name}_f", f"{name}_s"], [name]))
        return name

    table = dequantized("table", (VOCAB, WIDTH))
    nodes.append(helper.make_node("Gather", [table, "ids"], ["h0"]))
    for k in range(LAYERS):
        w = dequantized(f"w{k}", (WIDTH, WIDTH))
        nodes.append(helper.make_node("MatMul", [f"h{k}", w], [f"h{k + 1}"]))
    graph = helper.make_graph(
        nodes,
        "weight_only_int8",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info(f"h{LAYERS}", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_int8_weights_dequantized_in_the_graph_are_never_all_held_in_float32() -> None:
    data = _weight_only_int8_model()
    int8_bytes = (VOCAB + LAYERS * WIDTH) * WIDTH
    tracemalloc.start()
    try:
        spore = convert_onnx(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Every float32 copy at once would be 4x the int8 bytes, the table's Cast and Mul
    # outputs together 2x the table in float32; the converter holds about one weight's.
    assert peak < 1.5 * int8_bytes, f"converter peak {peak:,} B for {int8_bytes:,} B of int8"
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 4), dtype=np.int64)
    want = run_ort_reference(data, {"ids": ids})[0]
    interpreter = Interpreter(model_content=spore)
    got = interpreter.run({"ids": ids})[f"h{LAYERS}"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_shape_inference_keeps_no_kernel_and_no_folded_value() -> None:
    from sporenet.converter.convert import convert_onnx_model

    model, _ = convert_onnx_model(_weight_only_int8_model(), optimize=False)
    ids = model.graphs[0].inputs[0]
    full_specs, kernels, folded = infer(model, 0, {ids: (2, 4)})
    lean_specs, lean_kernels, lean_folded = infer(model, 0, {ids: (2, 4)}, shapes_only=True)
    assert folded and not lean_folded
    assert any(k is not None for k in kernels) and all(k is None for k in lean_kernels)
    for i, spec in full_specs.items():
        assert (lean_specs[i].shape, lean_specs[i].dtype) == (spec.shape, spec.dtype)
        if model.tensors[i].data is None and i not in model.graphs[0].outputs:
            assert lean_specs[i].value is None or lean_specs[i].value.nbytes <= 1024


def test_large_integer_and_float_attributes_are_read_as_arrays() -> None:
    small = helper.make_attribute("a", [1, 2, 3])
    ints = helper.make_attribute("b", list(range(LARGE_ATTRIBUTE)))
    floats = helper.make_attribute("c", [0.1] * LARGE_ATTRIBUTE)
    assert attribute_value(small) == [1, 2, 3]
    as_ints, as_floats = attribute_value(ints), attribute_value(floats)
    assert as_ints.dtype == np.int64 and as_ints.tolist() == list(range(LARGE_ATTRIBUTE))
    # float64 holds the stored float32 values exactly, as onnx.helper's Python floats do.
    assert as_floats.dtype == np.float64
    assert as_floats.tolist() == helper.get_attribute_value(floats)
