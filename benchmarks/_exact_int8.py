"""A dynamically quantized ONNX model rewritten so onnxruntime computes its integer
products exactly, on every CPU: the reference semantics real_models.py measures int8
models against.

onnxruntime's u8s8 kernels (uint8 activations, int8 weights) sum pairs of byte products
in saturating 16-bit lanes on CPUs without AVX-512 VNNI, so its own MatMulInteger and
DynamicQuantizeLSTM are not a reference there. The rewrite keeps every other node as it
is and replaces

- each MatMulInteger by a float64 MatMul of its zero-point-shifted operands (the int32
  sums exactly), cast to int32;
- each com.microsoft DynamicQuantizeLSTM by its definition in standard ops: X quantized
  once by DynamicQuantizeLinear, its projection an exact float64 product of the integers
  scaled by float32(x scale * W scale), then per direction a Scan over time whose body
  quantizes the previous hidden state, multiplies it exactly with R's integers, and
  applies ONNX's LSTM gates (i, o, f, c; sigmoid, tanh, tanh) in float64, keeping the
  states float32 as onnxruntime does. Nodes with sequence_lens, peepholes, clip,
  input_forget or other activations are kept as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOUBLE, FLOAT = TensorProto.DOUBLE, TensorProto.FLOAT


def exact_integer_graph(path: str, *, steps: int = DOUBLE) -> bytes:
    """The model at `path` with its integer products computed exactly (module docstring);
    `steps` is the element type an LSTM's scaling and gates compute in (float64, or
    float32 as onnxruntime's: two roundings of the same semantics)."""
    model = onnx.load(path)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    nodes: list[Any] = []
    for k, node in enumerate(model.graph.node):
        if node.op_type == "MatMulInteger" and node.domain in ("", "ai.onnx"):
            nodes += _matmul_integer(node, f"exact{k}")
        elif node.op_type == "DynamicQuantizeLSTM" and _plain_lstm(node, values):
            nodes += _lstm(node, values, f"exact{k}", steps)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model.SerializeToString()


def _matmul_integer(node: Any, p: str) -> list[Any]:
    a, b, a_zero, b_zero = [*node.input, "", ""][:4]
    nodes, operands = [], []
    for side, (x, zero) in enumerate(((a, a_zero), (b, b_zero))):
        name = f"{p}_{side}"
        nodes.append(helper.make_node("Cast", [x], [name], to=DOUBLE))
        if zero:
            nodes.append(helper.make_node("Cast", [zero], [name + "z"], to=DOUBLE))
            nodes.append(helper.make_node("Sub", [name, name + "z"], [name + "s"]))
            name += "s"
        operands.append(name)
    nodes.append(helper.make_node("MatMul", operands, [f"{p}_m"]))
    nodes.append(helper.make_node("Cast", [f"{p}_m"], [node.output[0]], to=TensorProto.INT32))
    return nodes


def _attrs(node: Any) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plain_lstm(node: Any, values: dict[str, np.ndarray]) -> bool:
    """Whether the rewrite covers this node (see the module docstring)."""
    ins = [*node.input, *[""] * 12][:12]
    attrs = _attrs(node)
    if ins[4] or ins[7] or "clip" in attrs or attrs.get("input_forget", 0):
        return False
    if attrs.get("activations") or attrs.get("layout", 0):
        return False
    return all(ins[k] in values for k in (1, 2, 8, 10)) and all(
        not ins[k] or ins[k] in values for k in (3, 9, 11)
    )


def _const(name: str, value: np.ndarray) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _centred(values: dict[str, np.ndarray], q: str, zp: str, d: int) -> np.ndarray:
    """Direction d's weights ([rows, 4H]) less their zero points, as float64 integers."""
    w = values[q][d].astype(np.float64)
    if not zp:
        return w
    z = values[zp].reshape(values[zp].shape[0], -1)[d].astype(np.float64)
    return w - z.reshape(1, -1)


def _scales(values: dict[str, np.ndarray], s: str, d: int) -> np.ndarray:
    return values[s].reshape(values[s].shape[0], -1)[d].astype(np.float32)


def _lstm(node: Any, values: dict[str, np.ndarray], p: str, steps: int) -> list[Any]:
    as_np = helper.tensor_dtype_to_np_dtype(steps)
    ins = [*node.input, *[""] * 12][:12]
    outs = [*node.output, "", ""][:3]
    attrs = _attrs(node)
    hidden = int(attrs["hidden_size"])
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    reverse = {"forward": [0], "reverse": [1], "bidirectional": [0, 1]}[direction]
    x = ins[0]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", [x], [f"{p}_xq", f"{p}_xs", f"{p}_xz"]),
        helper.make_node("Cast", [f"{p}_xq"], [f"{p}_xqd"], to=DOUBLE),
        helper.make_node("Cast", [f"{p}_xz"], [f"{p}_xzd"], to=DOUBLE),
        helper.make_node("Sub", [f"{p}_xqd", f"{p}_xzd"], [f"{p}_xc"]),
        helper.make_node("Shape", [x], [f"{p}_fullshape"]),
        _const(f"{p}_one", np.array([1], np.int64)),
        _const(f"{p}_two", np.array([2], np.int64)),
        helper.make_node("Slice", [f"{p}_fullshape", f"{p}_one", f"{p}_two"], [f"{p}_shape"]),
        _const(f"{p}_hidden", np.array([hidden], np.int64)),
        helper.make_node("Concat", [f"{p}_shape", f"{p}_hidden"], [f"{p}_state"], axis=0),
        helper.make_node("ConstantOfShape", [f"{p}_state"], [f"{p}_zeros"]),
    ]
    ys, hs, cs = [], [], []
    for d, rev in enumerate(reverse):
        q = f"{p}_d{d}"
        bias = np.zeros(4 * hidden, np.float32)
        if ins[3]:
            b = values[ins[3]][d].astype(np.float32)
            bias = b[: 4 * hidden] + b[4 * hidden :]
        nodes += [
            _const(f"{q}_w", _centred(values, ins[1], ins[9], d)),
            _const(f"{q}_ws", _scales(values, ins[8], d)),
            _const(f"{q}_b", bias.astype(as_np)),
            helper.make_node("MatMul", [f"{p}_xc", f"{q}_w"], [f"{q}_acc64"]),
            helper.make_node("Cast", [f"{q}_acc64"], [f"{q}_acc"], to=steps),
            helper.make_node("Mul", [f"{p}_xs", f"{q}_ws"], [f"{q}_m32"]),
            helper.make_node("Cast", [f"{q}_m32"], [f"{q}_m"], to=steps),
            helper.make_node("Mul", [f"{q}_acc", f"{q}_m"], [f"{q}_xp0"]),
            helper.make_node("Add", [f"{q}_xp0", f"{q}_b"], [f"{q}_xp"]),
        ]
        for given, name in ((ins[5], "h0"), (ins[6], "c0")):
            if given:
                nodes += [
                    _const(f"{q}_{name}i", np.array([d], np.int64)),
                    helper.make_node("Gather", [given, f"{q}_{name}i"], [f"{q}_{name}g"]),
                    helper.make_node("Squeeze", [f"{q}_{name}g", f"{p}_axis0"], [f"{q}_{name}"]),
                ]
            else:
                nodes.append(helper.make_node("Identity", [f"{p}_zeros"], [f"{q}_{name}"]))
        r = (_centred(values, ins[2], ins[11], d), _scales(values, ins[10], d))
        body = _step_body(q, hidden, r, steps)
        nodes.append(
            helper.make_node(
                "Scan",
                [f"{q}_h0", f"{q}_c0", f"{q}_xp"],
                [f"{q}_hT", f"{q}_cT", f"{q}_ys"],
                num_scan_inputs=1,
                body=body,
                scan_input_directions=[rev],
                scan_output_directions=[rev],
            )
        )
        for src, dst, axis in (("ys", ys, f"{p}_axis1"), ("hT", hs, f"{p}_axis0")):
            nodes.append(helper.make_node("Unsqueeze", [f"{q}_{src}", axis], [f"{q}_{src}u"]))
            dst.append(f"{q}_{src}u")
        nodes.append(helper.make_node("Unsqueeze", [f"{q}_cT", f"{p}_axis0"], [f"{q}_cTu"]))
        cs.append(f"{q}_cTu")
    nodes[:0] = [
        _const(f"{p}_axis0", np.array([0], np.int64)),
        _const(f"{p}_axis1", np.array([1], np.int64)),
    ]
    for parts, out, axis in ((ys, outs[0], 1), (hs, outs[1], 0), (cs, outs[2], 0)):
        if out:
            nodes.append(helper.make_node("Concat", parts, [out], axis=axis))
    return nodes


def _step_body(q: str, hidden: int, weights: tuple[np.ndarray, np.ndarray], steps: int) -> Any:
    """The Scan body of one LSTM step: (h, c, x_t) -> (h', c', h'), x_t the step's input
    projection with both biases (of type `steps`), h and c float32; `weights` are R's
    centred integers (float64) and scales."""
    r, r_scale = weights
    n = helper.make_node
    sl = {}
    for g in range(4):
        sl[g] = [np.array([g * hidden], np.int64), np.array([(g + 1) * hidden], np.int64)]
    nodes = [
        _const("r", r),
        _const("rs", r_scale),
        _const("axis", np.array([1], np.int64)),
        n("DynamicQuantizeLinear", ["h"], ["hq", "hs", "hz"]),
        n("Cast", ["hq"], ["hqd"], to=DOUBLE),
        n("Cast", ["hz"], ["hzd"], to=DOUBLE),
        n("Sub", ["hqd", "hzd"], ["hc"]),
        n("MatMul", ["hc", "r"], ["acc64"]),
        n("Cast", ["acc64"], ["acc"], to=steps),
        n("Mul", ["hs", "rs"], ["m32"]),
        n("Cast", ["m32"], ["m"], to=steps),
        n("Mul", ["acc", "m"], ["hr"]),
        n("Add", ["hr", "x"], ["a"]),
    ]
    for g, (name, act) in enumerate(
        (("i", "Sigmoid"), ("o", "Sigmoid"), ("f", "Sigmoid"), ("g", "Tanh"))
    ):
        nodes += [
            _const(f"s{g}", sl[g][0]),
            _const(f"e{g}", sl[g][1]),
            n("Slice", ["a", f"s{g}", f"e{g}", "axis"], [f"a{g}"]),
            n(act, [f"a{g}"], [name]),
        ]
    nodes += [
        n("Cast", ["c"], ["cd"], to=steps),
        n("Mul", ["f", "cd"], ["fc"]),
        n("Mul", ["i", "g"], ["ig"]),
        n("Add", ["fc", "ig"], ["c2d"]),
        n("Tanh", ["c2d"], ["tc"]),
        n("Mul", ["o", "tc"], ["h2d"]),
        n("Cast", ["h2d"], ["h2"], to=FLOAT),
        n("Cast", ["c2d"], ["c2"], to=FLOAT),
        n("Identity", ["h2"], ["y"]),
    ]
    info = helper.make_tensor_value_info
    return helper.make_graph(
        nodes,
        f"{q}_step",
        [info("h", FLOAT, None), info("c", FLOAT, None), info("x", steps, None)],
        [info("h2", FLOAT, None), info("c2", FLOAT, None), info("y", FLOAT, None)],
    )
