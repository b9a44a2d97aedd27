"""LSTM, GRU and RNN gradients (backpropagation through time) vs finite differences and
PyTorch's torch.nn.LSTM / GRU / RNN with the same weights; LSTM_TRAINING (the LSTM of a
training graph, whose saved steps LSTM_GRAD reads) against them and against LSTM bit for
bit."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import GradientCase, check_op, rand

SEQ, BATCH, IN, HID = 4, 2, 3, 5
GATES = {OpCode.LSTM: 4, OpCode.LSTM_TRAINING: 4, OpCode.GRU: 3, OpCode.RNN: 1}
OUTPUTS = {OpCode.LSTM: 3, OpCode.LSTM_TRAINING: 4, OpCode.GRU: 2, OpCode.RNN: 2}
LSTMS = (OpCode.LSTM, OpCode.LSTM_TRAINING)


def params(op: OpCode, dirs: int = 1, *, peepholes: bool = False) -> dict[str, np.ndarray]:
    g = GATES[op]
    p = {
        "w": rand(dirs, g * HID, IN, seed=2, scale=0.5),
        "r": rand(dirs, g * HID, HID, seed=3, scale=0.5),
        "b": rand(dirs, 2 * g * HID, seed=4, scale=0.5),
        "h0": rand(dirs, BATCH, HID, seed=5, scale=0.5),
    }
    if op in LSTMS:
        p["c0"] = rand(dirs, BATCH, HID, seed=6, scale=0.5)
        if peepholes:
            p["p"] = rand(dirs, 3 * HID, seed=7, scale=0.5)
    return p


def build(op: OpCode, output: int, lens: np.ndarray | None = None, **attrs):
    """A graph of one recurrent node whose output `output` the loss reads."""

    def graph(b, x, w, r, b_, h0, c0=None, p=None):
        inputs = [x, w, r, b_, -1, h0]
        if lens is not None:
            inputs[4] = b.constant("lens", lens, np.int32)
        if op in LSTMS:
            inputs += [c0, -1 if p is None else p]
        return b.op_multi(op, inputs, OUTPUTS[op], hidden_size=HID, **attrs)[output]

    return graph


def renamed(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {("b_" if k == "b" else k): v for k, v in p.items()}


@pytest.mark.parametrize("op", [*LSTMS, OpCode.GRU, OpCode.RNN])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_every_input_and_output(op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    x = {"x": rand(SEQ, BATCH, IN, seed=1)}
    for output in range(3 if op == OpCode.LSTM_TRAINING else OUTPUTS[op]):
        check_op(build(op, output, direction=direction), x, renamed(params(op, dirs)))


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        (OpCode.LSTM, {"clip": 0.7}),
        (OpCode.LSTM, {"input_forget": 1}),
        (OpCode.LSTM, {"layout": 1}),
        (OpCode.LSTM_TRAINING, {"clip": 0.7}),
        (OpCode.LSTM_TRAINING, {"input_forget": 1}),
        (OpCode.LSTM_TRAINING, {"layout": 1}),
        (OpCode.GRU, {"linear_before_reset": 1, "clip": 0.8}),
        (
            OpCode.GRU,
            {
                "activations": "HardSigmoid,Softsign",
                "activation_alpha": [0.3, 0.0],
                "activation_beta": [0.4, 0.0],
            },
        ),
        (OpCode.RNN, {"activations": "Elu", "activation_alpha": [0.7], "activation_beta": [0.0]}),
    ],
)
def test_attributes(op, attrs):
    x = rand(SEQ, BATCH, IN, seed=1)
    p = params(op)
    if attrs.get("layout"):
        x = x.transpose(1, 0, 2).copy()
        p["h0"] = p["h0"].transpose(1, 0, 2).copy()
        p["c0"] = p["c0"].transpose(1, 0, 2).copy()
    check_op(build(op, 0, **attrs), {"x": x}, renamed(p))


@pytest.mark.parametrize("op", LSTMS)
def test_lstm_peepholes_and_sequence_lengths(op):
    # Entries shorter than the sequence keep their state: their gradient passes through.
    lens = np.array([4, 2], np.int32)
    for direction in ("forward", "reverse"):
        for output in range(3):
            check_op(
                build(op, output, lens, direction=direction),
                {"x": rand(SEQ, BATCH, IN, seed=1)},
                renamed(params(op, peepholes=True)),
            )


@pytest.mark.parametrize(
    ("lens", "peepholes", "attrs"),
    [
        (None, False, {"direction": "bidirectional"}),
        (None, False, {"clip": 0.7, "input_forget": 1}),
        (None, False, {"layout": 1}),
        (None, True, {"direction": "reverse"}),  # peepholes: the general loop, then saved
        (np.array([0, 3], np.int32), False, {"direction": "bidirectional"}),
        (np.array([4, 2], np.int32), True, {}),
    ],
)
def test_saved_steps_give_the_recomputed_gradients_bit_for_bit(lens, peepholes, attrs):
    # LSTM_GRAD reading LSTM_TRAINING's saved steps and LSTM_GRAD recomputing them.
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    x = rand(SEQ, BATCH, IN, seed=1)
    results = []
    for op in LSTMS:
        p = renamed(params(op, dirs, peepholes=peepholes))
        if attrs.get("layout"):
            x_op = x.transpose(1, 0, 2).copy()
            p = {k: (v.transpose(1, 0, 2).copy() if k in ("h0", "c0") else v) for k, v in p.items()}
        else:
            x_op = x
        case = GradientCase(build(op, 0, lens, **attrs), {"x": x_op}, p)
        ops = {n.op for g in case.model.graphs for n in g.nodes}
        assert (OpCode.LSTM_TRAINING in ops) == (op == OpCode.LSTM_TRAINING)
        grads = case.gradients()  # runs the plan
        results.append((case.output(), grads))
    (y_lstm, g_lstm), (y_training, g_training) = results
    np.testing.assert_array_equal(y_training, y_lstm)
    assert g_training.keys() == g_lstm.keys()
    for name, grad in g_lstm.items():
        np.testing.assert_array_equal(g_training[name], grad, err_msg=name)


def test_lstm_training_needs_its_saved_steps_to_differentiate():
    from sporenet.lite.errors import UnsupportedOpError

    def graph(b, x, w, r):
        return b.op_multi(OpCode.LSTM_TRAINING, [x, w, r], 3, hidden_size=HID)[0]

    p = params(OpCode.LSTM)
    with pytest.raises(UnsupportedOpError, match="saved steps as output 3"):
        GradientCase(graph, {"x": rand(SEQ, BATCH, IN, seed=1)}, {"w": p["w"], "r": p["r"]})


def test_gru_sequence_lengths():
    lens = np.array([0, 3], np.int32)  # an empty sequence: zero final state
    check_op(
        build(OpCode.GRU, 0, lens, direction="bidirectional"),
        {"x": rand(SEQ, BATCH, IN, seed=1)},
        renamed(params(OpCode.GRU, 2)),
    )


# ----------------------------------------------------------------------------- PyTorch


def _torch_call(kind: str, x, w, r, b_, h0, c0=None, *, order: list[int]):
    """torch.nn.<kind> with the ONNX parameters, gate blocks reordered to PyTorch's."""
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    from torch.func import functional_call

    module = getattr(torch.nn, kind)(IN, HID).double()

    def rows(t):  # ONNX gate blocks -> PyTorch's order
        return torch.cat([t[k * HID : (k + 1) * HID] for k in order])

    gh = len(order) * HID
    weights = {
        "weight_ih_l0": rows(w[0]),
        "weight_hh_l0": rows(r[0]),
        "bias_ih_l0": rows(b_[0, :gh]),
        "bias_hh_l0": rows(b_[0, gh:]),
    }
    state = (h0, c0) if kind == "LSTM" else h0
    y, _ = functional_call(module, weights, (x, state))
    return y


@pytest.mark.parametrize(
    ("op", "kind", "order", "attrs"),
    [
        (OpCode.LSTM, "LSTM", [0, 2, 3, 1], {}),  # ONNX i, o, f, c -> PyTorch i, f, g, o
        (OpCode.LSTM_TRAINING, "LSTM", [0, 2, 3, 1], {}),
        (OpCode.GRU, "GRU", [1, 0, 2], {"linear_before_reset": 1}),  # z, r, h -> r, z, n
        (OpCode.RNN, "RNN", [0], {}),
    ],
)
def test_matches_pytorch(op, kind, order, attrs):
    def torch_fn(x, w, r, b_, h0, c0=None):
        y = _torch_call(kind, x, w, r, b_, h0, c0, order=order)
        return y.unsqueeze(1)  # (seq, batch, H) -> ONNX's (seq, dirs, batch, H)

    check_op(
        build(op, 0, **attrs),
        {"x": rand(SEQ, BATCH, IN, seed=1)},
        renamed(params(op)),
        torch_fn=torch_fn,
    )
