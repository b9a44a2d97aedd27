"""Pad and Resize against NumPy references and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from tests.unit.lite.onnx_reference import run_onnx_op

# ---------------------------------------------------------------------------------- Pad


def pad_reference(x, pads, mode, value=0.0):
    """np.pad after cropping negative pads (np.pad's 'symmetric' is not ONNX reflect)."""
    rank = x.ndim
    begin, end = pads[:rank], pads[rank:]
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0))
                 for a, (b, e) in enumerate(zip(begin, end, strict=True)))
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    if mode == "constant":
        return np.pad(x[crop], widths, mode="constant", constant_values=value)
    return np.pad(x[crop], widths, mode=mode)


PAD_CASES = [
    ((1, 2, 4, 5), [0, 0, 1, 2, 0, 0, 2, 1]),
    ((2, 3, 4), [1, 0, 2, 0, 2, 1]),
    ((3, 5), [2, 4, 2, 3]),
    ((1, 1, 4, 4), [0, 0, 0, 3, 0, 0, 3, 0]),
    ((1, 2, 5, 6), [0, 0, -1, 2, 0, 0, 1, -2]),   # crop and pad together
    ((6,), [0, 5]),
]


@pytest.mark.parametrize("shape,pads", PAD_CASES, ids=str)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_matches_reference_and_onnxruntime(shape, pads, mode):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    extra = dict(value=1.5) if mode == "constant" else {}
    (ours,) = run_op(OpCode.PAD, [x], pads=pads, mode=mode, **extra)
    np.testing.assert_array_equal(ours, pad_reference(x, pads, mode, 1.5))
    inputs = [x, np.array(pads, np.int64)]
    if mode == "constant":
        inputs.append(np.array(1.5, np.float32))
    # wrap arrived in opset 19.
    (ort,) = run_onnx_op("Pad", inputs, initializers=range(1, len(inputs)), mode=mode,
                         opset=19)
    np.testing.assert_array_equal(ours, ort)


def test_pad_from_constant_inputs_with_axes():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    pads, axes = np.array([1, 2, 0, 3], np.int64), np.array([-1, 1], np.int64)
    (ours,) = run_op(OpCode.PAD, [x, pads, np.array(-1.0, np.float32), axes])
    ref = np.pad(x, [(0, 0), (2, 3), (1, 0)], constant_values=-1.0)
    np.testing.assert_array_equal(ours, ref)
    (ort,) = run_onnx_op("Pad", [x, pads, np.array(-1.0, np.float32), axes],
                         initializers=[1, 2, 3], opset=18)
    np.testing.assert_array_equal(ours, ort)


def test_pad_rewrites_borders_each_call():
    """The planner may reuse the output buffer for other tensors between calls."""
    from sporenet.lite.kernels.base import Attrs, TensorSpec
    from sporenet.lite.kernels.pad import Pad

    x = np.ones((2, 3), np.float32)
    kernel = Pad(Attrs("PAD", dict(pads=[1, 1, 1, 1], value=7.0)), [TensorSpec(x.shape, x.dtype)])
    out = np.empty((4, 5), np.float32)
    step = kernel.bind([x], [out])
    for _ in range(2):
        out[...] = np.nan
        step()
        np.testing.assert_array_equal(out, np.pad(x, 1, constant_values=7.0))


@pytest.mark.parametrize("shape,attrs,message", [
    ((2, 3), dict(pads=[1, 1, 1]), "pads must hold 2 values per padded axis"),
    ((2, 3), dict(), "needs a `pads` attribute"),
    ((2, 3), dict(pads=[0, 3, 0, 0], mode="reflect"), "must be smaller than its size"),
    ((2, 3), dict(pads=[0, 0, 0, 0], mode="symmetric"), "mode must be one of"),
    ((2, 3), dict(pads=[0, -2, 0, -2]), "below zero elements"),
    ((2, 3), dict(pads=[1, 1], axes=[3]), "must be distinct axes"),
])
def test_pad_errors(shape, attrs, message):
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.PAD, [np.zeros(shape, np.float32)], **attrs)
