"""Concatenation inputs computed straight into their slice of the output (planner._InPlace).

A tensor a step computes, whose storage no node reads after the concatenation, is stored
in its region of the output when that region is one contiguous block; the concatenation
then copies only the other inputs (none: it has no step). Results must be the eager
ops', run after run; the memory checks say which inputs were placed.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.eager import evaluate, run_op
from sporenet.lite.kernels.quantized.shape import QConcat
from sporenet.lite.kernels.transform import Concat

RNG = np.random.default_rng(11)


def _steps(interp: Interpreter, kind: type) -> int:
    return sum(isinstance(k, kind) for k in interp._plan.step_kernels)


def _shares(interp: Interpreter, a: int, b: int) -> bool:
    arrays = interp._plan.arrays
    return bool(np.shares_memory(arrays[a], arrays[b]))


def test_computed_inputs_need_no_copy():
    """Two computed inputs (one through a reshape view) fill the output: no Concat step;
    a nested concatenation places its own output in the outer one's slice."""
    b = ModelBuilder()
    x = b.input("x", (1, 6))
    c = b.constant("c", RNG.normal(size=(1, 6)).astype(np.float32))
    s = b.op(OpCode.MUL, [x, c])
    t = b.op(OpCode.TANH, [x])
    flat = b.op(OpCode.RESHAPE, [t, b.constant("shape", np.array([1, 6], np.int64))])
    inner = b.op(OpCode.CONCAT, [s, flat], axis=1)
    u = b.op(OpCode.SIGMOID, [x])
    outer = b.op(OpCode.CONCAT, [inner, u], axis=1)
    b.output(b.op(OpCode.RELU, [outer]), name="y")
    interp = Interpreter(model=b.build())
    assert _steps(interp, Concat) == 0
    assert _shares(interp, s, outer) and _shares(interp, t, outer) and _shares(interp, u, outer)
    for _ in range(3):
        xv = RNG.normal(size=(1, 6)).astype(np.float32)
        (want,) = run_op(OpCode.SIGMOID, [xv])
        expected = np.maximum(
            np.concatenate([xv * interp.model.tensors[c].data, np.tanh(xv), want], axis=1), 0
        )
        np.testing.assert_allclose(interp.run({"x": xv})["y"], expected, rtol=1e-6, atol=1e-7)


def test_inputs_that_cannot_be_placed_are_copied():
    """A graph input, a tensor read again after the concatenation, and a slice that is not
    one contiguous block (batch 2, axis 1) are copied; the rest is placed."""
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    a = b.op(OpCode.TANH, [x])
    later = b.op(OpCode.EXP, [x])
    joined = b.op(OpCode.CONCAT, [a, x, later], axis=1)
    b.output(
        b.op(OpCode.ADD, [b.op(OpCode.REDUCE_SUM, [joined], axes=[1], keepdims=1), later]), "y"
    )
    row = b.input("r", (1, 4))
    first = b.op(OpCode.NEG, [row])
    second = b.op(OpCode.ABS, [row])
    b.output(b.op(OpCode.RELU, [b.op(OpCode.CONCAT, [first, second], axis=0)]), "z")
    interp = Interpreter(model=b.build())
    assert not _shares(interp, a, joined) and not _shares(interp, later, joined)
    assert _steps(interp, Concat) == 1  # the (1, 4) rows stack in place along axis 0
    xv = RNG.normal(size=(2, 3)).astype(np.float32)
    rv = RNG.normal(size=(1, 4)).astype(np.float32)
    out = interp.run({"x": xv, "r": rv})
    expected = np.concatenate([np.tanh(xv), xv, np.exp(xv)], axis=1).sum(1, keepdims=True)
    np.testing.assert_allclose(out["y"], expected + np.exp(xv), rtol=1e-5)
    np.testing.assert_array_equal(out["z"], np.maximum(np.concatenate([-rv, abs(rv)]), 0))


def test_int8_inputs_with_the_output_parameters_are_placed():
    """An int8 concatenation places the inputs it copies as they are and requantizes the
    one whose parameters differ, with the results of the eager int8 kernels."""
    b = ModelBuilder()
    x = b.quantize(b.input("x", (1, 8), np.int8), 0.05, 3)
    same = b.quantize(b.op(OpCode.RELU, [x]), 0.05, 3, dtype=np.int8)
    other = b.quantize(b.op(OpCode.RELU, [x]), 0.1, -2, dtype=np.int8)
    joined = b.quantize(b.op(OpCode.CONCAT, [same, other], axis=1), 0.05, 3, dtype=np.int8)
    b.output(b.quantize(b.op(OpCode.RELU, [joined]), 0.05, 3, dtype=np.int8), "y")
    interp = Interpreter(model=b.build())
    assert _steps(interp, QConcat) == 1
    assert _shares(interp, same, joined) and not _shares(interp, other, joined)
    for _ in range(3):
        xv = RNG.integers(-128, 128, size=(1, 8)).astype(np.int8)
        np.testing.assert_array_equal(interp.run({"x": xv})["y"], _eager(interp, xv))


def _eager(interp: Interpreter, xv: np.ndarray) -> np.ndarray:
    """The plan's graph node by node through its kernels on fresh arrays (nothing placed)."""
    graph = interp.model.graphs[0]
    values = {graph.inputs[0]: xv}
    for node, kernel in zip(graph.nodes, interp._plan.kernels, strict=True):
        outs = evaluate(kernel, [values[i] for i in node.inputs])
        values.update(zip(node.outputs, outs, strict=False))
    return values[graph.outputs[0]]
