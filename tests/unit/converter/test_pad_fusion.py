"""Pad fusion: a zero PAD of H and W that only convolutions read becomes their padding;
the fused graph computes what the unfused one does."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes import fuse_pads
from sporenet.lite import Interpreter, ModelBuilder, OpCode

RNG = np.random.default_rng(7)
X = RNG.normal(size=(1, 8, 9, 9)).astype(np.float32)


def _model(
    pads, *, group=8, strides=(2, 2), conv_pads=(0, 0, 0, 0), value=0.0, reader=None, c_in=8
):
    """x -> PAD(pads, value) -> CONV2D(3x3, group, strides, conv_pads) [and `reader`];
    `c_in`: the channels of the padded tensor."""
    b = ModelBuilder()
    x = b.input("x", X.shape)
    padded = b.op(OpCode.PAD, [x], pads=list(pads), mode="constant", value=value)
    w = b.constant("w", RNG.normal(size=(8, c_in // group, 3, 3)).astype(np.float32))
    bias = b.constant("b", RNG.normal(size=8).astype(np.float32))
    y = b.op(
        OpCode.CONV2D,
        [padded, w, bias],
        group=group,
        strides=list(strides),
        pads=list(conv_pads),
        activation="relu",
    )
    b.output(y, name="y")
    if reader is not None:
        b.output(b.op(reader, [padded, padded]), name="z")
    return b.build()


def _run(model):
    return Interpreter(model=model, num_threads=1).run({"x": X})


@pytest.mark.parametrize(
    "pads,group,strides,conv_pads",
    [
        ([0, 0, 0, 0, 0, 0, 1, 1], 8, (2, 2), (0, 0, 0, 0)),  # Keras's stride-2 "same"
        ([0, 0, 1, 0, 0, 0, 1, 1], 8, (2, 2), (0, 0, 0, 0)),  # asymmetric
        ([0, 0, 2, 2, 0, 0, 2, 2], 8, (1, 1), (1, 0, 0, 1)),  # added to the conv's own pads
        ([0, 0, 1, 1, 0, 0, 1, 1], 1, (1, 1), (0, 0, 0, 0)),  # an ungrouped convolution
    ],
)
def test_zero_spatial_pad_folds_into_the_convolution(pads, group, strides, conv_pads):
    model = _model(pads, group=group, strides=strides, conv_pads=conv_pads)
    want = _run(model)["y"]
    fused = copy.deepcopy(model)
    assert fuse_pads(fused) == 1
    (conv,) = fused.graphs[0].nodes
    assert conv.op == OpCode.CONV2D
    expected = [conv_pads[0] + pads[2], conv_pads[1] + pads[3]]
    assert conv.attrs["pads"] == [*expected, conv_pads[2] + pads[6], conv_pads[3] + pads[7]]
    np.testing.assert_allclose(_run(fused)["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "pads,value,reader",
    [
        ([0, 0, 0, 0, 0, 0, 1, 1], 1.5, None),  # not zeros
        ([0, 1, 0, 0, 0, 1, 1, 1], 0.0, None),  # pads the channels
        ([0, 0, 0, 0, 0, 0, 1, 1], 0.0, OpCode.ADD),  # another op reads the padded tensor
    ],
    ids=["nonzero", "channels", "other-reader"],
)
def test_pads_the_convolution_cannot_take_stay(pads, value, reader):
    c_in = 8 + pads[1] + pads[5]
    group = 8 if c_in == 8 else 1
    model = _model(pads, group=group, value=value, reader=reader, c_in=c_in)
    assert fuse_pads(model) == 0
    assert OpCode.PAD in [n.op for n in model.graphs[0].nodes]
