"""The Interpreter's TFLite-shaped API: details, set/get tensor, invoke, run, resizing a
dynamic batch, clear InputErrors, buffer reuse and the thread bound."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import (
    InputError,
    Interpreter,
    ModelBuilder,
    OpCode,
    UnsupportedOpError,
    save,
    serialize,
)
from sporenet.lite.planner import plan
from sporenet.lite.threads import BLAS
from tests.unit.lite.format_samples import mlp_model


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    model = mlp_model()
    w, b = model.tensors[1].data.astype(np.float64), model.tensors[2].data.astype(np.float64)
    h = np.maximum(x.astype(np.float64) @ w.T + b, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _x(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, 4)).astype(np.float32)


@pytest.fixture
def interp() -> Interpreter:
    return Interpreter(model=mlp_model())


def test_input_and_output_details(interp):
    (inp,) = interp.get_input_details()
    (out,) = interp.get_output_details()
    assert inp["name"] == "x" and inp["index"] == 0 and inp["dtype"] is np.float32
    assert inp["shape"].tolist() == [1, 4]  # the dynamic batch plans as 1
    assert inp["shape_signature"].tolist() == [-1, 4]
    assert inp["quantization"] == (0.0, 0)
    assert out["name"] == "probs" and out["shape"].tolist() == [1, 3]
    assert out["shape_signature"].tolist() == [-1, 3]
    assert interp.get_signature_list() == {"infer": {"inputs": ["x"], "outputs": ["probs"]}}


def test_set_tensor_invoke_get_tensor(interp):
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    for seed in range(3):  # each invoke computes from the current inputs, no stale state
        x = _x(1, seed)
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        y = interp.get_tensor(out["index"])
        np.testing.assert_allclose(y, _mlp_reference(x), rtol=1e-5)
    y[...] = 42  # get_tensor returns a copy
    assert not np.any(interp.get_tensor(out["index"]) == 42)
    np.testing.assert_array_equal(interp.get_tensor(1), mlp_model().tensors[1].data)


def test_set_tensor_copies_the_value(interp):
    """An array of the input's exact dtype and shape is copied in, not kept: changing it
    after set_tensor changes nothing the next invoke reads."""
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    x = _x(1, 5)
    interp.set_tensor(inp["index"], x)
    expected = _mlp_reference(x.copy())
    x[...] = 7.0
    interp.invoke()
    np.testing.assert_allclose(interp.get_tensor(out["index"]), expected, rtol=1e-5)


def test_run_returns_named_copies(interp):
    x = _x(1)
    first = interp.run({"x": x})
    assert list(first) == ["probs"]
    np.testing.assert_allclose(first["probs"], _mlp_reference(x), rtol=1e-5)
    second = interp.run({"x": _x(1, 1)})
    assert not np.array_equal(first["probs"], second["probs"])  # first was not overwritten


def test_constructors_from_path_and_bytes(tmp_path):
    x = _x(2)
    path = save(mlp_model(), tmp_path / "mlp.spore")
    for interp in (
        Interpreter(model_path=path),
        Interpreter(model_path=str(path)),
        Interpreter(model_content=serialize(mlp_model())),
    ):
        np.testing.assert_allclose(interp.run({"x": x})["probs"], _mlp_reference(x), rtol=1e-5)
    with pytest.raises(ValueError, match="pass exactly one of model_path, model_content or model"):
        Interpreter()
    with pytest.raises(ValueError, match="pass exactly one"):
        Interpreter(model_path=path, model_content=b"")


# --------------------------------------------------------------------------- input errors


def test_wrong_input_names(interp):
    with pytest.raises(
        InputError,
        match=r"inputs expected \['x'\]; unknown \['image'\], "
        r"missing \['x'\]",
    ) as info:
        interp.run({"image": _x(1)})
    assert isinstance(info.value, ValueError)
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        interp.run({})


def test_wrong_input_dtype(interp):
    with pytest.raises(InputError, match="input 'x': expected dtype float32, got float64"):
        interp.run({"x": _x(1).astype(np.float64)})
    with pytest.raises(InputError, match="expected dtype float32, got int64"):
        interp.set_tensor(0, np.zeros((1, 4), np.int64))


def test_wrong_input_shape(interp):
    with pytest.raises(
        InputError,
        match=r"input 'x': expected shape \[1, 4\], got \[1, 5\] "
        r"\(call resize_tensor_input first\)",
    ):
        interp.set_tensor(0, np.zeros((1, 5), np.float32))
    with pytest.raises(InputError, match=r"expected shape \[1, 4\], got \[4\]"):
        interp.run({"x": np.zeros(4, np.float32)})  # wrong rank is never auto-resized
    with pytest.raises(
        InputError,
        match=r"cannot resize to \[2, 5\]; its shape signature is "
        r"\[-1, 4\] \(only -1 dims may change\)",
    ):
        interp.resize_tensor_input(0, [2, 5])
    with pytest.raises(
        InputError,
        match=r"input 'x': cannot resize to \[2, 5\]; its shape "
        r"signature is \[-1, 4\]",
    ):
        interp.run({"x": np.zeros((2, 5), np.float32)})  # run resizes only dynamic dims


def test_static_input_cannot_be_resized():
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    b.output(b.op(OpCode.RELU, [x]), name="y")
    interp = Interpreter(model=b.build())
    with pytest.raises(InputError, match=r"expected shape \[2, 3\], got \[3, 3\]$"):
        interp.set_tensor(0, np.zeros((3, 3), np.float32))  # no resize hint: nothing is -1
    with pytest.raises(InputError, match=r"input 'x': cannot resize to \[3, 3\]"):
        interp.run({"x": np.zeros((3, 3), np.float32)})
    with pytest.raises(InputError, match=r"its shape signature is \[2, 3\]"):
        interp.resize_tensor_input(0, [3, 3])


def test_set_tensor_on_a_non_input(interp):
    with pytest.raises(InputError, match=r"tensor 1 is not an input; inputs are \{'x': 0\}"):
        interp.set_tensor(1, np.zeros((3, 4), np.float32))
    with pytest.raises(InputError, match="tensor 1 is not an input"):
        interp.resize_tensor_input(1, [1, 4])


# --------------------------------------------------------------------------- dynamic batch


def test_resize_tensor_input_replans(interp):
    interp.resize_tensor_input(0, [7, 4])
    assert interp.get_input_details()[0]["shape"].tolist() == [7, 4]
    assert interp.get_output_details()[0]["shape"].tolist() == [7, 3]
    x = _x(7)
    interp.set_tensor(0, x)
    interp.invoke()
    np.testing.assert_allclose(
        interp.get_tensor(interp.get_output_details()[0]["index"]), _mlp_reference(x), rtol=1e-5
    )
    interp.resize_tensor_input(0, np.array([0, 4]))  # an empty batch is a valid batch
    assert interp.run({"x": np.zeros((0, 4), np.float32)})["probs"].shape == (0, 3)


def test_run_resizes_the_batch_on_its_own(interp):
    for batch in (3, 1, 5, 5):
        x = _x(batch, batch)
        y = interp.run({"x": x})["probs"]
        assert y.shape == (batch, 3)
        np.testing.assert_allclose(y, _mlp_reference(x), rtol=1e-5)
    assert interp.get_input_details()[0]["shape"].tolist() == [5, 4]


# --------------------------------------------------------------------------- planning


def _chain(length: int, width: int) -> ModelBuilder:
    b = ModelBuilder()
    x = b.input("x", (1, width))
    ops = [OpCode.RELU, OpCode.TANH, OpCode.SIGMOID, OpCode.NEG]
    for k in range(length):
        x = b.op(ops[k % len(ops)], [x])
    b.output(x, name="y")
    return b


def test_buffers_are_reused_along_a_chain():
    width, length = 256, 12
    model = _chain(length, width).build()
    p = plan(model)
    intermediates = (length - 1) * width * 4  # every activation but the graph output
    assert 0 < p.arena_bytes <= 2 * width * 4 < intermediates
    assert len(p.steps) == length
    # Reuse must not corrupt values: compare with step-by-step NumPy.
    x = np.linspace(-3, 3, width, dtype=np.float32)[None]
    ref = x.astype(np.float64)
    fns = [lambda v: np.maximum(v, 0), np.tanh, lambda v: 1 / (1 + np.exp(-v)), np.negative]
    for k in range(length):
        ref = fns[k % 4](ref)
    y = Interpreter(model=model).run({"x": x})["y"]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)


def test_invoke_does_not_allocate_intermediates():
    interp = Interpreter(model=_chain(6, 64).build())
    interp.set_tensor(0, np.ones((1, 64), np.float32))
    arrays = dict(interp._plan.arrays)  # the planned buffers, by tensor
    addresses = {i: a.ctypes.data for i, a in arrays.items()}
    interp.invoke()
    interp.invoke()
    assert {i: a.ctypes.data for i, a in interp._plan.arrays.items()} == addresses


@pytest.mark.parametrize("threads", [1, 2])
def test_num_threads_is_accepted_and_restored(threads):
    before = BLAS.get() if BLAS.available else None
    interp = Interpreter(model=mlp_model(), num_threads=threads)
    x = _x(3)
    np.testing.assert_allclose(interp.run({"x": x})["probs"], _mlp_reference(x), rtol=1e-5)
    if BLAS.available:  # the bound applies during invoke only
        assert BLAS.get() == before


@pytest.mark.skipif(not BLAS.available, reason="no OpenBLAS whose threads can be set")
@pytest.mark.parametrize("threads", [1, 2])
def test_blas_call_bounds_the_step_and_restores_after_an_error(threads):
    before = BLAS.get()
    seen = []

    def step():
        seen.append(BLAS.get())
        raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError, match="the step failed"):
        BLAS.call(threads, step)
    assert seen == [threads]
    assert BLAS.get() == before
    BLAS.call(None, lambda: seen.append(BLAS.get()))  # None: the pool as it is
    assert seen[-1] == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_num_threads_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"num_threads must be a positive int, got {bad!r}"):
        Interpreter(model=mlp_model(), num_threads=bad)


def test_int8_only_op_on_float_input_is_refused_by_name():
    # Every op code has a kernel now; REQUANTIZE has only an int8 one.
    b = ModelBuilder()
    x = b.input("x", (2,))
    b.output(b.op(OpCode.REQUANTIZE, [x]), name="q")
    graph_model = b.build(infer_shapes=False)
    with pytest.raises(
        UnsupportedOpError,
        match=r"REQUANTIZE runs only on int8/uint8 tensors "
        r"with quantization, got float32",
    ):
        Interpreter(model=graph_model)


def test_two_inputs_and_two_outputs():
    b = ModelBuilder()
    a = b.input("a", (-1, 3))
    c = b.input("c", (1, 3))
    s = b.op(OpCode.ADD, [a, c])
    b.output(s, name="sum")
    b.output(b.op(OpCode.MUL, [s, c]), name="product")
    interp = Interpreter(model=b.build())
    assert [d["name"] for d in interp.get_input_details()] == ["a", "c"]
    av = np.arange(6, dtype=np.float32).reshape(2, 3)
    cv = np.array([[1, 2, 3]], np.float32)
    # "c" comes first and "a" needs a resize: the re-plan must not lose c's value.
    out = interp.run({"c": cv, "a": av})
    np.testing.assert_array_equal(out["sum"], av + cv)
    np.testing.assert_array_equal(out["product"], (av + cv) * cv)


def test_missing_signature_and_huge_declared_shapes_are_format_errors():
    import sporenet.lite as lite_api
    from sporenet.lite import ModelBuilder, ModelFormatError, OpCode

    b = ModelBuilder()
    x = b.input("x", (1 << 20, 1 << 20))  # 4 TiB of float32: declared, never allocatable
    b.output(b.op(OpCode.RELU, [x]), "y")
    model = b.build(infer_shapes=False)
    with pytest.raises(ModelFormatError, match="limit per tensor"):
        lite_api.Interpreter(model=model)
    with pytest.raises(ModelFormatError, match="no signature 'train'"):
        lite_api.Interpreter(model=model, signature="train")


def test_builder_keeps_scalar_constants_zero_dimensional():
    b = ModelBuilder()
    x = b.input("x", (2,))
    two = b.constant("two", np.float32(2.0))
    b.output(b.op(OpCode.MUL, [x, two]), "y")
    model = b.build()
    assert model.tensors[two].shape == ()
    y = Interpreter(model=model).run({"x": np.array([1.0, 3.0], np.float32)})["y"]
    np.testing.assert_array_equal(y, [2.0, 6.0])


def test_the_default_blas_threads_are_one_or_what_the_environment_says(monkeypatch):
    from sporenet.lite.threads import BLAS, THREADS_ENV, default_threads

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_threads() == 1
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    monkeypatch.setenv(THREADS_ENV, "0")  # the BLAS library's own choice
    assert default_threads() is None
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(ValueError, match="SPORENET_THREADS must be a thread count"):
        default_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    if not BLAS.available:
        pytest.skip("no OpenBLAS whose threads can be set (the limit is a no-op)")
    before = BLAS.get()
    with BLAS.limit(None):
        assert BLAS.get() == 1
    assert BLAS.get() == before
