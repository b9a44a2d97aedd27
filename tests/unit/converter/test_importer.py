"""ONNX import semantics, each checked against onnxruntime on real converted files."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.converter.helpers import (
    assert_matches_ort,
    convert,
    helper,
    make_model,
    numpy_helper,
    onnx,
    op_names,
    run_ort,
    run_spore,
)

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.5, 2.0)])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 5), ()])
def test_gemm_attributes_and_bias_shapes(
    trans_a: int, trans_b: int, alpha: float, beta: float, c_shape: tuple[int, ...] | None
) -> None:
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4) if trans_b else rand(4, 5)
    inits = {"B": b}
    inputs = ["A", "B"]
    if c_shape is not None:
        inits["C"] = rand(*c_shape)
        inputs.append("C")
    node = helper.make_node(
        "Gemm", inputs, ["Y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta
    )
    model = make_model([node], {"A": list(a.shape)}, ["Y"], initializers=inits)
    assert_matches_ort(model, {"A": a})
    # A constant B becomes FullyConnected (pre-packed weights), never MatMul.
    assert "FULLY_CONNECTED" in op_names(convert(model))


def test_gemm_with_runtime_b_uses_matmul() -> None:
    node = helper.make_node("Gemm", ["A", "B", "C"], ["Y"], transB=1, alpha=0.3, beta=0.7)
    model = make_model([node], {"A": [3, 4], "B": [5, 4]}, ["Y"], initializers={"C": rand(5)})
    assert_matches_ort(model, {"A": rand(3, 4), "B": rand(5, 4)})
    assert "MATMUL" in op_names(convert(model))


def test_gemm_transb_alpha_one_keeps_the_initializer_bit_for_bit() -> None:
    w = rand(6, 4)
    w[0, 0] = np.float32(1e-40)  # a denormal: must survive unchanged
    b = rand(6)
    node = helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)
    model = make_model([node], {"x": [2, 4]}, ["y"], initializers={"W": w, "b": b})
    ir = convert(model)
    weights = ir.weights()
    assert weights["W"].tobytes() == w.tobytes()
    assert weights["b"].tobytes() == b.tobytes()


def test_initializers_of_every_storable_dtype_are_bit_exact() -> None:
    values = {
        "f16": np.array([1.5, -0.0, 65504], np.float16),
        "f64": np.array([np.pi, -1e-300], np.float64),
        "i8": np.array([-128, 127], np.int8),
        "u8": np.array([0, 255], np.uint8),
        "i32": np.array([-(2**31), 2**31 - 1], np.int32),
        "i64": np.array([-(2**63), 2**63 - 1], np.int64),
        "b": np.array([True, False]),
    }
    nodes = [helper.make_node("Identity", [k], [f"{k}_out"]) for k in values]
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        [
            helper.make_tensor_value_info(
                f"{k}_out", helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)
            )
            for k, v in values.items()
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ir = convert(model, optimize=False)
    for name, value in values.items():
        stored = ir.weights()[name]
        assert stored.dtype == value.dtype and stored.tobytes() == value.tobytes(), name


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_axis_before_and_after_opset_13(opset: int, axis: int, op: str) -> None:
    # Before 13 the input is coerced to 2-D at `axis`; from 13 on it is one axis.
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    model = make_model([node], {"x": [2, 3, 4]}, ["y"], opset=opset)
    assert_matches_ort(model, {"x": rand(2, 3, 4)})


def test_softmax_default_axis_differs_between_opsets() -> None:
    x = rand(2, 3, 4)
    old = run_spore(
        make_model([helper.make_node("Softmax", ["x"], ["y"])], {"x": [2, 3, 4]}, ["y"], opset=11),
        {"x": x},
    )[0]
    new = run_spore(
        make_model([helper.make_node("Softmax", ["x"], ["y"])], {"x": [2, 3, 4]}, ["y"], opset=13),
        {"x": x},
    )[0]
    np.testing.assert_allclose(old.reshape(2, 12).sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(new.sum(axis=-1), 1, rtol=1e-6)


@pytest.mark.parametrize(
    ("in_shape", "target", "allowzero"),
    [
        ([3, 8], [0, -1], 0),  # 0 copies the input dimension
        ([3, 8], [-1, 4], 0),  # -1 is inferred
        ([2, 3, 2, 2], [2, 0, 4], 0),
        ([3, 1, 8], [3, 0, 8], 0),
        ([0, 3, 8], [0, 3, 8], 1),  # allowzero: 0 is a real zero-size dimension
        ([3, 8], [4, 6], 0),
    ],
)
def test_reshape_zero_minus_one_allowzero(
    in_shape: list[int], target: list[int], allowzero: int
) -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=allowzero)
    model = make_model(
        [node], {"x": in_shape}, ["y"], opset=14, initializers={"shape": np.array(target, np.int64)}
    )
    assert_matches_ort(model, {"x": rand(*in_shape)})


@pytest.mark.parametrize("opset", [7, 13])
def test_clip_bounds_as_attributes_and_inputs(opset: int) -> None:
    x = rand(4, 5) * 3
    if opset < 11:
        node = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=1.5)
        model = make_model([node], {"x": [4, 5]}, ["y"], opset=opset)
    else:
        node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
        model = make_model(
            [node],
            {"x": [4, 5]},
            ["y"],
            opset=opset,
            initializers={"lo": np.array(-0.5, np.float32), "hi": np.array(1.5, np.float32)},
        )
    assert_matches_ort(model, {"x": x})


def test_clip_with_only_a_max_input() -> None:
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    model = make_model(
        [node], {"x": [4, 5]}, ["y"], opset=13, initializers={"hi": np.array(0.25, np.float32)}
    )
    assert_matches_ort(model, {"x": rand(4, 5)})


def test_clip_with_runtime_bounds() -> None:
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    model = make_model([node], {"x": [4, 5], "lo": [], "hi": []}, ["y"], opset=13)
    feeds = {"x": rand(4, 5), "lo": np.array(-0.2, np.float32), "hi": np.array(0.3, np.float32)}
    assert_matches_ort(model, feeds)


@pytest.mark.parametrize("opset", [7, 11, 18])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_as_attributes_or_inputs(opset: int, mode: str) -> None:
    pads = [0, 1, 2, 0, 2, 1]
    if opset < 11:
        node = helper.make_node("Pad", ["x"], ["y"], pads=pads, mode=mode, value=0.5)
        model = make_model([node], {"x": [2, 3, 4]}, ["y"], opset=opset)
    else:
        inputs = ["x", "pads"] + (["value"] if mode == "constant" else [])
        node = helper.make_node("Pad", inputs, ["y"], mode=mode)
        inits = {"pads": np.array(pads, np.int64)}
        if mode == "constant":
            inits["value"] = np.array(0.5, np.float32)
        model = make_model([node], {"x": [2, 3, 4]}, ["y"], opset=opset, initializers=inits)
    assert_matches_ort(model, {"x": rand(2, 3, 4)})


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_variadic_ops_of_n_inputs(op: str, count: int) -> None:
    names = [f"x{k}" for k in range(count)]
    shapes = [[3, 4], [4], [1, 4], [3, 1]][:count]
    node = helper.make_node(op, names, ["y"])
    model = make_model([node], dict(zip(names, shapes, strict=True)), ["y"], opset=13)
    assert_matches_ort(model, {n: rand(*s) for n, s in zip(names, shapes, strict=True)})


def test_dropout_and_identity_are_dropped() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Dropout", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3]}, ["y"], opset=12)
    assert_matches_ort(model, {"x": rand(2, 3)})
    assert op_names(convert(model)) == ["RELU"]


def test_constant_chains_fold_when_static() -> None:
    # Flatten the way exporters do: Shape -> Gather -> Unsqueeze -> Concat -> Reshape.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node(
            "Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))
        ),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Constant", [], ["minus1"], value_ints=[-1]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["two"],
            ["ones"],
            value=numpy_helper.from_array(np.array([1.0], np.float32)),
        ),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Mul", ["flat", "ones"], ["y"]),
    ]
    model = make_model(
        nodes,
        {"x": [2, 3, 4]},
        ["y"],
        opset=13,
        initializers={"axes": np.array([0], np.int64), "two": np.array([2, 12], np.int64)},
        output_shapes={"y": [2, 12]},
    )
    assert_matches_ort(model, {"x": rand(2, 3, 4)})
    assert op_names(convert(model, optimize=False)) == ["RESHAPE", "MUL"]


def test_dynamic_batch_stays_dynamic_and_input_shape_fixes_it() -> None:
    nodes = [
        helper.make_node("Gemm", ["x", "W", "b"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    model = make_model(nodes, {"x": ["N", 4]}, ["y"], initializers={"W": rand(3, 4), "b": rand(3)})
    ir = convert(model)
    assert ir.tensors[ir.graphs[0].inputs[0]].shape == (-1, 4)
    assert ir.tensors[ir.graphs[0].outputs[0]].shape == (-1, 3)
    for batch in (1, 5):
        assert_matches_ort(model, {"x": rand(batch, 4)})
    fixed = convert(model, input_shapes={"x": (7, 4)})
    assert fixed.tensors[fixed.graphs[0].inputs[0]].shape == (7, 4)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_conv_auto_pad(auto_pad: str, strides: list[int]) -> None:
    attrs = {"auto_pad": auto_pad, "strides": strides, "kernel_shape": [3, 2]}
    if auto_pad == "NOTSET":
        attrs["pads"] = [1, 0, 2, 1]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    model = make_model(
        [node], {"x": [1, 2, 7, 6]}, ["y"], initializers={"w": rand(4, 2, 3, 2), "b": rand(4)}
    )
    assert_matches_ort(model, {"x": rand(1, 2, 7, 6)}, rtol=1e-4, atol=1e-5)


def test_conv1d_runs_as_2d() -> None:
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], pads=[1, 2], strides=[2], dilations=[2], group=2
    )
    model = make_model([node], {"x": [2, 4, 11]}, ["y"], initializers={"w": rand(6, 2, 3)})
    assert_matches_ort(model, {"x": rand(2, 4, 11)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "VALID"])
def test_pools_ceil_mode_count_include_pad(
    ceil_mode: int, count_include_pad: int, auto_pad: str
) -> None:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs.update(pads=[1, 1, 1, 1], ceil_mode=ceil_mode)
    nodes = [
        helper.make_node(
            "AveragePool", ["x"], ["avg"], count_include_pad=count_include_pad, **attrs
        ),
        helper.make_node("MaxPool", ["x"], ["max"], **attrs),
    ]
    model = make_model(nodes, {"x": [1, 2, 8, 7]}, ["avg", "max"], opset=12)
    assert_matches_ort(model, {"x": rand(1, 2, 8, 7)})


def test_opset_7_model_converts() -> None:
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])]
    model = make_model(nodes, {"x": [2, 3]}, ["y"], opset=7, initializers={"b": rand(3)})
    assert_matches_ort(model, {"x": rand(2, 3)})


@pytest.mark.parametrize(
    ("mode", "coord", "nearest"),
    [
        ("nearest", "asymmetric", "floor"),
        ("nearest", "half_pixel", "round_prefer_floor"),
        ("nearest", "align_corners", "round_prefer_ceil"),
        ("linear", "half_pixel", None),
        ("linear", "align_corners", None),
        ("linear", "pytorch_half_pixel", None),
    ],
)
@pytest.mark.parametrize("by", ["scales", "sizes"])
def test_resize_modes_with_static_scales_or_sizes(
    mode: str, coord: str, nearest: str | None, by: str
) -> None:
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    if nearest:
        attrs["nearest_mode"] = nearest
    inits = {"roi": np.array([], np.float32)}
    if by == "scales":
        inits["scales"] = np.array([1, 1, 2.0, 0.6], np.float32)
        inputs = ["x", "roi", "scales"]
    else:
        inits["sizes"] = np.array([1, 2, 9, 4], np.int64)
        inputs = ["x", "roi", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    model = make_model([node], {"x": [1, 2, 5, 7]}, ["y"], opset=13, initializers=inits)
    assert_matches_ort(model, {"x": rand(1, 2, 5, 7)})


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_nearest(opset: int) -> None:
    if opset < 9:
        node = helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 3.0])
        model = make_model([node], {"x": [1, 2, 3, 4]}, ["y"], opset=opset)
    else:
        node = helper.make_node("Upsample", ["x", "s"], ["y"])
        model = make_model(
            [node],
            {"x": [1, 2, 3, 4]},
            ["y"],
            opset=opset,
            initializers={"s": np.array([1, 1, 2, 3], np.float32)},
        )
    assert_matches_ort(model, {"x": rand(1, 2, 3, 4)})


@pytest.mark.parametrize(
    "op",
    [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSumExp",
    ],
)
@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_axes_as_attribute_or_input(op: str, opset: int, keepdims: int) -> None:
    axes = [1, -1]
    input_from = 13 if op == "ReduceSum" else 18
    if opset >= input_from:
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        model = make_model(
            [node],
            {"x": [2, 3, 4]},
            ["y"],
            opset=opset,
            initializers={"axes": np.array(axes, np.int64)},
        )
    else:
        node = helper.make_node(op, ["x"], ["y"], keepdims=keepdims, axes=axes)
        model = make_model([node], {"x": [2, 3, 4]}, ["y"], opset=opset)
    assert_matches_ort(model, {"x": rand(2, 3, 4)}, rtol=1e-5, atol=1e-5)


def test_layer_norm_with_mean_and_inv_std_outputs() -> None:
    node = helper.make_node(
        "LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv_std"], axis=-2, epsilon=1e-3
    )
    model = make_model(
        [node],
        {"x": [2, 3, 4]},
        ["y", "mean", "inv_std"],
        opset=17,
        initializers={"g": rand(3, 4), "b": rand(3, 4)},
    )
    assert_matches_ort(model, {"x": rand(2, 3, 4)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod_signs_follow_onnx(fmod: int, dtype: type) -> None:
    a = np.array([-7, -3, 0, 3, 7, 5, -5], dtype)
    b = np.array([2, -2, 3, -3, 3, -2, 2], dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    model = make_model(
        [node], {"a": [7], "b": [7]}, ["y"], opset=13, input_dtypes={"a": elem, "b": elem}
    )
    if np.dtype(dtype).kind == "f" and not fmod:
        # onnxruntime refuses fmod=0 for floats; NumPy's % is the reference (Python semantics).
        np.testing.assert_array_equal(run_spore(model, {"a": a, "b": b})[0], np.mod(a, b))
        return
    assert_matches_ort(model, {"a": a, "b": b})


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"strides": [2, 2]},
        {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2]},
        {"strides": [2, 2], "dilations": [2, 1], "group": 2},
        {"strides": [3, 2], "output_shape": [10, 8]},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose_matches_onnxruntime(attrs: dict, bias: bool) -> None:
    group = attrs.get("group", 1)
    inits = {"w": rand(4, 6 // group, 3, 3)}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rand(6)
        inputs.append("b")
    node = helper.make_node("ConvTranspose", inputs, ["y"], **attrs)
    model = make_model([node], {"x": [2, 4, 3, 3]}, ["y"], initializers=inits, opset=13)
    assert_matches_ort(model, {"x": rand(2, 4, 3, 3)}, rtol=1e-4, atol=1e-5)


def test_conv_transpose_1d() -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2], pads=[1, 0])
    model = make_model([node], {"x": [1, 3, 5]}, ["y"], initializers={"w": rand(3, 2, 4)})
    assert_matches_ort(model, {"x": rand(1, 3, 5)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_as_triangular_matmul(axis: int, exclusive: int, reverse: int) -> None:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model(
        [node], {"x": [3, 4, 5]}, ["y"], opset=14, initializers={"axis": np.array(axis, np.int64)}
    )
    assert_matches_ort(model, {"x": rand(3, 4, 5)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 1])
def test_trilu_with_static_k(upper: int, k: int) -> None:
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
    model = make_model(
        [node], {"x": [2, 4, 5]}, ["y"], opset=14, initializers={"k": np.array(k, np.int64)}
    )
    assert_matches_ort(model, {"x": rand(2, 4, 5)})


@pytest.mark.parametrize(
    "op",
    ["Sign", "IsNaN", "IsInf", "Shrink", "Softsign", "Mish", "Celu", "ThresholdedRelu", "Selu"],
)
def test_composite_unary_ops(op: str) -> None:
    x = rand(3, 4) * 3
    x[0, :3] = [np.nan, np.inf, -np.inf] if op in ("IsNaN", "IsInf", "Sign") else x[0, :3]
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": [3, 4]}, ["y"], opset=18)
    assert_matches_ort(model, {"x": x})


def test_exporter_flatten_keeps_a_dynamic_batch() -> None:
    # torch.flatten(x, 1) exported with a dynamic batch: the target shape is computed from
    # Shape(x) at run time; the converter turns it into Reshape [0, -1].
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W", "b"], ["y"], transB=1),
    ]
    model = make_model(
        nodes,
        {"x": ["N", 3, 4]},
        ["y"],
        opset=13,
        initializers={
            "zero": np.array(0, np.int64),
            "axes": np.array([0], np.int64),
            "minus1": np.array([-1], np.int64),
            "W": rand(5, 12),
            "b": rand(5),
        },
        output_shapes={"y": ["N", 5]},
    )
    for batch in (1, 3):
        assert_matches_ort(model, {"x": rand(batch, 3, 4)})
    ir = convert(model)
    assert op_names(ir) == ["RESHAPE", "FULLY_CONNECTED"]
    assert ir.graphs[0].nodes[0].attrs["shape"] == [0, -1]


def test_attention_imports_through_its_function_body() -> None:
    q, k, v = rand(2, 3, 4, 8), rand(2, 3, 6, 8), rand(2, 3, 6, 5)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1)
    model = make_model(
        [node], {"Q": [2, 3, 4, 8], "K": [2, 3, 6, 8], "V": [2, 3, 6, 5]}, ["Y"], opset=23
    )
    assert_matches_ort(model, {"Q": q, "K": k, "V": v}, rtol=1e-5, atol=1e-6)
    ops = op_names(convert(model))
    assert "SOFTMAX" in ops and "MATMUL" in ops


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pools(p: int) -> None:
    nodes = [
        helper.make_node(
            "LpPool", ["x"], ["a"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=p
        ),
        helper.make_node("GlobalLpPool", ["x"], ["b"], p=p),
    ]
    model = make_model(nodes, {"x": [2, 3, 7, 6]}, ["a", "b"], opset=18)
    assert_matches_ort(model, {"x": rand(2, 3, 7, 6)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_layers(kind: str, direction: str, layout: int) -> None:
    seq, batch, size, hidden = 4, 2, 3, 5
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    dirs = 2 if direction == "bidirectional" else 1
    inits = {
        "W": rand(dirs, gates * hidden, size) * 0.5,
        "R": rand(dirs, gates * hidden, hidden) * 0.5,
        "B": rand(dirs, 2 * gates * hidden) * 0.5,
    }
    # sequence_lens is left out: onnxruntime's path for it applies LSTM's clip slightly
    # differently from its own path without it (ours matches the latter).
    inputs = ["X", "W", "R", "B", "", "h0"]
    x, h0 = rand(seq, batch, size), rand(dirs, batch, hidden)
    attrs = {"hidden_size": hidden, "direction": direction}
    outputs = ["Y", "Y_h"]
    states = {"h0": h0}
    if kind == "LSTM":
        inputs += ["c0", "P"]
        inits["P"] = rand(dirs, 3 * hidden) * 0.5
        states["c0"] = rand(dirs, batch, hidden)
        outputs.append("Y_c")
        attrs["clip"] = 2.0
    if kind == "GRU":
        attrs["linear_before_reset"] = 1

    def build(layout: int) -> object:
        shapes = {
            "X": [batch, seq, size] if layout else [seq, batch, size],
            **{k: [batch, dirs, hidden] if layout else [dirs, batch, hidden] for k in states},
        }
        node = helper.make_node(kind, inputs, outputs, layout=layout, **attrs)
        return make_model([node], shapes, outputs, initializers=inits, opset=14)

    want = run_ort(build(0), {"X": x, **states})
    if layout:
        # onnxruntime has no batch-major (layout=1) RNNs: feed transposed data and compare
        # with its sequence-major results, transposed the same way.
        feeds = {"X": x.transpose(1, 0, 2), **{k: v.transpose(1, 0, 2) for k, v in states.items()}}
        want = [want[0].transpose(2, 0, 1, 3), *[w.transpose(1, 0, 2) for w in want[1:]]]
    else:
        feeds = {"X": x, **states}
    for optimize in (True, False):
        got = run_spore(build(layout), feeds, optimize=optimize)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bhid,bhjd->bhij", [[2, 3, 4, 5], [2, 3, 6, 5]]),  # attention scores
        ("ij,jk", [[3, 4], [4, 5]]),  # implicit output
        ("ij,ij->", [[3, 4], [3, 4]]),
        ("abc,cd->dba", [[2, 3, 4], [4, 5]]),
        ("ijk,k->ij", [[2, 3, 4], [4]]),
        ("ijk->kj", [[2, 3, 4]]),
        ("ij,kl->ijkl", [[2, 3], [4, 5]]),  # outer product
        ("...ii->...i", [[3, 4, 4]]),  # batched diagonal
        ("ii", [[4, 4]]),  # trace
        ("...ij,...jk->...ik", [[2, 3, 4, 5], [2, 3, 5, 2]]),  # batched by an ellipsis
        ("bij,bjk", [[2, 3, 4], [2, 4, 3]]),
        ("i...,i...->...", [[3, 2, 4], [3, 2, 4]]),
    ],
)
def test_einsum_patterns(equation: str, shapes: list[list[int]]) -> None:
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    model = make_model([node], dict(zip(names, shapes, strict=True)), ["y"], opset=12)
    assert_matches_ort(
        model, {n: rand(*s) for n, s in zip(names, shapes, strict=True)}, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_with_negative_indices_and_longer_data(axis: int) -> None:
    data = rand(4, 5, 6)
    rng = np.random.default_rng(7)
    shape = [3, 4, 2]
    depth = data.shape[axis]
    indices = rng.integers(-depth, depth, size=shape).astype(np.int64)
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=axis)
    model = make_model(
        [node],
        {"data": list(data.shape), "idx": shape},
        ["y"],
        opset=13,
        input_dtypes={"idx": onnx.TensorProto.INT64},
    )
    assert_matches_ort(model, {"data": data, "idx": indices})


def test_a_weight_shared_by_several_matmuls_is_stored_once() -> None:
    # ALBERT-style models reuse one weight in every layer: each MatMul reads the same
    # transposed copy, so the file holds the weight once, not once per layer.
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("MatMul", ["t", "w"], ["b"]),
        helper.make_node("Tanh", ["b"], ["u"]),
        helper.make_node("MatMul", ["u", "w"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 16]}, ["y"], initializers={"w": w})
    ir = convert(model)
    stored = [t for t in ir.tensors if t.data is not None and t.data.size == w.size]
    assert len(stored) == 1
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(
        run_spore(model, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5
    )
