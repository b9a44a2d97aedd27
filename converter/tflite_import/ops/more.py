"""More TFLite builtins onto IR ops: ADD_N, RANK, REDUCE_ANY/ALL,
EMBEDDING_LOOKUP, L2_POOL_2D, SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND, TOPK_V2 and
SCATTER_ND."""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext
from sporenet.converter.tflite_import.ops.common import Handler, apply_fused, order_of
from sporenet.converter.tflite_import.ops.conv import _pads
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode


def add_n(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    order = order_of(lc, op.inputs, lc.rank(out))
    parts = [lc.get_broadcast(i, order) for i in op.inputs]
    y = parts[0]
    for part in parts[1:]:
        y = lc.emit(OpCode.ADD, [y, part])
    lc.set(out, y, order)


def rank(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    lc.set(out, lc.ctx.constant(lc.tensor(out).name, np.array(lc.rank(op.inputs[0]), np.int32)))


def reduce_bool(kind: OpCode) -> Handler:
    """REDUCE_ANY (MAX of bools) and REDUCE_ALL (MIN of bools)."""
    from sporenet.converter.tflite_import.ops.shape import reduce

    return reduce(kind)


def embedding_lookup(lc: LayoutContext, op: TfliteOperator) -> None:
    # EMBEDDING_LOOKUP(ids, table): rows of the table.
    ids, table = op.inputs[:2]
    y = lc.emit(OpCode.GATHER, [lc.get(table), lc.get(ids)], out=op.outputs[0], axis=0)
    lc.set(op.outputs[0], y)


def l2_pool_2d(lc: LayoutContext, op: TfliteOperator) -> None:
    # sqrt of the mean of squares over each window's valid entries, as TFLite's L2Pool.
    o = op.options
    x = op.inputs[0]
    kernel = (o.FilterHeight(), o.FilterWidth())
    strides = (o.StrideH(), o.StrideW())
    xi = lc.get(x, NCHW)
    squares = lc.emit(OpCode.MUL, [xi, xi])
    mean = lc.emit(
        OpCode.AVG_POOL2D,
        [squares],
        kernel_shape=list(kernel),
        strides=list(strides),
        pads=_pads(lc, x, o.Padding(), kernel, strides),
        count_include_pad=0,
    )
    lc.set(op.outputs[0], apply_fused(lc, lc.emit(OpCode.SQRT, [mean]), o), NCHW)


def _block(lc: LayoutContext, op: TfliteOperator, x: int) -> tuple[list[int], np.ndarray]:
    block = [int(v) for v in lc.constant_value(op.inputs[1], "block_shape").reshape(-1)]
    pads = lc.constant_value(op.inputs[2], "paddings").astype(np.int64).reshape(-1, 2)
    m = len(block)
    if m < 1 or min(block) < 1 or pads.shape[0] != m or lc.rank(x) < m + 1 or (pads < 0).any():
        raise lc.fail(f"block_shape {block} and paddings {pads.tolist()} do not fit the input")
    return block, pads


def space_to_batch_nd(lc: LayoutContext, op: TfliteOperator) -> None:
    """Pad the M spatial axes, cut each into blocks and move the blocks into the batch:
    PAD, RESHAPE (N, d1/b1, b1, ..., rest), TRANSPOSE (b1.., N, d1/b1.., rest), RESHAPE."""
    x, out = op.inputs[0], op.outputs[0]
    block, pads = _block(lc, op, x)
    m, shape = len(block), list(lc.tensor(x).shape)
    y = lc.get(x)
    if pads.any():
        rank = len(shape)
        begin = [0] + [int(p) for p in pads[:, 0]] + [0] * (rank - m - 1)
        end = [0] + [int(p) for p in pads[:, 1]] + [0] * (rank - m - 1)
        y = lc.emit(OpCode.PAD, [y], out=None, pads=begin + end, mode="constant")
        shape = [d + b + e for d, b, e in zip(shape, begin, end, strict=True)]
    padded = shape[1 : m + 1]
    if any(d % b for d, b in zip(padded, block, strict=True)):
        raise lc.fail(f"padded spatial sizes {padded} are not multiples of block_shape {block}")
    rest = shape[m + 1 :]
    split = [shape[0]]
    for d, b in zip(padded, block, strict=True):
        split += [d // b, b]
    y = lc.emit(OpCode.RESHAPE, [y], shape=split + rest)
    blocks = [2 + 2 * k for k in range(m)]
    perm = (
        blocks + [0] + [1 + 2 * k for k in range(m)] + list(range(1 + 2 * m, 1 + 2 * m + len(rest)))
    )
    y = lc.emit(OpCode.TRANSPOSE, [y], perm=perm)
    target = [shape[0] * int(np.prod(block))] + [d // b for d, b in zip(padded, block, strict=True)]
    lc.set(out, lc.emit(OpCode.RESHAPE, [y], out=out, shape=target + rest))


def batch_to_space_nd(lc: LayoutContext, op: TfliteOperator) -> None:
    """The inverse: RESHAPE (b1.., N, d1.., rest), TRANSPOSE (N, d1, b1, ..., rest),
    RESHAPE (N, d1*b1, ..., rest), then SLICE off the crops."""
    x, out = op.inputs[0], op.outputs[0]
    block, crops = _block(lc, op, x)
    m, shape = len(block), list(lc.tensor(x).shape)
    total = int(np.prod(block))
    if shape[0] % total:
        raise lc.fail(f"batch {shape[0]} is not a multiple of the block size {total}")
    n, spatial, rest = shape[0] // total, shape[1 : m + 1], shape[m + 1 :]
    y = lc.emit(OpCode.RESHAPE, [lc.get(x)], shape=[*block, n, *spatial, *rest])
    perm = [m]
    for k in range(m):
        perm += [m + 1 + k, k]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    y = lc.emit(OpCode.TRANSPOSE, [y], perm=perm)
    full = [d * b for d, b in zip(spatial, block, strict=True)]
    y = lc.emit(OpCode.RESHAPE, [y], shape=[n, *full, *rest])
    if crops.any():
        y = lc.emit(
            OpCode.SLICE,
            [y],
            starts=[int(c) for c in crops[:, 0]],
            ends=[d - int(c) for d, c in zip(full, crops[:, 1], strict=True)],
            axes=list(range(1, m + 1)),
        )
    lc.set(out, y)


def topk_v2(lc: LayoutContext, op: TfliteOperator) -> None:
    x, k = op.inputs[:2]
    # TOP_K gives int64 indices (ONNX's); TFLite's are int32.
    values, indices = lc.ctx.emit(
        OpCode.TOP_K,
        [lc.get(x), lc.ctx.constant("k", lc.constant_value(k, "k").reshape(-1).astype(np.int64))],
        num_outputs=2,
        axis=-1,
    )
    lc.set(op.outputs[0], values)
    lc.set(op.outputs[1], lc.ctx.emit1(OpCode.CAST, [indices], to="int32"))


def scatter_nd(lc: LayoutContext, op: TfliteOperator) -> None:
    indices, updates, shape = op.inputs[:3]
    y = lc.emit(
        OpCode.SCATTER_ND,
        [
            lc.get(indices),
            lc.get(updates),
            lc.ctx.constant("shape", lc.constant_value(shape, "shape")),
        ],
    )
    lc.set(op.outputs[0], y)
