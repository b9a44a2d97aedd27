"""Dynamic input dimensions: converted once without --input-shape, kept symbolic (named as
ONNX's dim_param) in the file, and planned by the runtime for every size fed, against
onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sporenet.converter import ConversionError, convert_onnx
from sporenet.lite import Interpreter, parse
from sporenet.lite.errors import InputError, ShapeError
from sporenet.lite.inspect_cli import describe
from sporenet.lite.ops import OpCode
from tests.unit.converter.helpers import TensorProto, helper, make_model, onnx, run_ort

RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_net() -> object:
    """Conv -> Relu -> MaxPool, then a Reshape whose target is computed from the input's
    dynamic height and width (Shape -> Gather -> Div -> Mul -> Concat: [N, 8 * H/2, W/2],
    which no static target with 0 and -1 expresses), and a ConvTranspose that brings the
    pooled map back to full size."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ConvTranspose", ["p", "wt", "bt"], ["up"], strides=[2, 2]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"]),
        helper.make_node("Gather", ["s", "i2"], ["h"]),
        helper.make_node("Gather", ["s", "i3"], ["w_"]),
        helper.make_node("Div", ["h", "two"], ["h2"]),
        helper.make_node("Mul", ["h2", "eight"], ["rows"]),
        helper.make_node("Div", ["w_", "two"], ["cols"]),
        helper.make_node("Concat", ["n", "rows", "cols"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["flat"]),
    ]
    inits = {
        "w": rand(8, 3, 3, 3),
        "wt": rand(8, 4, 2, 2),
        "bt": rand(4),
        "i0": np.array([0], np.int64),
        "i2": np.array([2], np.int64),
        "i3": np.array([3], np.int64),
        "two": np.array([2], np.int64),
        "eight": np.array([8], np.int64),
    }
    return make_model(
        nodes,
        {"x": ["N", 3, "H", "W"]},
        ["flat", "up"],
        initializers=inits,
        opset=13,
        output_shapes={"flat": ["N", "R", "C"], "up": ["N", 4, "H", "W"]},
    )


def test_conv_net_converts_once_and_runs_at_every_size_like_onnxruntime() -> None:
    model = _conv_net()
    data = convert_onnx(model)
    ir = parse(data)
    x = ir.tensors[ir.signature().inputs["x"]]
    assert x.shape == (-1, 3, -1, -1)
    assert x.dim_names == ("N", "", "H", "W")
    # The shape arithmetic stays in the file: it depends on H and W.
    assert OpCode.SHAPE in {n.op for n in ir.graphs[0].nodes}
    assert "x [N, 3, H, W]" in describe(ir)
    interpreter = Interpreter(model_content=data)
    for shape in [(1, 3, 8, 8), (2, 3, 16, 24), (1, 3, 30, 6), (3, 3, 64, 40)]:
        feeds = {"x": rand(*shape)}
        want = run_ort(model, feeds)
        got = interpreter.run(feeds)
        for name, w in zip(("flat", "up"), want, strict=True):
            assert got[name].shape == w.shape
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4)


def test_resize_tensor_input_replans_and_details_keep_the_signature() -> None:
    interpreter = Interpreter(model_content=convert_onnx(_conv_net()))
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, [2, 3, 12, 20])
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()[0]
    assert list(details["shape"]) == [2, 3, 12, 20]
    assert list(details["shape_signature"]) == [-1, 3, -1, -1]
    x = rand(2, 3, 12, 20)
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    flat = next(d for d in interpreter.get_output_details() if d["name"] == "flat")
    assert interpreter.get_tensor(flat["index"]).shape == (2, 48, 10)
    with pytest.raises(InputError, match="shape signature is \\[-1, 3, -1, -1\\]"):
        interpreter.resize_tensor_input(index, [2, 4, 12, 20])


def test_a_size_the_model_cannot_take_names_the_input() -> None:
    interpreter = Interpreter(model_content=convert_onnx(_conv_net()))
    with pytest.raises(ShapeError, match="'x'"):
        interpreter.run({"x": rand(1, 3, 1, 8)})  # a 2x2 pooling window on one row


def test_pinned_input_shape_folds_the_shape_arithmetic() -> None:
    ir = parse(convert_onnx(_conv_net(), input_shapes={"x": (1, 3, 8, 8)}))
    assert OpCode.SHAPE not in {n.op for n in ir.graphs[0].nodes}


def _single(op: str, inputs: dict[str, list], extra: dict[str, np.ndarray], **attrs) -> object:
    node = helper.make_node(op, [*inputs, *extra], ["y"], **attrs)
    return make_model([node], inputs, ["y"], initializers=extra, opset=13)


@pytest.mark.parametrize(
    ("build", "shapes"),
    [
        # ConstantOfShape and Expand on Shape(x): the fill follows x's dynamic length.
        (
            lambda: make_model(
                [
                    helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node(
                        "ConstantOfShape",
                        ["s"],
                        ["z"],
                        value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5]),
                    ),
                    helper.make_node("Add", ["x", "z"], ["y"]),
                ],
                {"x": ["B", "T"]},
                ["y"],
                opset=13,
                output_shapes={"y": ["B", "T"]},
            ),
            [(1, 5), (3, 17)],
        ),
        # Range(0, T) from Shape(x): a position index as attention models build it.
        (
            lambda: make_model(
                [
                    helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Gather", ["s", "one"], ["t"]),
                    helper.make_node("Range", ["zero", "t", "one"], ["pos"]),
                    helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
                    helper.make_node("Add", ["x", "posf"], ["y"]),
                ],
                {"x": ["B", "T"]},
                ["y"],
                initializers={"zero": np.array(0, np.int64), "one": np.array(1, np.int64)},
                opset=13,
                output_shapes={"y": ["B", "T"]},
            ),
            [(2, 4), (1, 33)],
        ),
        # Resize to sizes computed as twice the input's height and width.
        (
            lambda: make_model(
                [
                    helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Mul", ["s", "scale"], ["sizes"]),
                    helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest"),
                ],
                {"x": [1, 2, "H", "W"]},
                ["y"],
                initializers={"scale": np.array([1, 1, 2, 2], np.int64)},
                opset=13,
                output_shapes={"y": [1, 2, "H2", "W2"]},
            ),
            [(1, 2, 5, 7), (1, 2, 9, 4)],
        ),
        # Slice ends and Tile repeats from Shape(x).
        (
            lambda: make_model(
                [
                    helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Slice", ["s", "one", "two"], ["t"]),
                    helper.make_node("Div", ["t", "two"], ["half"]),
                    helper.make_node("Slice", ["x", "zero", "half", "one"], ["front"]),
                    helper.make_node("Concat", ["one", "two"], ["reps"], axis=0),
                    helper.make_node("Tile", ["front", "reps"], ["y"]),
                ],
                {"x": ["B", "T"]},
                ["y"],
                initializers={
                    "zero": np.array([0], np.int64),
                    "one": np.array([1], np.int64),
                    "two": np.array([2], np.int64),
                },
                opset=13,
                output_shapes={"y": ["B", "T"]},
            ),
            [(2, 8), (3, 13)],
        ),
    ],
    ids=["constant-of-shape", "range", "resize-sizes", "slice-tile"],
)
def test_shape_arithmetic_on_a_dynamic_dimension_runs_at_every_size(build, shapes) -> None:
    model = build()
    interpreter = Interpreter(model_content=convert_onnx(model))
    for shape in shapes:
        feeds = {"x": rand(*shape)}
        (want,) = run_ort(model, feeds)
        got = interpreter.run(feeds)["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_graph_no_size_fits_is_refused_naming_the_input() -> None:
    # Reshape to a fixed [1, 512] only fits a width of 64: no dynamic size is accepted.
    model = make_model(
        [helper.make_node("Reshape", ["x", "target"], ["y"])],
        {"x": [1, 8, "W"]},
        ["y"],
        initializers={"target": np.array([1, 512], np.int64)},
        opset=13,
        output_shapes={"y": [1, 512]},
    )
    with pytest.raises(ConversionError) as info:
        convert_onnx(model)
    message = str(info.value)
    assert "x [1, 8, W]" in message
    assert "--input-shape x:1,8,W" in message
    # Pinned, it converts.
    assert convert_onnx(model, input_shapes={"x": (1, 8, 64)})


def test_cli_converts_without_input_shape_and_inspect_names_the_dims(tmp_path) -> None:
    source, target = tmp_path / "net.onnx", tmp_path / "net.spore"
    onnx.save(_conv_net(), source)
    run = [sys.executable, "-m"]
    converted = subprocess.run(
        [*run, "sporenet.converter.cli", str(source), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert converted.returncode == 0, converted.stderr
    shown = subprocess.run(
        [*run, "sporenet.lite.inspect_cli", str(target)], capture_output=True, text=True, timeout=60
    )
    assert "inputs x [N, 3, H, W]" in shown.stdout
    assert "up [N, 4, H, W]" in shown.stdout  # the ConvTranspose output keeps the names


def test_a_batch_declared_dynamic_but_traced_at_one_converts() -> None:
    # An exporter declared the batch dynamic but traced at batch 1 (torch.onnx.export's
    # dynamo exporter bakes it into views): [1, B*T, 4] + ones[1, T, 4] only broadcasts at
    # B = 1. The converter's probes hold the batch at 1 once varying it fails, and the
    # model runs at every sequence length.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["t"]),
        helper.make_node("Unsqueeze", ["t", "zero"], ["t1"]),
        helper.make_node("Concat", ["head", "t1", "tail"], ["target"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["target"],
            ["ones"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Reshape", ["x", "flat"], ["r"]),
        helper.make_node("Add", ["r", "ones"], ["y"]),
    ]
    model = make_model(
        nodes,
        {"x": ["batch", "seq", 4]},
        ["y"],
        initializers={
            "one": np.array(1, np.int64),
            "zero": np.array([0], np.int64),
            "head": np.array([1], np.int64),
            "tail": np.array([4], np.int64),
            "flat": np.array([1, -1, 4], np.int64),
        },
        opset=13,
        output_shapes={"y": [1, "seq", 4]},
    )
    interpreter = Interpreter(model_content=convert_onnx(model))
    for seq in (3, 17):
        feeds = {"x": rand(1, seq, 4)}
        (want,) = run_ort(model, feeds)
        np.testing.assert_array_equal(interpreter.run(feeds)["y"], want)


def test_a_named_dimension_is_one_size_at_axis_zero_and_elsewhere() -> None:
    # A graph network's inputs: edge features [num_edges, 2] and the edge list
    # [2, num_edges]; the probes must give num_edges one size in both.
    nodes = [
        helper.make_node("Transpose", ["edges"], ["t"], perm=[1, 0]),
        helper.make_node("Add", ["feat", "t"], ["s"]),
        helper.make_node("Shape", ["feat"], ["shape"]),
        helper.make_node("Concat", ["shape", "one"], ["target"], axis=0),
        helper.make_node("Reshape", ["feat", "target"], ["y"]),
    ]
    model = make_model(
        nodes,
        {"feat": ["num_edges", 2], "edges": [2, "num_edges"]},
        ["y", "s"],
        initializers={"one": np.array([1], np.int64)},
    )
    interpreter = Interpreter(model_content=convert_onnx(model))
    for n in (5, 9):
        feeds = {"feat": rand(n, 2), "edges": rand(2, n)}
        got = interpreter.run(feeds)
        for name, want in zip(("y", "s"), run_ort(model, feeds), strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-6)
