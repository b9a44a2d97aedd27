"""The direct run path (planner.DirectRun): feeds of the planned dtypes and shapes go
straight into the plan. It must give what the checked path gives, on every call, across
re-plans and state, refuse nothing the checked path accepts, raise the checked path's
errors for anything else, and hand out outputs no later call changes."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import InputError, Interpreter, ModelBuilder, OpCode, serialize
from sporenet.lite.dtypes import STRING
from tests.unit.converter.tflite_builder import RESOURCE, TfliteBuilder, rand
from tests.unit.lite.format_samples import mlp_model, strings_model
from tests.unit.training.test_app_training import data, train_file


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    model = mlp_model()
    w, b = model.tensors[1].data.astype(np.float64), model.tensors[2].data.astype(np.float64)
    h = np.maximum(x.astype(np.float64) @ w.T + b, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _x(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, 4)).astype(np.float32)


def _is_direct(interpreter: Interpreter) -> bool:
    planned, direct = interpreter._direct
    return direct is not None and planned is interpreter._plan


def test_repeated_runs_equal_the_checked_path_bit_for_bit():
    interpreter = Interpreter(model=mlp_model())
    for seed in range(6):
        x = _x(1, seed)
        direct = interpreter.run({"x": x})
        assert _is_direct(interpreter)
        checked = interpreter._checked_run({"x": x})
        np.testing.assert_array_equal(direct["probs"], checked["probs"])
        np.testing.assert_allclose(direct["probs"], _mlp_reference(x), rtol=1e-5)


def test_shape_changes_between_calls_re_plan_and_rebuild_the_path():
    interpreter = Interpreter(model=mlp_model())
    plans = []
    for batch in (1, 3, 3, 1, 5, 5, 3):
        x = _x(batch, batch)
        out = interpreter.run({"x": x})["probs"]
        assert out.shape == (batch, 3)
        np.testing.assert_allclose(out, _mlp_reference(x), rtol=1e-5)
        plans.append(interpreter._plan)
        again = interpreter.run({"x": x})["probs"]  # the path of the new plan
        assert _is_direct(interpreter)
        np.testing.assert_array_equal(again, out)
    assert plans[1] is plans[2] and plans[4] is plans[5] and plans[0] is not plans[1]
    # allocate_tensors replaces the plan: the path follows it.
    interpreter.resize_tensor_input(0, (2, 4))
    interpreter.allocate_tensors()
    x = _x(2, 9)
    for _ in range(2):
        out = interpreter.run({"x": x})["probs"]
        np.testing.assert_allclose(out, _mlp_reference(x), rtol=1e-5)
        assert _is_direct(interpreter)


def test_feeds_the_path_refuses_raise_the_checked_errors():
    interpreter = Interpreter(model=mlp_model())
    interpreter.run({"x": _x(1)})  # the path is built
    with pytest.raises(InputError, match="input 'x': expected dtype float32, got float64"):
        interpreter.run({"x": _x(1).astype(np.float64)})
    with pytest.raises(InputError, match="expected dtype float32, got >f4"):
        interpreter.run({"x": _x(1).astype(">f4")})
    with pytest.raises(InputError, match=r"cannot resize to \[1, 5\]; its shape signature"):
        interpreter.run({"x": np.zeros((1, 5), np.float32)})
    with pytest.raises(InputError, match=r"expected shape \[1, 4\], got \[4\]"):
        interpreter.run({"x": np.zeros(4, np.float32)})
    with pytest.raises(InputError, match=r"unknown \['y'\], missing \[\]"):
        interpreter.run({"x": _x(1), "y": _x(1)})
    with pytest.raises(InputError, match=r"unknown \['y'\], missing \['x'\]"):
        interpreter.run({"y": _x(1)})
    with pytest.raises(InputError, match="expected dtype float32, got float64"):
        interpreter.run({"x": _x(1).tolist()})  # a list: converted by the checked path
    # After the errors the path still runs, on the same plan.
    x = _x(1, 4)
    np.testing.assert_allclose(interpreter.run({"x": x})["probs"], _mlp_reference(x), rtol=1e-5)


def test_what_the_checked_path_accepts_still_runs():
    """A non-contiguous view, a read-only array, an ndarray subclass: the same values."""
    interpreter = Interpreter(model=mlp_model())
    x = _x(4, 2)
    expected = _mlp_reference(x[:, :1].repeat(4, axis=1)[::2])
    strided = np.broadcast_to(x[:, :1], (4, 4))[::2]  # read-only, zero strides
    np.testing.assert_allclose(interpreter.run({"x": strided})["probs"], expected, rtol=1e-5)
    sub = np.ascontiguousarray(strided).view(np.recarray)
    np.testing.assert_allclose(interpreter.run({"x": sub})["probs"], expected, rtol=1e-5)


def test_outputs_and_feeds_are_not_aliased_to_the_plan():
    interpreter = Interpreter(model=mlp_model())
    x = _x(1, 3)
    expected = _mlp_reference(x)
    first = interpreter.run({"x": x})["probs"]
    first[...] = 42.0  # a caller writing into an output
    x_copy = x.copy()
    second = interpreter.run({"x": x})["probs"]
    np.testing.assert_allclose(second, expected, rtol=1e-5)
    x[...] = 7.0  # a caller writing into the array it fed
    third = interpreter.run({"x": _x(1, 8)})["probs"]
    np.testing.assert_allclose(second, expected, rtol=1e-5)  # not overwritten by the run
    np.testing.assert_allclose(third, _mlp_reference(_x(1, 8)), rtol=1e-5)
    np.testing.assert_allclose(interpreter.run({"x": x_copy})["probs"], expected, rtol=1e-5)


WINDOW = 3


def _streaming_model() -> bytes:
    """state = the last WINDOW frames (initially `rand(..., seed=9)`); y = concat(state,
    frame): a converted TFLite streaming model, state in resource variables."""
    b = TfliteBuilder()
    init_graph, index = b.subgraph()
    h0 = init_graph.tensor("state_handle", [], RESOURCE)
    init_graph.op("VAR_HANDLE", [], [h0], "VarHandleOptions", SharedName="state")
    init = init_graph.tensor("init", (1, WINDOW, 4), data=rand(1, WINDOW, 4, seed=9))
    init_graph.op("ASSIGN_VARIABLE", [h0, init], [])
    x = b.input("frame", (1, 1, 4))
    b.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=index)
    h = b.tensor("state_handle", [], RESOURCE)
    b.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName="state")
    state = b.tensor("state", [1, WINDOW, 4])
    b.op("READ_VARIABLE", [h], [state])
    joined = b.tensor("joined", [1, WINDOW + 1, 4])
    b.op("CONCATENATION", [state, x], [joined], "ConcatenationOptions", Axis=1)
    kept = b.tensor("kept", [1, WINDOW, 4])
    ends = [b.const(n, v, np.int32) for n, v in (("b", [0, 1, 0]), ("e", [1, WINDOW + 1, 4]))]
    strides = b.const("s", [1, 1, 1], np.int32)
    b.op("STRIDED_SLICE", [joined, *ends, strides], [kept], "StridedSliceOptions")
    b.op("ASSIGN_VARIABLE", [h, kept], [])
    b.output(joined)
    return b.build()


def test_state_persists_and_resets_on_the_direct_path():
    interpreter = Interpreter(model_content=convert_tflite(_streaming_model()))
    frames = [rand(1, 1, 4, seed=k) for k in range(7)]

    def expected(upto: int, start: int = 0) -> np.ndarray:
        seen = [rand(1, WINDOW, 4, seed=9)[0], *(f[0] for f in frames[start : upto + 1])]
        return np.concatenate(seen, axis=0)[-(WINDOW + 1) :][None]

    outs = [interpreter.run({"frame": f})["joined"] for f in frames]
    assert _is_direct(interpreter)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, expected(k))
    interpreter.reset_all_variables()
    for k in range(3):
        got = interpreter.run({"frame": frames[k]})["joined"]
        np.testing.assert_array_equal(got, expected(k))


def test_zero_dimensional_inputs_take_numpy_scalars():
    b = ModelBuilder()
    x = b.input("x", (3,))
    scale = b.input("scale", ())
    b.output(b.op(OpCode.MUL, [x, scale]), "y")
    interpreter = Interpreter(model=b.build())
    x_value = np.array([1.0, -2.0, 3.0], np.float32)
    for s in (2.0, 0.5, -1.0):
        got = interpreter.run({"x": x_value, "scale": np.float32(s)})["y"]
        assert _is_direct(interpreter)
        np.testing.assert_array_equal(got, x_value * np.float32(s))
    with pytest.raises(InputError, match="input 'scale': expected dtype float32, got float64"):
        interpreter.run({"x": x_value, "scale": np.float64(2.0)})


def test_string_and_shape_like_inputs_keep_the_checked_path():
    interpreter = Interpreter(model_content=serialize(strings_model()))
    for _ in range(2):
        out = interpreter.run({"category": np.array(["cat", "dog"], dtype=object)})
        assert out["id"].tolist() == [4, -1]
    assert interpreter._direct[1] is None
    assert interpreter._plan.specs[interpreter._input_names["category"]].dtype == STRING

    b = ModelBuilder()
    x = b.input("x", (6,))
    shape = b.input("shape", (2,), np.int64)
    b.output(b.op(OpCode.RESHAPE, [x, shape]), "y")
    interpreter = Interpreter(model=b.build(infer_shapes=False))
    values = np.arange(6, dtype=np.float32)
    for target in ([2, 3], [3, 2], [3, 2], [6, 1]):
        got = interpreter.run({"x": values, "shape": np.array(target)})["y"]
        np.testing.assert_array_equal(got, values.reshape(target))
        assert interpreter._direct[1] is None


def test_signature_runner_direct_path_trains_as_the_checked_path():
    """The same training steps through the direct path (NumPy float32 lr) and the checked
    path (a Python float, cast on every call): the same losses and weights, bit for bit."""
    x, y = data()
    interpreters = [Interpreter(model_content=train_file(), signature="train") for _ in "ab"]
    direct, checked = (i.get_signature_runner("train") for i in interpreters)
    for step in range(8):
        batch = slice(0, 96) if step % 3 else slice(0, 40)  # plans switch in between
        a = direct(x=x[batch], labels=y[batch], lr=np.float32(0.05))
        b = checked(x=x[batch], labels=y[batch], lr=0.05)
        assert direct._direct[0] is direct._last
        np.testing.assert_array_equal(a["loss"], b["loss"])
        np.testing.assert_array_equal(a["logits"], b["logits"])
        np.testing.assert_array_equal(direct.output("logits"), a["logits"])
        a["logits"][...] = 0.0  # not the plan's array
        assert not np.array_equal(direct.output("logits"), a["logits"])
    for i, v in interpreters[0].variables.items():
        np.testing.assert_array_equal(v, interpreters[1].variables[i])
    infer = [i.get_signature_runner("infer")(x=x)["logits"] for i in interpreters]
    np.testing.assert_array_equal(infer[0], infer[1])


def test_signature_runner_refusals_raise_its_errors():
    runner = Interpreter(model_content=train_file()).get_signature_runner("train")
    x, y = data(8)
    runner(x=x, labels=y, lr=np.float32(0.1))
    with pytest.raises(InputError, match=r"missing \['labels'\]"):
        runner(x=x, lr=np.float32(0.1))
    with pytest.raises(InputError, match="'x'"):
        runner(x=np.zeros((8, 5), np.float32), labels=y, lr=np.float32(0.1))
    with pytest.raises(InputError, match=r"unknown \['z'\]"):
        runner(x=x, labels=y, lr=np.float32(0.1), z=x)
    out = runner(x=x.astype(np.float64), labels=y, lr=np.float32(0.0))  # cast, same plan
    assert out["logits"].shape == (8, 3)
