"""ONNX LSTM / GRU / RNN import onto the sequence kernels, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from tests.unit.converter.helpers import (
    assert_matches_ort,
    convert,
    helper,
    make_model,
    op_names,
    run_ort,
    run_spore,
)

HID, IN = 4, 3
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ["y", "y_h", "y_c"], "GRU": ["y", "y_h"], "RNN": ["y", "y_h"]}


def rnn_model(
    kind: str,
    *,
    direction: str = "forward",
    layout: int = 0,
    x_shape=("seq", "batch", IN),
    lens: bool = False,
    states: bool = False,
    peepholes: bool = False,
    **attrs,
):
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    g = GATES[kind]
    inits = {
        "W": rng.normal(size=(dirs, g * HID, IN)).astype(np.float32) * 0.6,
        "R": rng.normal(size=(dirs, g * HID, HID)).astype(np.float32) * 0.6,
        "B": rng.normal(size=(dirs, 2 * g * HID)).astype(np.float32) * 0.6,
    }
    names = ["x", "W", "R", "B", "lens" if lens else "", "h0" if states else ""]
    inputs = {"x": list(x_shape)}
    dtypes = {}
    batch = x_shape[0 if layout else 1]
    if lens:
        inputs["lens"] = [batch]
        dtypes["lens"] = helper.TensorProto.INT32
    state = [batch, dirs, HID] if layout else [dirs, batch, HID]
    if states:
        inputs["h0"] = state
    if kind == "LSTM":
        names += ["c0" if states else "", "P" if peepholes else ""]
        if states:
            inputs["c0"] = state
        if peepholes:
            inits["P"] = rng.normal(size=(dirs, 3 * HID)).astype(np.float32)
    while not names[-1]:
        names.pop()
    node = helper.make_node(
        kind, names, OUTPUTS[kind], hidden_size=HID, direction=direction, layout=layout, **attrs
    )
    return make_model(
        [node], inputs, OUTPUTS[kind], initializers=inits, input_dtypes=dtypes, opset=14
    )


def feeds(model, seq: int, batch: int, *, layout: int = 0, lens=None):
    rng = np.random.default_rng(seq * 10 + batch)
    out = {"x": rng.normal(size=(batch, seq, IN) if layout else (seq, batch, IN))}
    names = {i.name: i for i in model.graph.input}
    if "lens" in names:
        out["lens"] = np.asarray(lens, np.int32)
    for s in ("h0", "c0"):
        if s in names:
            dims = [d.dim_value or batch for d in names[s].type.tensor_type.shape.dim]
            out[s] = rng.normal(size=dims)
    return {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in out.items()}


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_one_node_matching_onnxruntime_at_every_length(kind, direction):
    # The initial states share X's dynamic batch: run() resizes all inputs, then re-plans.
    model = rnn_model(kind, direction=direction, states=True)
    assert op_names(convert(model)) == [kind]
    interpreter = Interpreter(model_content=convert_onnx(model))
    for seq, batch in ((1, 1), (6, 2), (13, 3)):  # one conversion, any length and batch
        f = feeds(model, seq, batch)
        got = interpreter.run(f)
        for name, want in zip(OUTPUTS[kind], run_ort(model, f), strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("LSTM", {"peepholes": True, "clip": 0.5}),
        ("LSTM", {"layout": 1, "states": True, "direction": "bidirectional"}),
        ("LSTM", {"input_forget": 1}),
        (
            "LSTM",
            {
                "activations": ["HardSigmoid", "LeakyRelu", "Softsign"],
                "activation_alpha": [0.3, 0.05],
                "activation_beta": [0.4],
            },
        ),
        ("GRU", {"linear_before_reset": 1, "clip": 0.6}),
        ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}),  # inference path
        ("LSTM", {"direction": "reverse"}),  # inference path, zero initial states
        ("GRU", {"layout": 1, "direction": "reverse"}),
        (
            "GRU",
            {
                "activations": ["Sigmoid", "ScaledTanh"],
                "activation_alpha": [1.5],
                "activation_beta": [0.7],
            },
        ),
        (
            "RNN",
            {
                "activations": ["Relu", "Affine"],
                "direction": "bidirectional",
                "activation_alpha": [0.5],
                "activation_beta": [0.1],
            },
        ),
    ],
)
def test_attributes_match_onnxruntime(kind, options):
    model = rnn_model(kind, x_shape=(5, 2, IN), **{**options, "layout": 0})
    f = feeds(model, 5, 2)
    want = assert_matches_ort(model, f, rtol=1e-5, atol=1e-6)
    if options.get("layout"):
        # onnxruntime refuses layout 1: the batch-first model must give the time-major
        # model's results, transposed.
        batch_first = rnn_model(kind, x_shape=(2, 5, IN), **options)
        got = run_spore(batch_first, {k: v.swapaxes(0, 1) for k, v in f.items()})
        np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
        for g, w in zip(got[1:], want[1:], strict=True):
            np.testing.assert_allclose(g, w.swapaxes(0, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lengths_given_at_run_time(kind, direction):
    model = rnn_model(kind, direction=direction, lens=True, states=True, x_shape=(6, 3, IN))
    for lens in ([6, 2, 4], [1, 6, 0]):
        assert_matches_ort(model, feeds(model, 6, 3, lens=lens), rtol=1e-5, atol=1e-6)


def test_unknown_activation_is_refused_by_name():
    from sporenet.converter.errors import ConversionError

    model = rnn_model("RNN", activations=["Gelu"])
    with pytest.raises(ConversionError, match=r"activations \['Gelu'\] are not supported"):
        convert(model)


@pytest.mark.parametrize(
    ("kind", "options", "fast"),
    [
        ("LSTM", {"direction": "bidirectional", "states": True}, True),
        ("GRU", {"linear_before_reset": 1}, True),
        ("LSTM", {"peepholes": True}, False),
        ("GRU", {"clip": 0.6}, False),
        ("RNN", {}, False),
    ],
)
def test_common_inference_cases_take_the_packed_path(kind, options, fast):
    # Constant weights and default activations run recurrent_fast's packed loop (checked
    # against onnxruntime above); everything else runs the general loop.
    model = rnn_model(kind, x_shape=(5, 2, IN), **options)
    interpreter = Interpreter(model_content=convert_onnx(model))
    (kernel,) = [k for k in interpreter._plan.kernels if k.op.name == kind]
    assert kernel.fast is fast


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_directions_one_after_another_when_only_one_fits_in_cache(monkeypatch, kind):
    # A bidirectional LSTM or GRU whose R^T per direction fits in the L2 cache and both do not
    # runs its directions one after the other (recurrent_fast.direction_groups); the
    # results are those of the batched loop, which the onnxruntime tests above check.
    from sporenet.lite import cpu_cache
    from sporenet.lite.kernels import recurrent_fast

    r_bytes = HID * GATES[kind] * HID * 4
    assert recurrent_fast.direction_groups(2, r_bytes, 2 * r_bytes) == [
        slice(0, 1),
        slice(1, 2),
    ]
    assert recurrent_fast.direction_groups(2, r_bytes, 64 * r_bytes) == [slice(0, 2)]
    assert recurrent_fast.direction_groups(2, r_bytes, r_bytes) == [slice(0, 2)]
    assert recurrent_fast.direction_groups(1, r_bytes, 2 * r_bytes) == [slice(0, 1)]
    model = rnn_model(kind, direction="bidirectional", states=True)
    f = feeds(model, 7, 2)
    batched = Interpreter(model_content=convert_onnx(model)).run(f)
    monkeypatch.setattr(cpu_cache, "l2_bytes", lambda: 2 * r_bytes)
    grouped = Interpreter(model_content=convert_onnx(model)).run(f)
    for name in OUTPUTS[kind]:  # the same operations, up to BLAS's summation order
        np.testing.assert_allclose(grouped[name], batched[name], rtol=1e-6, atol=1e-7)
    for name, want in zip(OUTPUTS[kind], run_ort(model, f), strict=True):
        np.testing.assert_allclose(grouped[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("LSTM", {})],
    ids=["gru", "gru-before-reset", "lstm"],
)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gate_major_steps_match_the_stacked_steps(monkeypatch, kind, attrs, direction):
    # A step whose product is small runs its gates as contiguous blocks
    # (recurrent_fast.gate_major); larger ones keep the stacked steps. Both must equal
    # onnxruntime, with recurrent biases and initial states, at one and several batch rows.
    from sporenet.lite.kernels import recurrent_fast

    assert recurrent_fast.gate_major(2, HID, GATES[kind] * HID)  # a small product
    assert recurrent_fast.gate_major(8, 224, 896)  # one gate's product runs unpacked
    for batch in (1, 2, 32):  # a matrix-vector product, row products, one packed GEMM
        assert not recurrent_fast.gate_major(batch, 256, 1024)
    model = rnn_model(kind, direction=direction, states=True, **attrs)
    content = convert_onnx(model)
    for seq, batch in ((1, 1), (5, 2), (4, 3)):
        f = feeds(model, seq, batch)
        gate_major = Interpreter(model_content=content).run(f)
        with monkeypatch.context() as patched:
            patched.setattr(recurrent_fast, "gate_major", lambda *_: False)
            stacked = Interpreter(model_content=content).run(f)
        for name, want in zip(OUTPUTS[kind], run_ort(model, f), strict=True):
            for got in (gate_major, stacked):
                np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
