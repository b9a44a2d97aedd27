"""Dead-tap pruning: convolution taps that only read zero padding are cut; the pruned
graph computes what a float64 reference convolution computes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes.dead_taps import prune_dead_taps
from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.kernels.dead_taps import live_taps

RNG = np.random.default_rng(11)


def _reference(x, w, b, strides, dilations, pads):
    """Direct convolution in float64 (N, C, H, W) * (O, C, kh, kw), zero padding."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    kh, kw = w.shape[2:]
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow)) + b[None, :, None, None]
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilations[0], j * dilations[1]
            patch = xp[
                :, :, r0 : r0 + strides[0] * oh : strides[0], c0 : c0 + strides[1] * ow : strides[1]
            ]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def _model(x_shape, kernel, strides, dilations, pads, *, shared=False):
    b = ModelBuilder()
    x = b.input("x", x_shape)
    w_value = RNG.normal(size=(6, x_shape[1], *kernel)).astype(np.float32)
    b_value = RNG.normal(size=6).astype(np.float32)
    w = b.constant("w", w_value)
    bias = b.constant("b", b_value)
    attrs = {"strides": list(strides), "dilations": list(dilations), "pads": list(pads)}
    b.output(b.op(OpCode.CONV2D, [x, w, bias], **attrs), name="y")
    if shared:  # a second convolution reads the same weights, undilated and unpadded
        b.output(b.op(OpCode.CONV2D, [x, w, bias]), name="z")
    return b.build(), w_value, b_value


CASES = [
    # (x shape, kernel, strides, dilations, pads, kept kernel)
    ((2, 4, 1, 25), (1, 5), (1, 1), (1, 64), (0, 128, 0, 128), (1, 1)),  # only the centre
    ((2, 4, 1, 25), (1, 5), (1, 1), (1, 16), (0, 32, 0, 32), (1, 3)),  # the outer pair
    ((1, 3, 7, 9), (3, 5), (1, 2), (4, 6), (4, 12, 4, 12), (3, 3)),  # W only, a stride
    ((1, 3, 6, 6), (3, 3), (1, 1), (6, 1), (6, 1, 6, 1), (1, 3)),  # asymmetric in effect
]


@pytest.mark.parametrize("x_shape,kernel,strides,dilations,pads,kept", CASES)
def test_dead_taps_are_cut_and_the_outputs_stay(x_shape, kernel, strides, dilations, pads, kept):
    model, w, b = _model(x_shape, kernel, strides, dilations, pads)
    x = RNG.normal(size=x_shape).astype(np.float32)
    want = _reference(x, w, b, strides, dilations, pads)
    pruned = copy.deepcopy(model)
    assert prune_dead_taps(pruned) == 1
    (conv,) = pruned.graphs[0].nodes
    assert pruned.tensors[conv.inputs[1]].shape[2:] == kept
    got = Interpreter(model=pruned, num_threads=1).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_shared_weights_get_a_pruned_copy():
    model, w, b = _model((2, 4, 1, 25), (1, 5), (1, 1), (1, 64), (0, 128, 0, 128), shared=True)
    x = RNG.normal(size=(2, 4, 1, 25)).astype(np.float32)
    assert prune_dead_taps(model) == 1
    first, second = model.graphs[0].nodes
    assert model.tensors[first.inputs[1]].shape == (6, 4, 1, 1)
    assert model.tensors[second.inputs[1]].shape == (6, 4, 1, 5)  # still read whole
    got = Interpreter(model=model, num_threads=1).run({"x": x})["y"]
    np.testing.assert_allclose(
        got, _reference(x, w, b, (1, 1), (1, 64), (0, 128, 0, 128)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "x_shape,kernel,dilations,pads",
    [
        ((1, 4, 1, 25), (1, 5), (1, 2), (0, 4, 0, 4)),  # every tap reads the input
        ((1, 4, 1, 3), (1, 3), (1, 1), (0, 0, 0, 0)),  # no padding at all
    ],
)
def test_convolutions_without_dead_taps_stay(x_shape, kernel, dilations, pads):
    model, _, _ = _model(x_shape, kernel, (1, 1), dilations, pads)
    assert prune_dead_taps(model) == 0


def test_trainable_weights_stay():
    model, _, _ = _model((2, 4, 1, 25), (1, 5), (1, 1), (1, 64), (0, 128, 0, 128))
    for t in model.tensors:
        if t.name == "w":
            t.trainable = True
    assert prune_dead_taps(model) == 0


@pytest.mark.parametrize(
    "size,taps,stride,dilation,begin,end",
    [
        (25, 5, 1, 64, 128, 128),
        (25, 5, 1, 16, 32, 32),
        (7, 3, 2, 4, 4, 4),
        (9, 4, 3, 3, 5, 2),
        (5, 3, 1, 1, 0, 0),
    ],
)
def test_live_taps_are_those_that_read_an_input_position(size, taps, stride, dilation, begin, end):
    outputs = (size + begin + end - dilation * (taps - 1) - 1) // stride + 1
    reads = [
        k
        for k in range(taps)
        if any(0 <= o * stride + k * dilation - begin < size for o in range(outputs))
    ]
    got = live_taps(size, taps, stride, dilation, begin, end)
    assert (got.start, got.stop) == (reads[0], reads[-1] + 1)


def test_a_dynamic_batch_still_prunes_and_a_dynamic_width_does_not():
    for shape, rewrites in (((-1, 4, 1, 25), 1), ((1, 4, 1, -1), 0)):
        model, _, _ = _model((2, 4, 1, 25), (1, 5), (1, 1), (1, 64), (0, 128, 0, 128))
        model.tensors[model.graphs[0].nodes[0].inputs[0]].shape = shape
        assert prune_dead_taps(model) == rewrites
