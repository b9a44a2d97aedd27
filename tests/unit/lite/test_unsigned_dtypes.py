"""uint16/32/64 tensors: stored in a model file, read back, cast to and computed with."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize
from sporenet.lite.eager import run_op


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_model_round_trips_and_runs(dtype):
    top = np.iinfo(dtype).max
    b = ModelBuilder()
    x = b.input("x", (3,), dtype)
    bias = b.constant("bias", np.array([1, 2, top - 7], dtype), dtype)
    b.output(b.op(OpCode.ADD, [x, bias]), "y")
    model = parse(serialize(b.build()))
    assert model.tensors[bias].data.dtype == dtype
    assert model.tensors[bias].data.tolist() == [1, 2, top - 7]
    xv = np.array([5, top - 2, 7], dtype)
    y = Interpreter(model_content=serialize(model)).run({"x": xv})["y"]
    assert y.dtype == dtype and y.tolist() == [6, top, top]


@pytest.mark.parametrize(("to", "dtype"), [(4, np.uint16), (12, np.uint32), (13, np.uint64)])
def test_cast_to_unsigned_onnx_codes(to, dtype):
    (ours,) = run_op(OpCode.CAST, [np.array([0.0, 3.9, 65535.0], np.float32)], to=to)
    assert ours.dtype == dtype and ours.tolist() == [0, 3, 65535]
