"""Chains of 8-bit lookups (lite/lookup_chains.py): one composed step, the same integers
as the ops run one by one."""

from __future__ import annotations

import numpy as np

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import parse, serialize
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.ops import OpCode
from tests.unit.lite.quantized_reference import quant, run_one_op

X_Q, SIGMOID_Q, TANH_Q, OUT_Q = (
    quant(0.05, 3),
    quant(1 / 256, -128),
    quant(1 / 128, 0),
    quant(0.01, 7),
)


def _chain(*, tanh_is_output: bool = False) -> Interpreter:
    """x -> SIGMOID -> TANH -> REQUANTIZE to uint8, all int8 lookups."""
    b = ModelBuilder()
    x = b.input("x", (256,), np.int8)
    b.quantize(x, X_Q.scale, X_Q.zero_point)
    s = b.op(OpCode.SIGMOID, [x])
    b.quantize(s, SIGMOID_Q.scale, SIGMOID_Q.zero_point)
    t = b.op(OpCode.TANH, [s])
    b.quantize(t, TANH_Q.scale, TANH_Q.zero_point)
    y = b.op(OpCode.REQUANTIZE, [t], dtype="uint8")
    b.quantize(y, OUT_Q.scale, OUT_Q.zero_point, dtype=np.uint8)
    b.output(y, "y")
    if tanh_is_output:
        b.output(t, "t")
    return Interpreter(model=parse(serialize(b.build())))


def _one_by_one(x: np.ndarray) -> np.ndarray:
    s = run_one_op(OpCode.SIGMOID, [(x, X_Q, False)], SIGMOID_Q, np.int8)
    t = run_one_op(OpCode.TANH, [(s, SIGMOID_Q, False)], TANH_Q, np.int8)
    return run_one_op(OpCode.REQUANTIZE, [(t, TANH_Q, False)], OUT_Q, np.uint8, dtype="uint8")


def test_a_chain_of_lookups_is_one_step_with_the_same_results():
    x = np.arange(256).astype(np.uint8).view(np.int8)  # every input value
    interpreter = _chain()
    assert [k.op for k in interpreter._plan.step_kernels] == [OpCode.REQUANTIZE]
    np.testing.assert_array_equal(interpreter.run({"x": x})["y"], _one_by_one(x))


def test_a_lookup_whose_output_is_read_elsewhere_keeps_its_step():
    x = np.arange(256).astype(np.uint8).view(np.int8)
    interpreter = _chain(tanh_is_output=True)
    assert [k.op for k in interpreter._plan.step_kernels] == [OpCode.TANH, OpCode.REQUANTIZE]
    got = interpreter.run({"x": x})
    np.testing.assert_array_equal(got["y"], _one_by_one(x))
