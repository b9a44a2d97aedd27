"""3-D MaxPool, AveragePool and LpPool as two of the runtime's 2-D pools.

A box window is separable: its max (or sum, or count of non-padding elements) is the one
over depth of the one over height and width. So (N, C, D, H, W) is pooled over (H, W)
as (N, C*D, H, W), then over D as (N, C, D, H'*W') with a (kd, 1) window, and reshaped to
(N, C, D', H', W'). Padding, strides, dilations, ceil_mode and count_include_pad split
per axis the same way, so the result is the 3-D pool's (up to float rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode


def _ints(node: OnnxNode, name: str, default: list[int]) -> list[int]:
    """An ints attribute, or `default` when the node does not set it."""
    value = node.ints(name, default)
    return default if value is None else value


def _window(node: OnnxNode) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kernel, strides, dilations, pads as [d0, h0, w0, d1, h1, w1]) of a 3-D pool."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise node.fail(f"3-D pooling supports auto_pad NOTSET and VALID, got {auto_pad!r}")
    kernel = node.ints("kernel_shape")
    if kernel is None or len(kernel) != 3:
        raise node.fail(f"kernel_shape must hold 3 values for a 3-D pool, got {kernel}")
    strides = _ints(node, "strides", [1, 1, 1])
    dilations = _ints(node, "dilations", [1, 1, 1])
    pads = [0] * 6 if auto_pad == "VALID" else _ints(node, "pads", [0] * 6)
    for name, value, size in (("strides", strides, 3), ("dilations", dilations, 3)):
        if len(value) != size:
            raise node.fail(f"{name} must hold {size} values, got {value}")
    if len(pads) != 6:
        raise node.fail(f"pads must hold 6 values, got {pads}")
    return kernel, strides, dilations, pads


def pool_3d(ctx: ImportContext, node: OnnxNode, op: OpCode, x: int, **extra: Any) -> int:
    """`op` (MAX_POOL2D or AVG_POOL2D) over the last three axes of the 5-D tensor x."""
    _, c, d, h, w = ctx.shape(x)
    if min(c, d, h, w) < 0:
        raise node.fail(
            f"3-D pooling needs static channel and spatial sizes, got shape {list(ctx.shape(x))}"
        )
    kernel, strides, dilations, pads = _window(node)
    extra["ceil_mode"] = int(node.attr("ceil_mode", 0))
    planes = ctx.emit1(OpCode.RESHAPE, [x], shape=[-1, c * d, h, w])
    hw = ctx.emit1(
        op,
        [planes],
        kernel_shape=kernel[1:],
        strides=strides[1:],
        dilations=dilations[1:],
        pads=[pads[1], pads[2], pads[4], pads[5]],
        **extra,
    )
    oh, ow = ctx.shape(hw)[2:]
    depth = ctx.emit1(OpCode.RESHAPE, [hw], shape=[-1, c, d, oh * ow])
    pooled = ctx.emit1(
        op,
        [depth],
        kernel_shape=[kernel[0], 1],
        strides=[strides[0], 1],
        dilations=[dilations[0], 1],
        pads=[pads[0], 0, pads[3], 0],
        **extra,
    )
    od = ctx.shape(pooled)[2]
    return ctx.emit1(OpCode.RESHAPE, [pooled], shape=[-1, c, od, oh, ow])


def max_pool_3d(ctx: ImportContext, node: OnnxNode) -> list[int]:
    node.only_first_output()
    x = node.input(0)
    if ctx.dtype(x).kind != "f":
        raise node.fail(f"3-D MaxPool takes float tensors, got {ctx.dtype(x)}")
    return [pool_3d(ctx, node, OpCode.MAX_POOL2D, x)]


def average_pool_3d(ctx: ImportContext, node: OnnxNode) -> list[int]:
    include = int(node.attr("count_include_pad", 0))
    return [pool_3d(ctx, node, OpCode.AVG_POOL2D, node.input(0), count_include_pad=include)]


def lp_pool_3d(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(sum over the window of |x|^p)^(1/p), the sum as a padding-counting average times
    the window size."""
    x = node.input(0)
    p = float(node.attr("p", 2))
    dtype = ctx.dtype(x)
    powered = ctx.emit1(
        OpCode.POW,
        [ctx.emit1(OpCode.ABS, [x]), ctx.constant(f"{node.name}/p", np.array(p, dtype))],
    )
    mean = pool_3d(ctx, node, OpCode.AVG_POOL2D, powered, count_include_pad=1)
    size = int(np.prod(_window(node)[0]))
    total = ctx.emit1(
        OpCode.MUL, [mean, ctx.constant(f"{node.name}/window", np.array(size, dtype))]
    )
    inv_p = ctx.constant(f"{node.name}/inv_p", np.array(1 / p, dtype))
    return [ctx.emit1(OpCode.POW, [total, inv_p])]
