"""MixConv merging: Split -> [Slice] -> Transpose -> depthwise Conv2D per channel group
-> Concat (micro_wakeword's streaming blocks) becomes one depthwise convolution. int8
outputs stay identical to the unmerged graph's integer kernels, float ones match a
float64 reference; near misses keep their nodes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter.passes.mixconv import merge_mixconv
from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.graph import Model
from tests.unit.converter.test_passes import run

RNG = np.random.default_rng(26)
T, C = 9, 8
BIG = 2**31 - 1


def _block(
    kernels: tuple[int, ...] = (5, 9),
    *,
    int8: bool = False,
    strides: tuple[int, int] = (1, 1),
    other_out_quant: bool = False,
    concat_axis: int = 1,
) -> Model:
    """x (1, T, 1, C) split in channel groups; group i keeps its last kernels[i] frames
    (a Slice, unless that is all of them), moves to NCHW and runs a depthwise k_i x 1
    convolution; the groups' outputs are concatenated."""
    b = ModelBuilder()
    x = b.input("x", (1, T, 1, C), np.int8 if int8 else np.float32)
    if int8:
        b.quantize(x, 0.05, -128)
    sizes = [C // len(kernels)] * len(kernels)
    parts = b.op_multi(OpCode.SPLIT, [x], len(kernels), axis=3, split=sizes)
    outs = []
    for k, (part, size, kernel) in enumerate(zip(parts, sizes, kernels, strict=True)):
        if int8:
            b.quantize(part, 0.05, -128, dtype=np.int8)
        if kernel < T:
            part = b.op(
                OpCode.SLICE,
                [part],
                starts=[0, -kernel, 0, 0],
                ends=[BIG] * 4,
                axes=[0, 1, 2, 3],
                steps=[1, 1, 1, 1],
            )
            if int8:
                b.quantize(part, 0.05, -128, dtype=np.int8)
        nchw = b.op(OpCode.TRANSPOSE, [part], perm=[0, 3, 1, 2])
        if int8:
            b.quantize(nchw, 0.05, -128, dtype=np.int8)
        w_real = RNG.normal(size=(size, 1, kernel, 1))
        if int8:
            scales = np.abs(w_real).max(axis=(1, 2, 3)) / 127
            w = b.constant(f"w{k}", np.round(w_real / scales[:, None, None, None]).astype(np.int8))
            b.quantize(w, scales, 0)
            bias = b.constant(f"b{k}", RNG.integers(-500, 500, size).astype(np.int32))
            b.quantize(bias, 0.05 * scales, 0)
        else:
            w = b.constant(f"w{k}", w_real.astype(np.float32))
            bias = b.constant(f"b{k}", RNG.normal(size=size).astype(np.float32))
        y = b.op(
            OpCode.CONV2D, [nchw, w, bias], group=size, strides=list(strides), pads=[0, 0, 0, 0]
        )
        if int8:
            b.quantize(y, 0.02 * (2 if other_out_quant and k else 1), 3, dtype=np.int8)
        outs.append(y)
    y = b.op(OpCode.CONCAT, outs, axis=concat_axis)
    if int8:
        b.quantize(y, 0.02, 3, dtype=np.int8)
    b.output(y, name="y")
    return b.build()


def _reference(model: Model, x: np.ndarray, kernels: tuple[int, ...]) -> np.ndarray:
    """The float block in float64: group i's channels over its last k_i frames."""
    data = {t.name: t.data for t in model.tensors if t.data is not None}
    size = C // len(kernels)
    out = []
    for k, kernel in enumerate(kernels):
        window = x[0, T - kernel :, 0, k * size : (k + 1) * size].astype(np.float64)  # (k, c)
        w = data[f"w{k}"][:, 0, :, 0].astype(np.float64)  # (c, k)
        out.append((window.T * w).sum(axis=1) + data[f"b{k}"])
    return np.concatenate(out).reshape(1, C, 1, 1)


def _merged(model: Model) -> tuple[Model, int]:
    merged = copy.deepcopy(model)
    return merged, merge_mixconv(merged)


@pytest.mark.parametrize("kernels", [(5, 9), (3, 5, 7, 9)], ids=["two-groups", "four-groups"])
def test_a_float_block_becomes_one_depthwise_layer(kernels):
    model = _block(kernels)
    merged, count = _merged(model)
    assert count == 1
    assert [n.op for n in merged.graphs[0].nodes] == [OpCode.TRANSPOSE, OpCode.CONV2D]
    x = RNG.normal(size=(1, T, 1, C)).astype(np.float32)
    want = _reference(model, x, kernels)
    np.testing.assert_allclose(run(merged, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(model, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_an_int8_block_gives_the_same_integers():
    model = _block(int8=True)
    merged, count = _merged(model)
    assert count == 1
    (conv,) = [n for n in merged.graphs[0].nodes if n.op == OpCode.CONV2D]
    assert merged.tensors[conv.inputs[1]].quantization.scale.size == C  # type: ignore[union-attr]
    for seed in range(3):
        x = np.random.default_rng(seed).integers(-128, 128, (1, T, 1, C)).astype(np.int8)
        np.testing.assert_array_equal(run(merged, {"x": x})["y"], run(model, {"x": x})["y"])


NEAR_MISSES = {
    "stride-2": {"strides": (2, 1), "kernels": (3, 5)},
    "groups-requantized-by-the-concat": {"int8": True, "other_out_quant": True},
    "concatenated-along-rows": {"concat_axis": 2},
}


@pytest.mark.parametrize("kwargs", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_keep_their_nodes(kwargs):
    model = _block(**kwargs)
    merged, count = _merged(model)
    assert count == 0
    assert [n.op for n in merged.graphs[0].nodes] == [n.op for n in model.graphs[0].nodes]
