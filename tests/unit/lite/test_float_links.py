"""Folded layers linked by float64 columns (lite/float_links.py): a streaming depthwise
step then a pointwise one give the integers of the two layers run one by one."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import parse, serialize
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.ops import OpCode
from tests.unit.lite.quantized_reference import RANGES, quant, random_q
from tests.unit.lite.test_quantized_core import conv_reference


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_depthwise_then_pointwise_at_one_position_match_the_layers_one_by_one(dtype):
    rng = np.random.default_rng(41)
    lo, hi = RANGES[np.dtype(dtype)]
    c, o, t = 24, 16, 7
    wd = rng.integers(-127, 128, (c, 1, t, 1)).astype(np.int8)
    wp = rng.integers(-127, 128, (o, c, 1, 1)).astype(np.int8)
    sd, sp = rng.uniform(0.001, 0.01, c), rng.uniform(0.001, 0.01, o)
    bd, bp = (rng.integers(-3000, 3000, n).astype(np.int32) for n in (c, o))
    zx, zm, zo = (int(rng.integers(lo, hi)) for _ in range(3))
    b = ModelBuilder()
    x = b.quantize(b.input("x", (1, c, t, 1), dtype), 0.02, zx)
    dw = b.op(
        OpCode.CONV2D,
        [x, b.constant("wd", wd, quantization=quant(sd)), b.constant("bd", bd)],
        group=c,
    )
    mid = b.quantize(dw, 0.03, zm, dtype=dtype)  # no activation: negative ties reach it
    pw = b.op(
        OpCode.CONV2D,
        [mid, b.constant("wp", wp, quantization=quant(sp)), b.constant("bp", bp)],
        activation="relu",
    )
    b.output(b.quantize(pw, 0.05, zo, dtype=dtype), "y")
    it = Interpreter(model=parse(serialize(b.build())))
    assert it._plan.step_kernels[0].float_output is not None  # the two layers are linked
    nothing = (0, 0, 0, 0)
    for seed in range(20):
        xq = random_q(np.random.default_rng(seed), (1, c, t, 1), dtype)
        m = conv_reference(xq, zx, 0.02, wd, sd, bd, 0.03, zm, lo, hi, nothing, (1, 1), c)
        want = conv_reference(
            m, zm, 0.03, wp, sp, bp, 0.05, zo, max(lo, zo), hi, nothing, (1, 1), 1
        )
        np.testing.assert_array_equal(it.run({"x": xq})["y"], want)
