"""Reshape-family, Transpose, Concat, Split, Slice, Pad, Gather, Expand and ReduceMean/Sum
gradients vs finite differences and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import check_op, rand


def i64(*values):
    return np.array(values, np.int64)


def test_transpose():
    check_op(
        lambda b, x: b.op(OpCode.TRANSPOSE, [x], perm=[2, 0, 1]),
        {"x": rand(2, 3, 4, seed=1)},
        torch_fn=lambda x: x.permute(2, 0, 1),
    )


def test_squeeze_unsqueeze():
    def build(b, x):
        y = b.op(OpCode.UNSQUEEZE, [x, b.constant("axes", i64(0))])
        return b.op(OpCode.SQUEEZE, [y], axes=[2])

    check_op(build, {"x": rand(3, 1, 4, seed=1)}, torch_fn=lambda x: x.squeeze(1).unsqueeze(0))


def test_concat_of_three():
    check_op(
        lambda b, x, y, z: b.op(OpCode.CONCAT, [x, y, z], axis=1),
        {"x": rand(2, 1, 3, seed=1)},
        {"y": rand(2, 2, 3, seed=2), "z": rand(2, 3, 3, seed=3)},
        torch_fn=lambda x, y, z: __import__("torch").cat([x, y, z], 1),
    )


def test_split_with_an_unused_output():
    def build(b, x):
        first, _, third = b.op_multi(OpCode.SPLIT, [x], 3, axis=1, split=[1, 2, 2])
        return b.op(OpCode.CONCAT, [third, first], axis=1)

    def torch_fn(x):
        import torch

        first, _, third = torch.split(x, [1, 2, 2], dim=1)
        return torch.cat([third, first], 1)

    check_op(build, {"x": rand(2, 5, 3, seed=1)}, torch_fn=torch_fn)


def test_slice_with_constant_inputs_and_steps():
    def build(b, x):
        return b.op(
            OpCode.SLICE,
            [
                x,
                b.constant("starts", i64(1, -1)),
                b.constant("ends", i64(5, 0)),
                b.constant("axes", i64(1, 2)),
                b.constant("steps", i64(2, -2)),
            ],
        )

    # Axis 2 from index 4 down to (not including) 0 by -2: indices 4 and 2.
    check_op(
        build, {"x": rand(2, 6, 5, seed=1)}, torch_fn=lambda x: x[:, 1:5:2].flip(2)[:, :, 0:4:2]
    )


@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 2, 1], [0, -1, 1, 0, 1, -1]])
def test_pad_constant_mode(pads):
    # The second case crops (negative pads) as well as pads.
    def torch_fn(x):
        import torch.nn.functional as F

        return F.pad(x, (pads[2], pads[5], pads[1], pads[4], pads[0], pads[3]), value=0.5)

    check_op(
        lambda b, x: b.op(OpCode.PAD, [x], pads=pads, value=0.5),
        {"x": rand(2, 4, 3, seed=1)},
        torch_fn=torch_fn,
    )


def test_gather_with_repeated_indices():
    # Repeated indices must accumulate their gradients.
    idx = i64(3, 0, 3, 1)

    def build(b, x):
        return b.op(OpCode.GATHER, [x, b.constant("idx", idx)], axis=1)

    check_op(
        build,
        {"x": rand(2, 5, 3, seed=1)},
        torch_fn=lambda x: x[:, __import__("torch").tensor(idx)],
    )


def test_expand():
    check_op(
        lambda b, x: b.op(OpCode.EXPAND, [x, b.constant("shape", i64(2, 3, 4))]),
        {"x": rand(3, 1, seed=1)},
        torch_fn=lambda x: x.expand(2, 3, 4),
    )


@pytest.mark.parametrize("op", [OpCode.REDUCE_SUM, OpCode.REDUCE_MEAN], ids=lambda o: o.name)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, 2], 0), (None, 0)])
def test_reduce(op, axes, keepdims):
    attrs = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    dims = tuple(axes) if axes is not None else (0, 1, 2)

    def torch_fn(x):
        f = x.sum if op == OpCode.REDUCE_SUM else x.mean
        return f(dim=dims, keepdim=bool(keepdims))

    check_op(lambda b, x: b.op(op, [x], **attrs), {"x": rand(2, 3, 4, seed=1)}, torch_fn=torch_fn)


def test_reduce_with_axes_input_and_noop_with_empty_axes():
    def build(b, x):
        y = b.op(OpCode.REDUCE_MEAN, [x, b.constant("axes", i64(-1))], keepdims=0)
        return b.op(OpCode.REDUCE_SUM, [y], noop_with_empty_axes=1)  # identity

    check_op(build, {"x": rand(2, 3, 4, seed=1)}, torch_fn=lambda x: x.mean(-1))


def test_slice_attributes_pad_inputs_and_default_transpose():
    def build(b, x):
        y = b.op(OpCode.SLICE, [x], starts=[1], ends=[3], axes=[0])
        y = b.op(OpCode.PAD, [y, b.constant("pads", i64(0, 1, 0, 2))])
        return b.op(OpCode.TRANSPOSE, [y])  # reversed axes

    def torch_fn(x):
        import torch.nn.functional as F

        return F.pad(x[1:3], (1, 2)).T

    check_op(build, {"x": rand(4, 3, seed=1)}, torch_fn=torch_fn)
