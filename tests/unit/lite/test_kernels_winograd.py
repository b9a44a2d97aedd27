"""Winograd3x3 (lite/kernels/winograd.py) against the float64 direct convolution and
onnxruntime.

Run as a script for per-layer timings against Conv2D's im2col path (not a timed test):

    OPENBLAS_NUM_THREADS=1 python -m tests.unit.lite.test_kernels_winograd
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.winograd import TILE_SIZES, Winograd3x3, transform_weights
from tests.unit.lite.test_kernels_conv import conv_reference

# Error is measured relative to the output's largest magnitude: with C up to 64 the
# outputs reach ~50 and elementwise tolerances would be set by the near-zero entries.
# F(2x2, 3x3) measures <= 1e-6 here and F(4x4, 3x3) <= 1e-5 (its transforms hold
# 4, 5 and 1/6, so float32 rounding grows); both are far below any indexing mistake.
MAX_REL_ERROR = 1e-4


def _rel_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def _run(x, w, b, pads, activation="none", m=2):
    act = fused_activation("CONV2D", {"activation": activation})
    kernel = Winograd3x3(w, b, x.shape, pads, act, m=m)
    out = np.full(kernel.out_shape, np.nan, x.dtype)  # NaN shows any unwritten output
    kernel.bind(x, out)()
    return out


def _data(rng, n, c, h, w, o, bias=True):
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(o, c, 3, 3)).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32) if bias else None
    return x, wt, b


# (N, C, H, W, O, pads)
CASES = [
    (1, 1, 3, 3, 1, (0, 0, 0, 0)),       # a single output, single channels
    (1, 3, 8, 8, 4, (1, 1, 1, 1)),       # same padding, even output
    (3, 5, 7, 9, 6, (1, 1, 1, 1)),       # N=3, odd H, odd W
    (1, 4, 9, 6, 7, (0, 0, 0, 0)),       # no padding, odd output rows
    (3, 6, 10, 11, 2, (2, 0, 1, 1)),     # asymmetric pads
    (1, 16, 13, 5, 1, (0, 1, 2, 0)),     # asymmetric, O=1
    (1, 64, 14, 14, 64, (1, 1, 1, 1)),   # ResNet-style block
    (3, 64, 7, 7, 32, (1, 1, 1, 1)),     # N=3, odd, the deep-layer shape class
    (1, 1, 12, 12, 64, (1, 1, 1, 1)),    # C=1, wide O
]


@pytest.mark.parametrize("m", TILE_SIZES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_winograd_matches_direct_convolution(case, m):
    n, c, h, w, o, pads = case
    x, wt, b = _data(np.random.default_rng(0), n, c, h, w, o)
    ours = _run(x, wt, b, pads, m=m)
    assert _rel_error(ours, conv_reference(x, wt, b, pads=pads)) <= MAX_REL_ERROR


@pytest.mark.parametrize("case", CASES[1:7], ids=str)
def test_winograd_matches_onnxruntime(case):
    from tests.unit.lite.onnx_reference import run_onnx_op

    n, c, h, w, o, pads = case
    x, wt, b = _data(np.random.default_rng(1), n, c, h, w, o)
    (ort,) = run_onnx_op("Conv", [x, wt, b], initializers=[1, 2], pads=list(pads))
    assert _rel_error(_run(x, wt, b, pads), ort) <= MAX_REL_ERROR


@pytest.mark.parametrize("activation,fn", [
    ("none", lambda y: y),
    ("relu", lambda y: np.maximum(y, 0)),
    ("relu6", lambda y: np.clip(y, 0, 6)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_bias_and_activation(activation, fn, bias):
    x, wt, b = _data(np.random.default_rng(2), 2, 8, 9, 10, 12, bias)
    ref = fn(conv_reference(x, wt, b, pads=(1, 1, 1, 1)))
    assert _rel_error(_run(x, wt, b, (1, 1, 1, 1), activation), ref) <= MAX_REL_ERROR


def test_winograd_bound_closure_recomputes_with_new_inputs():
    """The zero border of the padded scratch survives calls; the closure reads x anew."""
    rng = np.random.default_rng(3)
    x, wt, b = _data(rng, 1, 8, 7, 7, 8)
    kernel = Winograd3x3(wt, b, x.shape, (1, 1, 1, 1))
    out = np.empty(kernel.out_shape, np.float32)
    step = kernel.bind(x, out)
    for _ in range(3):
        x[...] = rng.normal(size=x.shape) * 100
        step()
        ref = conv_reference(x, wt, b, pads=(1, 1, 1, 1))
        assert _rel_error(out, ref) <= MAX_REL_ERROR


def test_weight_transform_is_exact_on_a_delta_input():
    """U = G g G^T: with m=2 a filter that is 1 at its centre has U = (G e G^T)."""
    w = np.zeros((1, 1, 3, 3))
    w[0, 0, 1, 1] = 1
    u = transform_weights(w, 2).reshape(4, 4)
    g_mid = np.array([0, 0.5, -0.5, 0])
    np.testing.assert_allclose(u, np.outer(g_mid, g_mid))


@pytest.mark.parametrize("kwargs,message", [
    (dict(w_shape=(4, 3, 5, 5)), r"weights must be \(O, C, 3, 3\)"),
    (dict(x_shape=(1, 2, 8, 8)), r"input must be \(N, 3, H, W\)"),
    (dict(pads=(1, 1, 1)), "pads must be 4 non-negative"),
    (dict(pads=(1, -1, 1, 1)), "pads must be 4 non-negative"),
    (dict(x_shape=(1, 3, 2, 8)), "larger than the padded input"),
    (dict(bias=np.zeros(3, np.float32)), r"bias must have shape \[4\]"),
    (dict(m=3), "tile size m must be one of"),
])
def test_winograd_rejects_bad_configuration(kwargs, message):
    w = np.zeros(kwargs.pop("w_shape", (4, 3, 3, 3)), np.float32)
    x_shape = kwargs.pop("x_shape", (1, 3, 8, 8))
    pads = kwargs.pop("pads", (0, 0, 0, 0))
    bias = kwargs.pop("bias", None)
    with pytest.raises(ShapeError, match=message):
        Winograd3x3(w, bias, x_shape, pads, **kwargs)


def test_winograd_bind_rejects_other_shapes():
    w = np.zeros((4, 3, 3, 3), np.float32)
    kernel = Winograd3x3(w, None, (1, 3, 8, 8), (1, 1, 1, 1))
    with pytest.raises(ShapeError, match="prepared for input"):
        kernel.bind(np.zeros((2, 3, 8, 8), np.float32), np.zeros((2, 4, 8, 8), np.float32))


# ---- per-layer timings (a script, not a test)

# ResNet-18-style 3x3 stride-1 layers at a 1x3x112x112 input, plus the 56x56 stage that a
# 224x224 input gives: (C = O, H = W).
LAYERS = [(64, 56), (64, 28), (128, 14), (256, 7), (512, 4)]


def _median_ms(step, budget: float = 0.4, min_runs: int = 15) -> float:
    import time

    step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < budget:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def time_layers() -> None:
    """Median ms per layer: Conv2D's im2col path, Conv2D as it picks, Winograd m=2 and 4."""
    from sporenet.lite.kernels.base import Attrs, TensorSpec
    from sporenet.lite.kernels.conv import Conv2D

    rng = np.random.default_rng(0)
    print(f"{'layer':>14} {'im2col':>8} {'Conv2D':>16} {'F(2,3)':>8} {'F(4,3)':>8}")
    for c, hw in LAYERS:
        x, wt, b = _data(rng, 1, c, hw, hw, c)
        attrs = Attrs("CONV2D", {"pads": [1, 1, 1, 1], "activation": "relu"})
        specs = [TensorSpec(x.shape, x.dtype), TensorSpec(wt.shape, wt.dtype, wt),
                 TensorSpec(b.shape, b.dtype, b)]
        row = []
        for forced in ("im2col", None):
            conv = Conv2D(attrs, specs)
            if forced:
                conv.strategy = forced
            picked = conv.strategy
            out = np.empty(conv.output_specs[0].shape, np.float32)
            row.append(_median_ms(conv.bind([x, wt, b], [out])))
        ref = out.copy()
        for m in TILE_SIZES:
            kernel = Winograd3x3(wt, b, x.shape, (1, 1, 1, 1), fused_activation(
                "CONV2D", {"activation": "relu"}), m=m)
            out = np.empty(kernel.out_shape, np.float32)
            step = kernel.bind(x, out)
            row.append(_median_ms(step))
            assert _rel_error(out, ref) <= MAX_REL_ERROR
        print(f"{c:>4}x{hw:>3}x{hw:<3}   {row[0]:8.3f} {row[1]:8.3f} ({picked[:6]}) "
              f"{row[2]:8.3f} {row[3]:8.3f}")


if __name__ == "__main__":
    time_layers()
