"""Conv2D drops the dead taps of constant weights (those reading only zero padding at the
planned input size, lite/kernels/dead_taps.py) and still matches a float64 reference;
run-time and trainable weights keep every tap."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, conv_reference

rng = np.random.default_rng(31)


def planned(x_shape, w, attrs, *, constant=True) -> Conv2D:
    """The Conv2D kernel for input shape `x_shape` and weights `w` (a constant or not)."""
    specs = [
        TensorSpec(x_shape, np.dtype(np.float32)),
        TensorSpec(w.shape, w.dtype, w if constant else None),
    ]
    return Conv2D(Attrs("CONV2D", attrs), specs)


def run(kernel: Conv2D, x, w, b=None) -> np.ndarray:
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    inputs = [x, w] if b is None else [x, w, b]
    step = kernel.bind(inputs, [out])
    step()
    return out


# (x shape, (out channels, kernel), group, dilations, pads, strides, trimmed kernel)
DEAD = [
    ((1, 4, 1, 25), (6, (1, 5)), 1, (1, 16), (0, 32, 0, 32), (1, 1), (1, 3)),  # TCN block
    ((1, 4, 1, 25), (6, (1, 3)), 1, (1, 32), (0, 32, 0, 32), (1, 1), (1, 1)),  # 1x1 left
    ((2, 3, 6, 5), (4, (3, 3)), 1, (6, 4), (6, 4, 6, 4), (1, 1), (1, 3)),  # both axes
    ((1, 6, 3, 9), (6, (3, 3)), 3, (3, 4), (3, 4, 3, 4), (1, 1), (1, 3)),  # grouped
    ((1, 5, 4, 7), (5, (3, 5)), 5, (4, 3), (4, 6, 4, 6), (1, 1), (1, 5)),  # depthwise
    ((1, 5, 2, 7), (5, (3, 3)), 5, (2, 5), (2, 5, 2, 5), (1, 1), (1, 3)),  # depthwise
    ((1, 4, 3, 11), (3, (1, 7)), 1, (1, 3), (0, 9, 0, 3), (1, 2), (1, 5)),  # uneven, strided
    ((1, 2, 1, 6), (3, (1, 5)), 1, (1, 2), (0, 8, 0, 0), (1, 1), (1, 3)),  # one side only
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", DEAD, ids=lambda c: f"x{c[0]}k{c[1][1]}g{c[2]}d{c[3]}p{c[4]}")
def test_dead_taps_are_cut_and_outputs_stay(case, bias):
    x_shape, (o, k), group, dilations, pads, strides, trimmed = case
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=(o, x_shape[1] // group, *k)).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32) if bias else None
    attrs = dict(group=group, dilations=dilations, pads=pads, strides=strides)
    kernel = planned(x_shape, w, attrs)
    assert kernel.win.kernel == trimmed
    ref = conv_reference(x, w, b, strides, dilations, pads, group)
    assert kernel.output_specs[0].shape == ref.shape
    np.testing.assert_allclose(run(kernel, x, w, b), ref, rtol=RTOL, atol=ATOL)


# Windows whose every tap reads the input for some output (or an axis that would need a
# crop, or has no live tap at all): nothing is cut.
LIVE = [
    ((1, 3, 8, 8), (4, (3, 3)), 1, (2, 2), (2, 2, 2, 2)),
    ((1, 4, 1, 25), (4, (1, 5)), 4, (1, 4), (0, 8, 0, 8)),
    ((1, 2, 1, 2), (3, (1, 2)), 1, (1, 2), (0, 0, 0, 1)),  # cutting would crop
    ((1, 2, 1, 2), (3, (1, 3)), 1, (1, 5), (0, 10, 0, 10)),  # no live tap: bias alone
]


@pytest.mark.parametrize("case", LIVE, ids=lambda c: f"x{c[0]}k{c[1][1]}d{c[3]}p{c[4]}")
def test_windows_without_dead_taps_are_kept(case):
    x_shape, (o, k), group, dilations, pads = case
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=(o, x_shape[1] // group, *k)).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32)
    kernel = planned(x_shape, w, dict(group=group, dilations=dilations, pads=pads))
    assert kernel.win.kernel == k and kernel.taps is None
    ref = conv_reference(x, w, b, (1, 1), dilations, pads, group)
    np.testing.assert_allclose(run(kernel, x, w, b), ref, rtol=RTOL, atol=ATOL)


def test_runtime_non_finite_and_auto_pad_weights_keep_every_tap():
    x_shape, attrs = (1, 4, 1, 25), dict(dilations=(1, 16), pads=(0, 32, 0, 32))
    w = rng.normal(size=(6, 4, 1, 5)).astype(np.float32)
    assert planned(x_shape, w, attrs).win.kernel == (1, 3)
    assert planned(x_shape, w, attrs, constant=False).win.kernel == (1, 5)
    w_inf = w.copy()
    w_inf[0, 0, 0, 0] = np.inf  # a dead tap times padding: inf * 0 is NaN, kept as such
    kernel = planned(x_shape, w_inf, attrs)
    assert kernel.win.kernel == (1, 5)
    x = rng.normal(size=x_shape).astype(np.float32)
    with np.errstate(invalid="ignore"):
        assert np.isnan(run(kernel, x, w_inf)[0, 0]).all()
    same = planned(x_shape, w, dict(dilations=(1, 16), auto_pad="SAME_UPPER"))
    assert same.win.kernel == (1, 5)


def test_bind_slices_once_and_later_calls_read_new_inputs():
    x_shape, attrs = (1, 4, 1, 25), dict(dilations=(1, 16), pads=(0, 32, 0, 32))
    w = rng.normal(size=(6, 4, 1, 5)).astype(np.float32)
    kernel = planned(x_shape, w, attrs)
    assert kernel.win.kernel == (1, 3)
    x = np.empty(x_shape, np.float32)
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    step = kernel.bind([x, w], [out])
    for _ in range(3):
        x[...] = rng.normal(size=x_shape)
        step()
        ref = conv_reference(x, w, None, (1, 1), (1, 16), (0, 32, 0, 32))
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


def tcn(draw: np.random.Generator):
    """A dilated 1-D convolution over 25 steps whose outer taps read only padding."""
    b = ModelBuilder()
    x = b.input("x", (-1, 4, 1, 25))
    w = b.constant("c.weight", draw.normal(size=(3, 4, 1, 5)), np.float32)
    h = b.op(OpCode.CONV2D, [x, w], dilations=[1, 16], pads=[0, 32, 0, 32])
    flat = b.op(OpCode.RESHAPE, [h], shape=[-1, 3 * 25])
    w2 = b.constant("fc.weight", draw.normal(size=(2, 3 * 25)) * 0.2, np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [flat, w2]), "logits")
    return b.build()


def test_trainable_weights_keep_every_tap_and_train():
    model = make_training_model(
        tcn(rng), output="logits", loss="softmax_cross_entropy", optimizer=OptimizerConfig()
    )
    trainer = Trainer(model, num_threads=1)
    x = rng.normal(size=(2, 4, 1, 25)).astype(np.float32)
    labels = np.array([0, 1], np.int32)
    for _ in range(3):
        trainer.step({"x": x, "labels": labels}, lr=0.5)
    logits = trainer.evaluate({"x": x})["logits"]
    weights = trainer.weights()
    h = conv_reference(x, weights["c.weight"], None, (1, 1), (1, 16), (0, 32, 0, 32))
    ref = h.reshape(2, -1) @ weights["fc.weight"].astype(np.float64).T
    np.testing.assert_allclose(logits, ref, rtol=RTOL, atol=ATOL)
    runners = [trainer._train, trainer._infer]
    convs = [
        k for r in runners for p in r._plans.values() for k in p.kernels if isinstance(k, Conv2D)
    ]
    assert convs and all(k.taps is None and k.win.kernel == (1, 5) for k in convs)
