"""Transpose sinking (passes/transpose_sinking.py), affine chains as BatchNorms
(passes/affine_chains.py) and same-dtype Cast removal: tf2onnx's
NHWC islands between NCHW convolutions cancel out, and the rewritten graphs compute what
the originals do (run for real, dynamic batch included)."""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes import (
    fold_affine_chains,
    optimize,
    remove_identities,
    sink_transposes,
)
from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.graph import Model
from tests.unit.converter.test_passes import check_rewrite, ops, rand, run

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _nhwc_island(b: ModelBuilder, x: int, channels: int, *, const_first: bool = False) -> int:
    """Conv -> Transpose -> Cast -> Add(c) -> Sub(c) -> Mul(c) -> Relu, as tf2onnx writes
    a Keras convolution with its bias, batch norm and activation; returns the NHWC output."""
    w = b.constant(f"w{x}", rand(channels, 3, 3, 3) if channels else rand(4, 3, 3, 3))
    y = b.op(OpCode.CONV2D, [x, w], pads=[1, 1, 1, 1])
    y = b.op(OpCode.TRANSPOSE, [y], perm=TO_NHWC)
    y = b.op(OpCode.CAST, [y], to=1)
    y = b.op(OpCode.ADD, [y, b.constant(f"bias{x}", rand(1, 1, 1, 4))])
    c = b.constant(f"mean{x}", rand(4))
    y = b.op(OpCode.SUB, [c, y] if const_first else [y, c])
    y = b.op(OpCode.MUL, [y, b.constant(f"scale{x}", np.float32(0.5))])
    return b.op(OpCode.RELU, [y])


def _both(model: Model) -> int:
    return remove_identities(model) + sink_transposes(model)


def test_an_nhwc_island_between_convolutions_loses_its_transposes() -> None:
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 8, 8))
    y = b.op(OpCode.TRANSPOSE, [_nhwc_island(b, x, 4, const_first=True)], perm=TO_NCHW)
    w = b.constant("w2", rand(2, 4, 1, 1))
    b.output(b.op(OpCode.CONV2D, [y, w]), name="y")
    model = b.build()
    for batch in (1, 3):
        rewritten = check_rewrite(model, _both, {"x": rand(batch, 3, 8, 8)})
    assert ops(rewritten) == ["CONV2D", "ADD", "SUB", "MUL", "RELU", "CONV2D"]


def test_a_residual_add_of_two_transposed_branches_sinks_as_one() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 8, 8))
    total = b.op(OpCode.ADD, [_nhwc_island(b, x, 4), _nhwc_island(b, x, 4)])
    out = b.op(OpCode.TRANSPOSE, [b.op(OpCode.RELU, [total])], perm=TO_NCHW)
    b.output(out, name="y")
    rewritten = check_rewrite(b.build(), _both, {"x": rand(2, 3, 8, 8)})
    assert "TRANSPOSE" not in ops(rewritten) and "CAST" not in ops(rewritten)


def test_the_full_pipeline_folds_what_the_islands_hid() -> None:
    """After sinking, the bias Add sits on the convolution's output and folds into it."""
    b = ModelBuilder()
    x = b.input("x", (1, 3, 8, 8))
    b.output(b.op(OpCode.TRANSPOSE, [_nhwc_island(b, x, 4)], perm=TO_NCHW), name="y")
    model = b.build()
    feeds = {"x": rand(1, 3, 8, 8)}
    want = run(model, feeds)["y"]
    optimize(model)
    np.testing.assert_allclose(run(model, feeds)["y"], want, rtol=1e-5, atol=1e-6)
    assert ops(model).count("TRANSPOSE") == 0 and ops(model).count("ADD") == 0


def test_a_transpose_that_meets_no_other_stays_put() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4, 5))
    y = b.op(OpCode.TRANSPOSE, [x], perm=TO_NHWC)
    y = b.op(OpCode.ADD, [y, b.constant("c", rand(5, 1))])
    b.output(b.op(OpCode.RELU, [y]), name="y")
    model = b.build()
    assert sink_transposes(model) == 0
    assert ops(model) == ["TRANSPOSE", "ADD", "RELU"]


def test_a_transposed_tensor_read_elsewhere_is_left_alone() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4, 5))
    t = b.op(OpCode.TRANSPOSE, [x], perm=TO_NHWC)
    y = b.op(OpCode.TRANSPOSE, [b.op(OpCode.RELU, [t])], perm=TO_NCHW)
    b.output(y, name="y")
    b.output(t, name="t")  # the transposed tensor itself is an output
    model = b.build()
    assert sink_transposes(model) == 0


def test_a_transpose_read_by_transposes_only_folds_into_each() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4, 5))
    t = b.op(OpCode.TRANSPOSE, [x], perm=TO_NHWC)
    back = b.op(OpCode.TRANSPOSE, [t], perm=TO_NCHW)  # the identity: removed
    other = b.op(OpCode.TRANSPOSE, [t], perm=[0, 2, 1, 3])
    b.output(b.op(OpCode.RELU, [back]), name="a")
    b.output(b.op(OpCode.RELU, [other]), name="b")
    rewritten = check_rewrite(b.build(), sink_transposes, {"x": rand(2, 3, 4, 5)})
    assert ops(rewritten).count("TRANSPOSE") == 1


def test_only_casts_to_the_same_dtype_are_removed() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.op(OpCode.CAST, [x], to=1)  # float32 -> float32: a copy
    y = b.op(OpCode.CAST, [y], to=7)  # -> int64: kept
    b.output(y, name="y")
    rewritten = check_rewrite(b.build(), remove_identities, {"x": 10 * rand(2, 3)})
    assert ops(rewritten) == ["CAST"]


def test_resnet_blocks_with_identity_shortcuts_lose_every_transpose() -> None:
    """Each block's NHWC output feeds the next block's convolution (through a Transpose)
    and its shortcut Add: the Transpose sinks past that fork."""
    b = ModelBuilder()
    x = b.input("x", (-1, 4, 6, 6))
    w0 = b.constant("w0", rand(4, 4, 1, 1))
    z = b.op(OpCode.TRANSPOSE, [b.op(OpCode.CONV2D, [x, w0])], perm=TO_NHWC)
    for k in range(3):
        inner = b.op(OpCode.TRANSPOSE, [z], perm=TO_NCHW)
        w = b.constant(f"wb{k}", rand(4, 4, 3, 3))
        y = b.op(OpCode.TRANSPOSE, [b.op(OpCode.CONV2D, [inner, w], pads=[1] * 4)], perm=TO_NHWC)
        y = b.op(OpCode.MUL, [y, b.constant(f"s{k}", rand(1, 1, 1, 4))])
        z = b.op(OpCode.RELU, [b.op(OpCode.ADD, [y, z])])
    b.output(b.op(OpCode.TRANSPOSE, [z], perm=TO_NCHW), name="y")
    model = b.build()
    for batch in (1, 2):
        rewritten = check_rewrite(model, sink_transposes, {"x": rand(batch, 4, 6, 6)})
    assert "TRANSPOSE" not in ops(rewritten)


def test_affine_chains_become_one_batch_norm_and_fold_into_the_conv() -> None:
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 8, 8))
    y = b.op(OpCode.CONV2D, [x, b.constant("w", rand(4, 3, 3, 3))], pads=[1, 1, 1, 1])
    y = b.op(OpCode.SUB, [y, b.constant("mean", rand(1, 4, 1, 1))])
    y = b.op(OpCode.MUL, [b.constant("scale", rand(4, 1, 1)), y])
    y = b.op(OpCode.DIV, [y, b.constant("two", np.float32(2.0))])
    y = b.op(OpCode.SUB, [b.constant("beta", rand(1, 4, 1, 1)), y])  # beta - y
    b.output(b.op(OpCode.RELU, [y]), name="y")
    model = b.build()
    rewritten = check_rewrite(model, fold_affine_chains, {"x": rand(2, 3, 8, 8)})
    assert ops(rewritten) == ["CONV2D", "BATCH_NORM", "RELU"]
    feeds = {"x": rand(1, 3, 8, 8)}
    want = run(model, feeds)["y"]
    optimize(model)
    np.testing.assert_allclose(run(model, feeds)["y"], want, rtol=1e-5, atol=1e-5)
    assert ops(model) == ["CONV2D"]  # the chain folded, the Relu fused


def test_what_is_not_an_affine_chain_stays() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4, 5))
    y = b.op(OpCode.ADD, [x, b.constant("last_axis", rand(5))])  # per W, not per channel
    y = b.op(OpCode.DIV, [b.constant("c", rand(1, 3, 1, 1)), y])  # c / y: not affine
    y = b.op(OpCode.MUL, [y, b.constant("s", rand(1, 3, 1, 1))])
    y = b.op(OpCode.ADD, [y, b.constant("t", rand(1, 3, 1, 1))])  # a chain, but no conv
    b.output(y, name="y")
    model = b.build()
    assert fold_affine_chains(model) == 0
