"""Valid inputs raise no NumPy RuntimeWarning: kernels built on exp saturate to inf (the
exact result their formulas need) instead of warning about overflow. Warnings are errors
inside these tests, as under `python -W error`."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.autodiff import append_gradients
from sporenet.lite.planner import plan

# Far beyond exp's float32 range (about +-88) on both sides.
EXTREME = np.array([-1000.0, -120.0, -89.0, -3.0, 0.0, 3.0, 89.0, 120.0, 1000.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_and_their_gradients_on_extreme_inputs(dtype):
    x_value = EXTREME.astype(dtype)
    b = ModelBuilder()
    x = b.constant("x", x_value, dtype, trainable=True)
    sig = b.op(OpCode.SIGMOID, [x])
    soft = b.op(OpCode.SOFTPLUS, [x])
    exp = b.op(OpCode.EXP, [b.op(OpCode.NEG, [b.op(OpCode.ABS, [x])])])
    fc = b.op(
        OpCode.FULLY_CONNECTED,
        [b.op(OpCode.RESHAPE, [x], shape=[-1, 1]), b.constant("w", np.ones((2, 1)), dtype)],
        activation="sigmoid",
    )
    target = b.constant("t", np.full(EXTREME.size, 0.5), dtype)
    bce = b.op(OpCode.BCE_WITH_LOGITS, [x, target])
    parts = [b.op(OpCode.REDUCE_SUM, [t], keepdims=0) for t in (sig, soft, exp, fc)]
    loss = b.op(
        OpCode.ADD,
        [bce, b.op(OpCode.ADD, [b.op(OpCode.ADD, parts[:2]), b.op(OpCode.ADD, parts[2:])])],
    )
    b.output(loss, "loss")
    b.output(b.op(OpCode.EXP, [x]), "exp")
    b.output(sig, "sigmoid")  # outputs keep their buffers (intermediates are reused)
    b.output(fc, "fc")
    model = b.build()
    grads = append_gradients(model, 0, loss, [x])
    model.graphs[0].outputs.append(grads[x])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = plan(model, "infer", variables={x: x_value.copy()})
        p.run()
        values = {i: np.array(p.arrays[i]) for i in (sig, fc, grads[x])}
    with np.errstate(over="ignore"):
        sigmoid = 1 / (1 + np.exp(-EXTREME))  # float64 reference
    # Values below the dtype's smallest normal number flush to 0.
    tiny = float(np.finfo(dtype).tiny)
    np.testing.assert_allclose(values[sig], sigmoid.astype(dtype), rtol=1e-6, atol=tiny)
    np.testing.assert_allclose(
        values[fc], np.repeat(sigmoid[:, None], 2, 1).astype(dtype), rtol=1e-6, atol=tiny
    )
    assert np.all(np.isfinite(values[grads[x]]))
