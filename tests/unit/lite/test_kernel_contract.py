"""The kernel contract: the hooks `Kernel` declares with their defaults, the one folding
rule (`fold`), and the int8 kernels' scratch taken from the plan's arena by lifetime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.eager import fold, prepare_kernel
from sporenet.lite.kernels import KERNELS, QUANTIZED_KERNELS, workspace
from sporenet.lite.kernels.base import Attrs, Kernel, TensorSpec
from sporenet.lite.kernels.quantized import conv as quantized_conv
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.ops import OpCode
from sporenet.lite.planner import _Arena, plan
from tests.unit.lite.quantized_reference import quant, random_q, run_one_op

RNG = np.random.default_rng(31)
F32 = np.dtype(np.float32)


def test_every_kernel_has_the_hooks_with_their_defaults():
    spec = TensorSpec((2, 3), F32, np.ones((2, 3), np.float32))
    kernel = prepare_kernel(OpCode.RELU, {}, [spec], 1)
    assert kernel.foldable and kernel.trip_count_planned
    assert kernel.quantized_weights == frozenset()
    assert kernel.constant_inputs == {} and kernel.scratch_layout == []
    assert tuple(kernel.subplans) == () and tuple(kernel.warm_steps) == ()
    for cls in {*KERNELS.values(), *QUANTIZED_KERNELS.values()}:
        assert isinstance(cls.foldable, bool) and isinstance(cls.quantized_weights, frozenset)


class _Stateful(Kernel):
    """A kernel declared the way kernels written before the contract are: `foldable` and
    `scratch_layout` set on the class or in __init__, nothing else."""

    op = OpCode.RELU
    foldable = False

    def __init__(self, attrs: Attrs, inputs: Any) -> None:
        super().__init__(attrs, inputs)
        self.output_specs = [TensorSpec(self.input(0).shape, F32)]

    def bind(self, inputs, outputs):  # type: ignore[no-untyped-def]
        return lambda: np.copyto(outputs[0], inputs[0])


class _OldQuantized(QuantizedKernel):
    """An int8 kernel listing its scratch as they did before it came from the arena."""

    op = OpCode.RELU

    def __init__(self, attrs: Attrs, inputs: Any) -> None:
        super().__init__(attrs, inputs)
        self.output_specs = [TensorSpec(self.input(0).shape, F32)]
        self.scratch_layout += [((2, 2), F32), ((3,), np.dtype(np.int32))]


def test_kernels_declared_the_old_way_keep_working():
    spec = TensorSpec((2,), F32, np.zeros(2, np.float32))
    stateful = _Stateful(Attrs("RELU", {}), [spec])
    assert fold(stateful) is None  # known inputs, but the kernel says it must run
    arrays = _OldQuantized(Attrs("RELU", {}), [spec]).scratch_arrays()
    assert [(a.shape, a.dtype) for a in arrays] == [((2, 2), F32), ((3,), np.int32)]


def test_fold_needs_known_inputs_or_outputs_known_from_shapes():
    x = TensorSpec((2, 3), F32)  # a graph input: no value
    assert fold(prepare_kernel(OpCode.RELU, {}, [x], 1)) is None
    (shape,) = fold(prepare_kernel(OpCode.SHAPE, {}, [x], 1))  # type: ignore[misc]
    np.testing.assert_array_equal(shape, [2, 3])
    known = TensorSpec((2,), F32, np.array([-1.0, 2.0], np.float32))
    (relu,) = fold(prepare_kernel(OpCode.RELU, {}, [known], 1))  # type: ignore[misc]
    np.testing.assert_array_equal(relu, [0.0, 2.0])


def _int8_layers() -> list[tuple[dict[str, Any], np.ndarray, np.ndarray, float]]:
    """(attributes, int8 weights, int32 bias, output scale) of three int8 convolutions
    that take scratch: im2col, depthwise channels-last, strided im2col."""
    layers = []
    for shape, attrs, out_scale in (
        ((16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, 0.2),
        ((16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}, 0.2),
        ((8, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 0.3),
    ):
        w = random_q(RNG, shape, np.int8)
        bias = RNG.integers(-500, 500, shape[0]).astype(np.int32)
        layers.append((attrs, w, bias, out_scale))
    return layers


def _int8_stack(layers: list, x_scale: float) -> ModelBuilder:
    b = ModelBuilder()
    y = b.quantize(b.input("x", (1, 8, 12, 12), np.int8), x_scale, 0)
    scale = x_scale
    for k, (attrs, w, bias, out_scale) in enumerate(layers):
        wq = b.constant(f"w{k}", w, quantization=quant(np.full(w.shape[0], 0.01), 0))
        bq = b.constant(f"b{k}", bias, quantization=quant(np.full(w.shape[0], scale * 0.01), 0))
        y = b.quantize(b.op(OpCode.CONV2D, [y, wq, bq], **attrs), out_scale, 1, dtype=np.int8)
        scale = out_scale
    b.output(y, "y")
    return b


@pytest.mark.parametrize("folded", [False, True])
def test_int8_scratch_lives_in_the_arena_and_stays_correct(monkeypatch, folded):
    # folded: every layer takes the folded route (its columns, results and mask, and the
    # row of ones each call rewrites, in the arena), else the GEMM and depthwise routes.
    monkeypatch.setattr(quantized_conv, "FOLD_BYTES", 1 << 30 if folded else -1)
    monkeypatch.setattr(quantized_conv, "FOLD_WEIGHT_BYTES", 1 << 30)
    layers = _int8_layers()
    per_node: list[int] = []  # bytes of temporaries each node's bind asked for
    taken: list[int] = []
    temporary, release = workspace.Workspace.temporary, workspace.Workspace.release

    def recording_temporary(self, shape, dtype):  # type: ignore[no-untyped-def]
        array = temporary(self, shape, dtype)
        taken.append(array.nbytes)
        return array

    def recording_release(self):  # type: ignore[no-untyped-def]
        per_node.append(sum(taken))
        taken.clear()
        return release(self)

    monkeypatch.setattr(workspace.Workspace, "temporary", recording_temporary)
    monkeypatch.setattr(workspace.Workspace, "release", recording_release)
    p = plan(_int8_stack(layers, 0.05).build())
    monkeypatch.undo()
    assert all((k.fold is not None) == folded for k in p.step_kernels)
    # The widest cut: one node's scratch beside its int8 input and output (16x12x12 bytes
    # each), plus alignment; a buffer per kernel would hold every node's at once.
    widest = max(per_node) + 2 * 16 * 144 + 64 * 16
    assert len([n for n in per_node if n]) == 3
    assert p.arena_bytes <= widest < sum(per_node)
    # Layers run one by one in their own plans give the same bits: the shared bytes leave
    # nothing stale from one layer, or one call, to the next.
    for seed in range(2):
        x = np.random.default_rng(seed).integers(-128, 128, (1, 8, 12, 12)).astype(np.int8)
        p.arrays[p.inputs[0]][...] = x
        p.run()
        expected, scale, zero_point = x, 0.05, 0
        for attrs, w, bias, out_scale in layers:
            inputs = [
                (expected, quant(scale, zero_point), False),
                (w, quant(np.full(w.shape[0], 0.01), 0), True),
                (bias, quant(np.full(w.shape[0], scale * 0.01), 0), True),
            ]
            expected = run_one_op(OpCode.CONV2D, inputs, quant(out_scale, 1), np.int8, **attrs)
            scale, zero_point = out_scale, 1
        np.testing.assert_array_equal(p.arrays[p.outputs[0]], expected)


def test_temporary_like_keeps_a_channels_last_layout():
    arena = _Arena(1 << 16)
    nhwc = np.empty((2, 5, 6, 3), np.float32).transpose(0, 3, 1, 2)
    with workspace.active(workspace.Workspace(arena.take)):
        tmp = workspace.temporary_like(nhwc)
    assert tmp.shape == nhwc.shape and tmp.strides == nhwc.strides
    assert np.shares_memory(tmp, arena.chunks[0])
