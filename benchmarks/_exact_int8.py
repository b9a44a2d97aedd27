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

A dynamically quantized graph rounds its activations to uint8 at run time, so a float
rounding one ulp away from onnxruntime's (a sum taken in another order) moves a value
across a rounding boundary by a whole step, and later blocks can amplify that step far
beyond the int8 tolerance (a T5 decoder; an LSTM over many steps, whose own float32 and
float64 runs split so). The stepwise form (`probe_graph`, `stepwise_graph`,
`compare_steps`) is the comparison for such graphs: the engine under test exposes the
results of its quantization steps, and the reference computes each step from the engine's
own previous steps (teacher forcing): every DynamicQuantizeLinear's input from the
engine's earlier quantized values, then quantized exactly here; every covered LSTM's step
t from the engine's hidden state of step t - 1 (its Y) and the reference's own cell
state. Each step must then be within one quantization step of the reference semantics
applied to the same state, and the graph's outputs within the int8 tolerance of the
reference computed from the engine's last quantized values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOUBLE, FLOAT = TensorProto.DOUBLE, TensorProto.FLOAT


def exact_integer_graph(path: str, *, steps: int = DOUBLE) -> bytes:
    """The model at `path` with its integer products computed exactly (module docstring);
    `steps` is the element type an LSTM's scaling and gates compute in (float64, or
    float32 as onnxruntime's: two roundings of the same semantics)."""
    return _rewrite(onnx.load(path), steps, stepwise=False).SerializeToString()


def _constants(model: Any) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _forced_lstm(node: Any, values: dict[str, np.ndarray]) -> bool:
    """Whether the stepwise form covers this LSTM: the rewrite does and the node gives Y
    (its hidden state at every step, which the reference's steps start from)."""
    return _plain_lstm(node, values) and bool(node.output) and bool(node.output[0])


def _rewrite(model: Any, steps: int, *, stepwise: bool) -> Any:
    """The exact integer graph, or its stepwise form (module docstring), in place."""
    values = _constants(model)
    nodes: list[Any] = []
    fed: list[tuple[str, int]] = []  # the engine's values the stepwise form reads
    checked: list[str] = []  # what the stepwise form adds as outputs
    for k, node in enumerate(model.graph.node):
        if node.op_type == "MatMulInteger" and node.domain in ("", "ai.onnx"):
            nodes += _matmul_integer(node, f"exact{k}")
        elif stepwise and node.op_type == "DynamicQuantizeLinear":
            # The engine's values replace the step; its input is compared outside.
            fed += zip(node.output, (TensorProto.UINT8, FLOAT, TensorProto.UINT8), strict=False)
            checked.append(node.input[0])
        elif stepwise and node.op_type == "DynamicQuantizeLSTM" and _forced_lstm(node, values):
            fed += [(o, FLOAT) for o in node.output if o]
            forced = [f"{o}{STEPWISE}" if o else "" for o in node.output]
            forced_node = helper.make_node(
                node.op_type, list(node.input), forced, domain=node.domain
            )
            forced_node.attribute.extend(node.attribute)
            nodes += _lstm(forced_node, values, f"exact{k}", steps, forced_h=node.output[0])
            checked += [o for o in forced if o]
        elif node.op_type == "DynamicQuantizeLSTM" and _plain_lstm(node, values):
            nodes += _lstm(node, values, f"exact{k}", steps)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    inputs = {i.name for i in model.graph.input}
    model.graph.input.extend(
        helper.make_tensor_value_info(name, kind, None) for name, kind in fed if name
    )
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(
        helper.make_empty_tensor_value_info(name)
        for name in dict.fromkeys(checked)
        if name not in outputs and name not in inputs
    )
    return model


STEPWISE = "/stepwise"
"""The suffix of an LSTM output the stepwise reference computes from the engine's steps."""


def probed_names(path: str) -> list[str]:
    """The values `probe_graph` exposes: every top-level DynamicQuantizeLinear's outputs
    and every covered DynamicQuantizeLSTM's (module docstring)."""
    model = onnx.load(path, load_external_data=False)
    values = _constants(model)
    names: list[str] = []
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear" or (
            node.op_type == "DynamicQuantizeLSTM" and _forced_lstm(node, values)
        ):
            names += [o for o in node.output if o]
    return names


def probe_graph(path: str) -> bytes:
    """The model at `path` unchanged but for `probed_names` added as graph outputs, for
    the engine under test to convert and run."""
    model = onnx.load(path)
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(
        helper.make_empty_tensor_value_info(n) for n in probed_names(path) if n not in outputs
    )
    return model.SerializeToString()


def stepwise_graph(path: str) -> bytes:
    """The exact integer graph in its stepwise form (module docstring): fed the model's
    inputs and the engine's `probed_names` values, it outputs the graph's outputs, every
    DynamicQuantizeLinear's input and every covered LSTM's outputs (suffixed STEPWISE)."""
    return _rewrite(onnx.load(path), DOUBLE, stepwise=True).SerializeToString()


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """ONNX DynamicQuantizeLinear in float32 with ties to even: (y, scale, zero point)."""
    f32 = np.float32
    x = np.asarray(x, f32)
    lo = min(f32(x.min()) if x.size else f32(0), f32(0))
    hi = max(f32(x.max()) if x.size else f32(0), f32(0))
    scale = f32(f32(hi - lo) / f32(255)) if hi != lo else f32(1)
    zp = np.clip(np.rint(f32(f32(0) - f32(lo / scale))), 0, 255)
    y = np.clip(np.rint(x / scale) + zp, 0, 255)
    return y.astype(np.uint8), scale, np.uint8(zp)


def _in_steps(got: np.ndarray, want: np.ndarray) -> float:
    """The largest |got - want| of an LSTM output ([..., batch, hidden]) in quantization
    steps of the reference: each [batch, hidden] slice (one step of one direction, as the
    next step quantizes it) against its own DynamicQuantizeLinear scale."""
    if not want.size:
        return 0.0
    rows = want.reshape(-1, want.shape[-2] * want.shape[-1])
    diff = np.abs(got.reshape(rows.shape) - rows).max(axis=1)
    span = np.maximum(rows.max(axis=1), 0) - np.minimum(rows.min(axis=1), 0)
    scale = np.where(span > 0, span / 255, 1.0)
    return float((diff / scale).max())


def compare_steps(
    path: str, ours: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> tuple[float, float]:
    """The worst step of the engine against the stepwise reference, in quantization steps
    of the reference: (the largest difference of a DynamicQuantizeLinear's dequantized
    values, over its scale; the largest difference of an LSTM output, over the scale of
    each of its steps). `ours` holds the engine's `probed_names` values, `reference` the
    stepwise graph's outputs and the model's inputs (which a step may quantize directly)."""
    model = onnx.load(path, load_external_data=False)
    values = _constants(model)
    worst_q = worst_lstm = 0.0
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            q, scale, zp = dynamic_quantize(reference[node.input[0]])
            want = (q.astype(np.float64) - float(zp)) * float(scale)
            got_q, got_s, got_z = (np.asarray(ours[o], np.float64) for o in node.output[:3])
            got = (got_q - float(got_z)) * float(got_s)
            if want.size:
                worst_q = max(worst_q, float(np.abs(got - want).max()) / float(scale))
        elif node.op_type == "DynamicQuantizeLSTM" and _forced_lstm(node, values):
            for o in node.output:
                if o:
                    want = np.asarray(reference[o + STEPWISE], np.float64)
                    worst_lstm = max(worst_lstm, _in_steps(np.asarray(ours[o], np.float64), want))
    return worst_q, worst_lstm


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


def _forced_states(y: str, q: str, p: str, d: int, rev: int) -> list[Any]:
    """Direction d's hidden state before each step, from the engine's Y ([T, dirs, B, H]):
    h0 then Y[:-1] forward, Y[1:] then h0 in reverse, as `{q}_hp` ([T, B, H])."""
    n = helper.make_node
    ends = (np.array([0], np.int64), np.array([-1], np.int64))
    if rev:
        ends = (np.array([1], np.int64), np.array([2**62], np.int64))
    nodes = [
        _const(f"{q}_yd", np.array(d, np.int64)),
        n("Gather", [y, f"{q}_yd"], [f"{q}_ydir"], axis=1),
        _const(f"{q}_ys0", ends[0]),
        _const(f"{q}_ys1", ends[1]),
        n("Slice", [f"{q}_ydir", f"{q}_ys0", f"{q}_ys1", f"{p}_axis0"], [f"{q}_yprev"]),
        n("Unsqueeze", [f"{q}_h0", f"{p}_axis0"], [f"{q}_h0u"]),
    ]
    parts = [f"{q}_yprev", f"{q}_h0u"] if rev else [f"{q}_h0u", f"{q}_yprev"]
    return [*nodes, n("Concat", parts, [f"{q}_hp"], axis=0)]


def _forced_scan(q: str, p: str, rev: int, body: Any) -> list[Any]:
    """The Scan of a direction whose steps start from the engine's states (`{q}_hp`),
    its last hidden state `{q}_hTu` ([1, B, H]) taken from its outputs."""
    last = (np.array([0], np.int64), np.array([1], np.int64))
    if not rev:
        last = (np.array([-1], np.int64), np.array([2**62], np.int64))
    return [
        helper.make_node(
            "Scan",
            [f"{q}_c0", f"{q}_xp", f"{q}_hp"],
            [f"{q}_cT", f"{q}_ys"],
            num_scan_inputs=2,
            body=body,
            scan_input_directions=[rev, rev],
            scan_output_directions=[rev],
        ),
        _const(f"{q}_l0", last[0]),
        _const(f"{q}_l1", last[1]),
        helper.make_node("Slice", [f"{q}_ys", f"{q}_l0", f"{q}_l1", f"{p}_axis0"], [f"{q}_hTu"]),
    ]


def _lstm(
    node: Any, values: dict[str, np.ndarray], p: str, steps: int, forced_h: str = ""
) -> list[Any]:
    """DynamicQuantizeLSTM in standard ops (module docstring); with `forced_h` (the
    engine's Y), each step starts from the engine's previous hidden state instead."""
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
        body = _step_body(q, hidden, r, steps, forced=bool(forced_h))
        if forced_h:
            nodes += _forced_states(forced_h, q, p, d, rev) + _forced_scan(q, p, rev, body)
        else:
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
            nodes.append(helper.make_node("Unsqueeze", [f"{q}_hT", f"{p}_axis0"], [f"{q}_hTu"]))
        hs.append(f"{q}_hTu")
        nodes.append(helper.make_node("Unsqueeze", [f"{q}_ys", f"{p}_axis1"], [f"{q}_ysu"]))
        ys.append(f"{q}_ysu")
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


def _step_body(
    q: str, hidden: int, weights: tuple[np.ndarray, np.ndarray], steps: int, *, forced: bool
) -> Any:
    """The Scan body of one LSTM step: (h, c, x_t) -> (h', c', h'), x_t the step's input
    projection with both biases (of type `steps`), h and c float32; `weights` are R's
    centred integers (float64) and scales. `forced`: (c, x_t, h_t) -> (c', h'), h a scan
    input (the engine's previous hidden state) instead of a state."""
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
    if forced:
        return helper.make_graph(
            nodes,
            f"{q}_step",
            [info("c", FLOAT, None), info("x", steps, None), info("h", FLOAT, None)],
            # Scan needs its outputs' ranks where the states' shapes are not inferred.
            [info("c2", FLOAT, ["batch", "hidden"]), info("y", FLOAT, ["batch", "hidden"])],
        )
    return helper.make_graph(
        nodes,
        f"{q}_step",
        [info("h", FLOAT, None), info("c", FLOAT, None), info("x", steps, None)],
        [info("h2", FLOAT, None), info("c2", FLOAT, None), info("y", FLOAT, None)],
    )
