"""Kernels that read int8/uint8 weights as stored (weight-only quantization): LSTM and GRU
dequantize W and R straight into their packed form, FullyConnected keeps large weights as
integers and dequantizes a block of columns per GEMM. Each must compute what the same
model with the dequantized float weights computes, and the plan must hold no float copy
of the weights in the file's layout."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode, save
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels import int8_weights
from sporenet.lite.kernels.quantized.convert import dequantize_array

RNG = np.random.default_rng(11)
GATES = {OpCode.LSTM: 4, OpCode.GRU: 3}
OUTPUTS = {OpCode.LSTM: 3, OpCode.GRU: 2}


def _quantized(shape, dtype, axis, per_channel):
    """Random integers with a scale and zero point per slice along `axis` (or one)."""
    info = np.iinfo(dtype)
    q = RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)
    n = shape[axis] if per_channel else 1
    scale = RNG.uniform(2e-3, 1e-2, size=n).astype(np.float32)
    zp = (
        RNG.integers(info.min // 4, info.max // 4 + 1, size=n)
        if dtype == np.int8
        else (RNG.integers(100, 156, size=n))
    )
    return q, Quantization(scale=scale, zero_point=zp, axis=axis if per_channel else 0)


def _recurrent_pair(op, *, dirs, per_column, dtype, seq=5, batch=2, size=6, hidden=4, **attrs):
    """The same recurrent model twice: W and R as quantized constants, and as their
    dequantized float32 values."""
    gh = GATES[op] * hidden
    direction = "bidirectional" if dirs == 2 else "forward"
    w, wq = _quantized((dirs, gh, size), dtype, 1 if per_column else 0, per_column or dirs > 1)
    r, rq = _quantized((dirs, gh, hidden), dtype, 1 if per_column else 0, per_column or dirs > 1)
    bias = RNG.normal(size=(dirs, 2 * gh)).astype(np.float32) * 0.1
    models = []
    for quantized in (True, False):
        b = ModelBuilder()
        x = b.input("x", (seq, batch, size))
        if quantized:
            wi = b.constant("W", w, quantization=wq)
            ri = b.constant("R", r, quantization=rq)
        else:
            wi = b.constant("W", dequantize_array(w, wq))
            ri = b.constant("R", dequantize_array(r, rq))
        outs = b.op_multi(
            op,
            [x, wi, ri, b.constant("B", bias)],
            OUTPUTS[op],
            hidden_size=hidden,
            direction=direction,
            **attrs,
        )
        for k, o in enumerate(outs):
            b.output(o, name=f"y{k}")
        models.append(b.build())
    return models


@pytest.mark.parametrize("op", [OpCode.LSTM, OpCode.GRU])
@pytest.mark.parametrize(
    "dirs,per_column,dtype",
    [(2, False, np.int8), (1, True, np.int8), (1, False, np.uint8), (2, False, np.uint8)],
)
def test_recurrent_int8_weights_match_their_float_values(tmp_path, op, dirs, per_column, dtype):
    quantized, floating = _recurrent_pair(op, dirs=dirs, per_column=per_column, dtype=dtype)
    interp = Interpreter(model_path=save(quantized, tmp_path / "q.spore"))
    reference = Interpreter(model=floating)
    (kernel,) = interp._plan.kernels
    assert kernel.fast
    # The planner handed W and R over as stored; the kernel packed its own float form.
    assert kernel.constant_inputs == {}
    for name in ("W", "R"):
        index = interp.model.tensor_index(name)
        assert interp._plan.arrays[index].dtype == dtype
    x = RNG.normal(size=(5, 2, 6)).astype(np.float32)
    got, want = interp.run({"x": x}), reference.run({"x": x})
    for name in want:
        if op == OpCode.GRU:
            # Packed from the integers or from their float values: the same float32 weights.
            np.testing.assert_array_equal(got[name], want[name])
        else:
            # The LSTM projects X with the integers and scales the product: the same
            # values up to float rounding.
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [OpCode.LSTM, OpCode.GRU])
def test_recurrent_int8_weights_on_the_general_path(op):
    # clip takes the general loop, which dequantizes W and R at bind.
    quantized, floating = _recurrent_pair(op, dirs=2, per_column=False, dtype=np.int8, clip=0.5)
    interp = Interpreter(model=quantized)
    assert not interp._plan.kernels[0].fast
    x = RNG.normal(size=(5, 2, 6)).astype(np.float32)
    got, want = interp.run({"x": x}), Interpreter(model=floating).run({"x": x})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_lstm_int8_weights_bidirectional_long_sequence_matches_numpy():
    """The directions advanced side by side against a plain float64 LSTM."""
    seq, batch, size, hidden = 9, 3, 5, 4
    quantized, _ = _recurrent_pair(
        OpCode.LSTM, dirs=2, per_column=False, dtype=np.int8, seq=seq, batch=batch, size=size
    )
    spec = {t.name: t for t in quantized.tensors}
    w = dequantize_array(spec["W"].data, spec["W"].quantization).astype(np.float64)
    r = dequantize_array(spec["R"].data, spec["R"].quantization).astype(np.float64)
    bias = spec["B"].data.astype(np.float64)
    x = RNG.normal(size=(seq, batch, size)).astype(np.float32)
    got = Interpreter(model=quantized).run({"x": x})

    def sigmoid(v):
        return 1 / (1 + np.exp(-v))

    for d, order in enumerate((range(seq), range(seq - 1, -1, -1))):
        h, c = np.zeros((batch, hidden)), np.zeros((batch, hidden))
        for t in order:
            a = x[t] @ w[d].T + h @ r[d].T + bias[d, : 4 * hidden] + bias[d, 4 * hidden :]
            i, o, f, g = np.split(a, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            np.testing.assert_allclose(got["y0"][t, d], h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["y1"][d], h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["y2"][d], c, rtol=1e-5, atol=1e-6)


def _fc_pair(out_features, in_features, dtype, per_channel, rows=7, relu=False):
    q, quant = _quantized((out_features, in_features), dtype, 0, per_channel)
    bias = RNG.normal(size=out_features).astype(np.float32)
    models = []
    for w in (None, dequantize_array(q, quant)):
        b = ModelBuilder()
        x = b.input("x", (rows, in_features))
        wi = b.constant("w", q, quantization=quant) if w is None else b.constant("w", w)
        attrs = {"activation": "relu"} if relu else {}
        y = b.op(OpCode.FULLY_CONNECTED, [x, wi, b.constant("b", bias)], **attrs)
        b.output(y, name="y")
        models.append(b.build())
    return models


@pytest.mark.parametrize(
    "dtype,per_channel,relu", [(np.int8, True, False), (np.uint8, False, True)]
)
def test_fully_connected_keeps_large_int8_weights_as_integers(
    tmp_path, monkeypatch, dtype, per_channel, relu
):
    # Blocks of 8 rows, the last one shorter, and a threshold the weights pass.
    monkeypatch.setattr(int8_weights, "BLOCK_ROWS", 8)
    monkeypatch.setattr(int8_weights, "MIN_ELEMENTS", 64)
    bound = []
    bind = int8_weights.bind_matmul
    monkeypatch.setattr(int8_weights, "bind_matmul", lambda *a: bound.append(bind(*a)) or bound[-1])
    quantized, floating = _fc_pair(21, 12, dtype, per_channel, relu=relu)
    interp = Interpreter(model_path=save(quantized, tmp_path / "fc.spore"))
    index = interp.model.tensor_index("w")
    assert interp._plan.arrays[index].dtype == dtype
    # The kernel kept the integers, read from the file: its step dequantizes blocks.
    assert len(bound) == 1 and callable(bound[0])
    assert np.shares_memory(interp._plan.arrays[index], interp.model.tensors[index].data)
    x = RNG.normal(size=(7, 12)).astype(np.float32)
    got, want = interp.run({"x": x})["y"], Interpreter(model=floating).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Against float64 arithmetic on the dequantized weights.
    spec = quantized.tensors[quantized.tensor_index("w")]
    w = dequantize_array(spec.data, spec.quantization).astype(np.float64)
    bias = quantized.tensors[quantized.tensor_index("b")].data
    reference = x.astype(np.float64) @ w.T + bias
    np.testing.assert_allclose(
        got, np.maximum(reference, 0) if relu else reference, rtol=1e-5, atol=1e-5
    )


def test_fully_connected_small_int8_weights_dequantized_once():
    quantized, floating = _fc_pair(5, 4, np.int8, True)
    x = RNG.normal(size=(7, 4)).astype(np.float32)
    got = Interpreter(model=quantized).run({"x": x})["y"]
    np.testing.assert_array_equal(got, Interpreter(model=floating).run({"x": x})["y"])


def test_fully_connected_int8_blocks_sized_for_unpacked_gemm(tmp_path):
    # 20 rows of 1024 inputs: one-thread blocks of 48 output rows (the last shorter)
    # under OpenBLAS's unpacked limit, as a sequence model's output layer runs.
    n_out, n_in, rows = 300, 1024, 20
    unpacked = int8_weights.UNPACKED_GEMM // (n_in * rows)
    assert unpacked >= int8_weights.MIN_UNPACKED_ROWS and n_out % unpacked
    assert n_out * n_in >= int8_weights.MIN_ELEMENTS
    quantized, _ = _fc_pair(n_out, n_in, np.int8, True, rows=rows)
    interp = Interpreter(model_path=save(quantized, tmp_path / "fc.spore"), num_threads=1)
    assert interp._plan.arrays[interp.model.tensor_index("w")].dtype == np.int8
    x = RNG.normal(size=(rows, n_in)).astype(np.float32)
    got = interp.run({"x": x})["y"]
    spec = quantized.tensors[quantized.tensor_index("w")]
    w = dequantize_array(spec.data, spec.quantization).astype(np.float64)
    bias = quantized.tensors[quantized.tensor_index("b")].data
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T + bias, rtol=1e-4, atol=1e-4)
