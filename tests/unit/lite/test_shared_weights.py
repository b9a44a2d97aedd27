"""lite.shared_weights: a weight's kernel form is made once while any plan holds it, so a
re-plan (an input resized) makes no second copy beside the old plan's."""

from __future__ import annotations

import gc

import numpy as np

from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.graph import DYNAMIC, Quantization
from sporenet.lite.shared_weights import live_forms, shared

RNG = np.random.default_rng(5)


def _counting(value: np.ndarray, calls: list[int]):
    def make() -> np.ndarray:
        calls.append(1)
        return np.ascontiguousarray(value.T) * 2

    return make


def test_a_live_form_is_made_once_and_read_only():
    source, calls = RNG.normal(size=(3, 4)), []
    a = shared(source, "t", _counting(source, calls))
    b = shared(source, "t", _counting(source, calls))
    assert len(calls) == 1 and np.shares_memory(a, b)
    np.testing.assert_array_equal(b, source.T * 2)
    assert not a.flags.writeable and not b.flags.writeable


def test_the_key_and_the_source_tell_forms_apart():
    source, calls = RNG.normal(size=(3, 4)), []
    a = shared(source, "t", _counting(source, calls))
    b = shared(source, "other", _counting(source, calls))
    same_values = source.copy()
    c = shared(same_values, "t", _counting(same_values, calls))
    assert len(calls) == 3
    assert not np.shares_memory(a, b) and not np.shares_memory(a, c)


def test_a_slice_keeps_its_form_shared_and_nothing_outlives_the_last_reader():
    gc.collect()
    before = live_forms()
    source, calls = RNG.normal(size=(2, 3, 4)), []
    kept = shared(source, "t", _counting(source, calls))[1]  # a kernel keeps slices
    gc.collect()
    again = shared(source, "t", _counting(source, calls))
    assert len(calls) == 1 and np.shares_memory(again, kept)
    assert live_forms() == before + 1
    del kept, again
    gc.collect()
    assert live_forms() == before
    shared(source, "t", _counting(source, calls))
    assert len(calls) == 2


def _int8(shape, axis):
    q = RNG.integers(-128, 128, size=shape).astype(np.int8)
    scale = RNG.uniform(2e-3, 1e-2, size=shape[axis]).astype(np.float32)
    return q, Quantization(scale=scale, zero_point=np.zeros(shape[axis], np.int64), axis=axis)


def _streaming_model():
    """An LSTM with int8 W and R over a dynamic number of frames (the fast path packs R^T
    from the integers), then FullyConnected layers with int8 weights and with float16
    weights (the planner widens those)."""
    hidden, size = 8, 6
    w, wq = _int8((1, 4 * hidden, size), 1)
    r, rq = _int8((1, 4 * hidden, hidden), 1)
    fc8, fcq = _int8((5, hidden), 0)
    fc16 = RNG.normal(size=(3, 5)).astype(np.float16)
    b = ModelBuilder()
    x = b.input("x", (DYNAMIC, 1, size))
    wi, ri = b.constant("W", w, quantization=wq), b.constant("R", r, quantization=rq)
    y, _, _ = b.op_multi(OpCode.LSTM, [x, wi, ri], 3, hidden_size=hidden)
    y = b.op(OpCode.RESHAPE, [y, b.constant("shape", np.array([-1, hidden], np.int64))])
    y = b.op(OpCode.FULLY_CONNECTED, [y, b.constant("fc8", fc8, quantization=fcq)])
    y = b.op(OpCode.FULLY_CONNECTED, [y, b.constant("fc16", fc16)])
    b.output(y, name="y")
    return b.build()


def test_a_replan_shares_every_weight_form_with_the_plan_it_replaces():
    model = _streaming_model()
    gc.collect()
    before = live_forms()
    interp = Interpreter(model=model)
    forms = live_forms() - before
    assert forms >= 2  # R^T, and the FullyConnected's widened float16 weights
    x = RNG.normal(size=(3, 1, 6)).astype(np.float32)
    old = interp._plan
    got = interp.run({"x": x})["y"]  # 3 frames: a new plan while `old` is alive
    assert interp._plan is not old
    assert live_forms() - before == forms
    fresh = Interpreter(model=model)
    fresh.resize_tensor_input(fresh.get_input_details()[0]["index"], [3, 1, 6])
    np.testing.assert_array_equal(got, fresh.run({"x": x})["y"])
