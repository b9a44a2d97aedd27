"""TFLite resource variables and CALL_ONCE: streaming models whose state persists between
invokes, fed frame by frame and compared with LiteRT at every frame."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import ConversionError, convert_tflite
from sporenet.lite import Interpreter
from sporenet.lite.ops import OpCode
from tests.packaged import package_dir
from tests.unit.converter.tflite_builder import RESOURCE, TfliteBuilder, rand

litert = pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

FRAME, WINDOW = (1, 1, 4), 3  # one frame of 4 features; the state keeps the last 3


def _handle(b: TfliteBuilder, name: str) -> int:
    h = b.tensor(f"{name}_handle", [], RESOURCE)
    b.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName=name)
    return h


def streaming_model(
    *,
    dtype=np.float32,
    quant=None,
    init: np.ndarray | None = None,
    read_by_add: bool = False,
    reshaped: bool = False,
) -> bytes:
    """state = last WINDOW frames; y = concat(state, frame) . w; the init subgraph sets the
    state to `init` (zeros by default), the way converters write Keras streaming layers.
    `read_by_add`: the output is joined + joined, so the concatenation is internal (the
    plan then stores the state inside it: stream_windows.Window). `reshaped`: the input
    is the frame's 4 features, reshaped to the frame before the concatenation."""
    b = TfliteBuilder()
    init_graph, index = b.subgraph()
    value = np.zeros((1, WINDOW, 4)) if init is None else init
    h0 = _handle(init_graph, "state")
    init_graph.op(
        "ASSIGN_VARIABLE",
        [h0, init_graph.tensor("init", value.shape, dtype, data=value, quant=quant)],
        [],
    )
    x = b.input("frame", FRAME[1:] if reshaped else FRAME, dtype, quant=quant)
    if reshaped:
        x3 = b.tensor("frame3", list(FRAME), dtype, quant=quant)
        b.op("RESHAPE", [x, b.const("frame_shape", list(FRAME), np.int32)], [x3])
        x = x3
    b.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=index)
    h = _handle(b, "state")
    state = b.tensor("state", [1, WINDOW, 4], dtype, quant=quant)
    b.op("READ_VARIABLE", [h], [state])
    joined = b.tensor("joined", [1, WINDOW + 1, 4], dtype, quant=quant)
    b.op("CONCATENATION", [state, x], [joined], "ConcatenationOptions", Axis=1)
    kept = b.tensor("kept", [1, WINDOW, 4], dtype, quant=quant)
    b.op(
        "STRIDED_SLICE",
        [
            joined,
            b.const("begin", [0, 1, 0], np.int32),
            b.const("end", [1, WINDOW + 1, 4], np.int32),
            b.const("strides", [1, 1, 1], np.int32),
        ],
        [kept],
        "StridedSliceOptions",
    )
    b.op("ASSIGN_VARIABLE", [h, kept], [])
    if read_by_add:
        y = b.tensor("y", [1, WINDOW + 1, 4], dtype, quant=quant)
        b.op("ADD", [joined, joined], [y], "AddOptions")
        b.output(y)
    else:
        b.output(joined)
    return b.build()


def _frames(n: int, dtype=np.float32) -> list[np.ndarray]:
    if dtype == np.int8:
        rng = np.random.default_rng(1)
        return [rng.integers(-128, 128, FRAME).astype(np.int8) for _ in range(n)]
    return [rand(*FRAME, seed=k) for k in range(n)]


def _reference(data: bytes) -> litert.Interpreter:
    ref = litert.Interpreter(model_content=data)
    ref.allocate_tensors()
    return ref


def _step(ref: litert.Interpreter, x: np.ndarray) -> np.ndarray:
    ref.set_tensor(ref.get_input_details()[0]["index"], x)
    ref.invoke()
    return ref.get_tensor(ref.get_output_details()[0]["index"])


@pytest.mark.parametrize("optimize", [True, False])
def test_float_state_persists_between_invokes_as_in_litert(optimize):
    data = streaming_model(init=rand(1, WINDOW, 4, seed=9))
    ours, ref = Interpreter(model_content=convert_tflite(data, optimize=optimize)), _reference(data)
    for frame in _frames(6):
        np.testing.assert_array_equal(ours.run({"frame": frame})["joined"], _step(ref, frame))


@pytest.mark.parametrize("reshaped", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_state_stored_in_its_concatenation_streams_and_resets_as_in_litert(dtype, reshaped):
    from sporenet.lite.variables import stream_windows

    quant = ([0.05], [3], 0) if dtype == np.int8 else None
    init = np.arange(WINDOW * 4).reshape(1, WINDOW, 4).astype(dtype)
    data = streaming_model(dtype=dtype, quant=quant, init=init, read_by_add=True, reshaped=reshaped)
    ours, ref = Interpreter(model_content=convert_tflite(data)), _reference(data)
    graph = ours.model.signature("infer").graph
    (window,) = stream_windows(ours.model, graph)
    # The state is the head of the concatenation's buffer and the frame input its tail:
    # the concatenation has no step left.
    joined, frame_index = ours._plan.arrays[window.joined], ours.get_input_details()[0]["index"]
    assert joined.ctypes.data == ours.variables[window.variable].ctypes.data
    assert ours._plan.arrays[frame_index].ctypes.data == joined[:, WINDOW:].ctypes.data
    assert OpCode.CONCAT not in [k.op for k in ours._plan.step_kernels]
    frames = _frames(6, dtype)
    for frame in frames:
        frame = frame.reshape(FRAME[1:]) if reshaped else frame
        np.testing.assert_array_equal(ours.run({"frame": frame})["y"], _step(ref, frame))
    ours.reset_all_variables()
    fresh = _reference(data)
    for frame in frames[:3]:  # the set_tensor path
        frame = frame.reshape(FRAME[1:]) if reshaped else frame
        ours.set_tensor(frame_index, frame)
        ours.invoke()
        y = ours.get_tensor(ours.get_output_details()[0]["index"])
        np.testing.assert_array_equal(y, _step(fresh, frame))


def test_int8_state_is_copied_as_stored():
    quant = ([0.05], [3], 0)
    init = np.arange(WINDOW * 4, dtype=np.int8).reshape(1, WINDOW, 4)
    data = streaming_model(dtype=np.int8, quant=quant, init=init)
    ours, ref = Interpreter(model_content=convert_tflite(data)), _reference(data)
    for frame in _frames(5, np.int8):
        np.testing.assert_array_equal(ours.run({"frame": frame})["joined"], _step(ref, frame))


def test_reset_all_variables_gives_a_fresh_interpreters_outputs():
    data = streaming_model(init=rand(1, WINDOW, 4, seed=3))
    ours = Interpreter(model_content=convert_tflite(data))
    for frame in _frames(4):
        ours.run({"frame": frame})
    ours.reset_all_variables()
    fresh = _reference(data)
    for frame in _frames(3):
        np.testing.assert_array_equal(ours.run({"frame": frame})["joined"], _step(fresh, frame))


def test_a_read_keeps_its_value_past_a_later_assignment():
    # old = read(v); assign(v, x); y = old + read(v): the first read is the value before
    # the assignment, the second the value after it.
    b = TfliteBuilder()
    init_graph, index = b.subgraph()
    hi = _handle(init_graph, "v")
    init_graph.op("ASSIGN_VARIABLE", [hi, init_graph.const("v0", rand(2, 3, seed=4))], [])
    x = b.input("x", [2, 3])
    b.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=index)
    h = _handle(b, "v")
    old = b.tensor("old", [2, 3])
    b.op("READ_VARIABLE", [h], [old])
    b.op("ASSIGN_VARIABLE", [h, x], [])
    new = b.tensor("new", [2, 3])
    b.op("READ_VARIABLE", [h], [new])
    y = b.output(b.tensor("y", [2, 3]))
    b.op("SUB", [old, new], [y], "SubOptions")
    data = b.build()
    ours, ref = Interpreter(model_content=convert_tflite(data)), _reference(data)
    for seed in range(3):
        frame = rand(2, 3, seed=10 + seed)
        np.testing.assert_allclose(ours.run({"x": frame})["y"], _step(ref, frame), rtol=1e-6)
    # The read before the assignment stays a copy; the one after it is a view of v.
    reads = [k for k in ours._plan.step_kernels if k.op is OpCode.READ_VARIABLE]
    assert len(reads) == 1


def test_a_read_no_write_follows_is_a_view_of_the_variable():
    ours = Interpreter(model_content=convert_tflite(streaming_model()))
    assert all(k.op is not OpCode.READ_VARIABLE for k in ours._plan.step_kernels)


def test_a_variable_read_before_any_assignment_is_refused():
    b = TfliteBuilder()
    x = b.input("x", [2])
    h = _handle(b, "v")
    v = b.tensor("v", [2])
    b.op("READ_VARIABLE", [h], [v])
    b.output(b.tensor("y", [2]))
    b.op("ADD", [x, v], [b.outputs[0]], "AddOptions")
    with pytest.raises(ConversionError, match="read before any assignment"):
        convert_tflite(b.build())


def test_bad_subgraph_references_and_custom_options_raise_conversion_errors():
    # A CALL_ONCE naming itself or a missing subgraph, and random corruption of a model
    # with two subgraphs and variables: ConversionError (InvalidTfliteError is one) only.
    b = TfliteBuilder()
    b.input("x", [1])
    b.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=0)
    with pytest.raises(ConversionError, match="InitSubgraphIndex 0"):
        convert_tflite(b.build())
    data = streaming_model()
    rng = np.random.default_rng(0)
    for _ in range(300):
        corrupted = bytearray(data)
        for at in rng.integers(8, len(data), rng.integers(1, 5)):
            corrupted[at] = rng.integers(0, 256)
        with contextlib.suppress(ConversionError):
            convert_tflite(bytes(corrupted))


# ----------------------------------------------------------------- real streaming models


def _wakeword_models() -> list:
    root = package_dir("pymicro_wakeword")
    if root is None:
        reason = "pymicro-wakeword is not installed (pip install --no-deps pymicro-wakeword)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return sorted((root / "models").glob("*.tflite"))


@pytest.mark.parametrize("path", _wakeword_models(), ids=lambda p: getattr(p, "name", "none"))
def test_streaming_keyword_spotters_match_litert_at_every_frame(path: Path):
    # microWakeWord's int8 models keep their streaming state in resource variables set by
    # CALL_ONCE; LiteRT's int8 kernels agree with TFLite's reference ones to one step.
    data = path.read_bytes()
    ours, ref = Interpreter(model_content=convert_tflite(data)), _reference(data)
    detail = ref.get_input_details()[0]
    name = next(iter(ours.signature.inputs))
    rng = np.random.default_rng(0)
    for _ in range(25):
        frame = rng.integers(-128, 128, detail["shape"]).astype(np.int8)
        got = next(iter(ours.run({name: frame}).values()))
        want = _step(ref, frame)
        assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1
