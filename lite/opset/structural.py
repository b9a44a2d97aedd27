"""Structural ops: reshaping, layout, gathers and scatters, shape arithmetic."""

from __future__ import annotations

from sporenet.lite.kernels import (
    cumsum,
    gather_nd,
    onehot,
    pad,
    ranges,
    reshape,
    resize,
    scatter,
    scatter_nd,
    topk,
    transform,
)
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import resize as q_resize
from sporenet.lite.kernels.quantized import shape as q_shape
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import Channels, Quant, declare, rule

MOVES = Quant(keeps_params=True)  # values moved, not computed: int8 parameters carry through

OPS = (
    declare(
        O.IDENTITY,
        kernel=reshape.Identity,
        int8=q_shape.QIdentity,
        grad=rule("reshape", "identity"),
        grad_differentiable=True,
        channels=Channels.PASS,
        quant=MOVES,
        raw_constants=True,
        int16=q_shape.QIdentity,
    ),
    declare(
        O.RESHAPE,
        kernel=reshape.Reshape,
        int8=q_shape.QReshape,
        grad=rule("reshape", "reshape"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QReshape,
    ),
    declare(
        O.FLATTEN,
        kernel=reshape.Flatten,
        int8=q_shape.QFlatten,
        grad=rule("reshape", "reshape"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QFlatten,
    ),
    declare(
        O.SQUEEZE,
        kernel=transform.Squeeze,
        int8=q_shape.QSqueeze,
        grad=rule("transform", "squeeze"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QSqueeze,
    ),
    declare(
        O.UNSQUEEZE,
        kernel=transform.Unsqueeze,
        int8=q_shape.QUnsqueeze,
        grad=rule("transform", "squeeze"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QUnsqueeze,
    ),
    declare(
        O.TRANSPOSE,
        kernel=transform.Transpose,
        int8=q_shape.QTranspose,
        grad=rule("transform", "transpose"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QTranspose,
    ),
    declare(
        O.CONCAT,
        kernel=transform.Concat,
        int8=q_shape.QConcat,
        grad=rule("transform", "concat"),
        grad_differentiable=True,
        int16=q_int16.QConcat16,
    ),
    declare(
        O.SPLIT,
        kernel=transform.Split,
        int8=q_shape.QSplit,
        grad=rule("transform", "split"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QSplit,
    ),
    declare(
        O.SLICE,
        kernel=transform.Slice,
        int8=q_shape.QSlice,
        grad=rule("transform", "slice_"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QSlice,
    ),
    declare(
        O.GATHER,
        kernel=transform.Gather,
        int8=q_shape.QGather,
        grad=rule("transform", "gather"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QGather,
    ),
    declare(O.CAST, kernel=transform.Cast, raw_constants=True),
    declare(
        O.EXPAND,
        kernel=transform.Expand,
        int8=q_shape.QExpand,
        int8_file_only=True,
        grad=rule("transform", "expand"),
        grad_differentiable=True,
        int16=q_shape.QExpand,
    ),
    declare(
        O.TILE, kernel=transform.Tile, int8=q_shape.QTile, int8_file_only=True, int16=q_shape.QTile
    ),
    declare(O.SHAPE, kernel=transform.Shape, raw_constants=True),
    declare(
        O.WHERE, kernel=transform.Where, grad=rule("transform", "where"), grad_differentiable=True
    ),
    declare(
        O.DEPTH_TO_SPACE,
        kernel=transform.DepthToSpace,
        int8=q_shape.QDepthToSpace,
        quant=MOVES,
    ),
    declare(
        O.SPACE_TO_DEPTH,
        kernel=transform.SpaceToDepth,
        int8=q_shape.QSpaceToDepth,
        quant=MOVES,
    ),
    declare(O.ONE_HOT, kernel=onehot.OneHot),
    declare(O.RANGE, kernel=ranges.Range),
    declare(
        O.PAD,
        kernel=pad.Pad,
        int8=q_shape.QPad,
        grad=rule("transform", "pad"),
        grad_differentiable=True,
        quant=MOVES,
        int16=q_shape.QPad,
    ),
    declare(
        O.RESIZE,
        kernel=resize.Resize,
        int8=q_resize.QResize,
        int8_file_only=True,
        int16=q_int16.QResize16,
    ),
    declare(
        O.GATHER_ND,
        kernel=gather_nd.GatherNd,
        int8=q_shape.QGatherNd,
        int8_file_only=True,
        int16=q_shape.QGatherNd,
    ),
    declare(O.SCATTER_ND, kernel=scatter_nd.ScatterNd),
    declare(O.SCATTER_ND_UPDATE, kernel=scatter.ScatterNdUpdate),
    declare(O.SCATTER_ELEMENTS, kernel=scatter.ScatterElements),
    declare(O.GATHER_ELEMENTS, kernel=scatter.GatherElements),
    declare(O.CUMSUM, kernel=cumsum.CumSum),
    declare(O.TOP_K, kernel=topk.TopK),
)
