"""Conv, MaxPool, AveragePool and the global pools (NCHW, ONNX attribute semantics).

The runtime's Conv2D and pools are 2-D; 1-D ops run as 2-D ones over a height of 1
(Unsqueeze before, Squeeze after), with every attribute extended accordingly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import pool3d
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.kernels import KERNELS
from sporenet.lite.ops import OpCode


def _spatial_attrs(node: OnnxNode, spatial: int, names: tuple[str, ...]) -> dict[str, Any]:
    """ONNX window attributes, extended from 1-D to 2-D when `spatial` is 1."""
    attrs: dict[str, Any] = {}
    for name in names:
        if name not in node.attrs:
            continue
        value = node.attr(name)
        if spatial == 1 and name in ("kernel_shape", "strides", "dilations"):
            value = [1, *value]
        elif spatial == 1 and name == "pads":
            value = [0, value[0], 0, value[1]]
        attrs[name] = value
    return attrs


def _to_2d(ctx: ImportContext, node: OnnxNode, x: int) -> tuple[int, int]:
    """(input as a 4-D tensor, number of spatial axes of the original)."""
    rank = ctx.rank(x)
    if rank == 4:
        return x, 2
    if rank == 3:
        return ctx.emit1(OpCode.UNSQUEEZE, [x], axes=[2]), 1
    raise node.fail(
        f"only 1-D and 2-D {node.op_type} is supported; the input has rank {rank} "
        f"(shape {list(ctx.shape(x))})"
    )


def _from_2d(ctx: ImportContext, y: int, spatial: int) -> int:
    return y if spatial == 2 else ctx.emit1(OpCode.SQUEEZE, [y], axes=[2])


WINDOW = ("kernel_shape", "strides", "dilations", "pads", "auto_pad")


def conv(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x, w, b = node.input(0), node.input(1), node.input(2)
    x4, spatial = _to_2d(ctx, node, x)
    if spatial == 1:
        value = ctx.value(w)
        if value is not None:
            w = ctx.constant(f"{ctx.tensors[w].name}/2d", value[:, :, None, :])
        else:
            w = ctx.emit1(OpCode.UNSQUEEZE, [w], axes=[2])
    attrs = _spatial_attrs(node, spatial, WINDOW)
    attrs["group"] = int(node.attr("group", 1))
    inputs = [x4, w] if b == -1 else [x4, w, b]
    return [_from_2d(ctx, ctx.emit1(OpCode.CONV2D, inputs, **attrs), spatial)]


def max_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    if ctx.rank(node.input(0)) == 5:
        return pool3d.max_pool_3d(ctx, node)
    if int(node.attr("storage_order", 0)) not in (0, 1):
        raise node.fail("storage_order must be 0 or 1")
    x = node.input(0)
    dtype = ctx.dtype(x)
    if node.num_outputs == 2 and dtype.kind == "f":
        return _max_pool_with_indices(ctx, node, x)
    node.only_first_output()
    if ctx.spec(x).quant is not None:  # an int8 tensor with parameters: the int8 kernel
        x4, spatial = _to_2d(ctx, node, x)
        attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode"))
        return [_from_2d(ctx, ctx.emit1(OpCode.MAX_POOL2D, [x4], **attrs), spatial)]
    if dtype in (np.int8, np.uint8):  # quantized models pool integers: exact in float32
        x = ctx.emit1(OpCode.CAST, [x], to="float32")
    x4, spatial = _to_2d(ctx, node, x)
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode"))
    y = _from_2d(ctx, ctx.emit1(OpCode.MAX_POOL2D, [x4], **attrs), spatial)
    return [y if dtype.kind == "f" else ctx.emit1(OpCode.CAST, [y], to=str(dtype))]


def _max_pool_with_indices(ctx: ImportContext, node: OnnxNode, x: int) -> list[int]:
    """Y and Indices (flat positions in the input; a 1-D pool's height of 1 leaves them
    unchanged)."""
    x4, spatial = _to_2d(ctx, node, x)
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode", "storage_order"))
    outputs = ctx.emit(OpCode.MAX_POOL2D, [x4], num_outputs=2, **attrs)
    return [_from_2d(ctx, y, spatial) for y in outputs]


def average_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    if ctx.rank(node.input(0)) == 5:
        return pool3d.average_pool_3d(ctx, node)
    x4, spatial = _to_2d(ctx, node, node.input(0))
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode", "count_include_pad"))
    return [_from_2d(ctx, ctx.emit1(OpCode.AVG_POOL2D, [x4], **attrs), spatial)]


def global_pool(op: OpCode) -> Callable[[ImportContext, OnnxNode], list[int]]:
    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        return [ctx.emit1(op, [node.input(0)])]

    return convert


def conv_transpose(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """ConvTranspose is the input gradient of the convolution with the same weights, so it
    runs on the runtime's Conv2DBackpropInput: the transposed input plays the gradient and
    the `input_shape` attribute gives the output size.

    Pads follow ONNX: from output_shape (split by auto_pad), SAME_* (output = input *
    stride), VALID (none) or explicit; output_padding adds rows/columns at the end.
    """
    x, w, b = node.input(0), node.input(1), node.input(2)
    x4, spatial = _to_2d(ctx, node, x)
    w_value = ctx.value(w)
    if spatial == 1:
        w = (
            ctx.emit1(OpCode.UNSQUEEZE, [w], axes=[2])
            if w_value is None
            else ctx.constant(
                f"{ctx.tensors[w].name}/2d", np.ascontiguousarray(w_value[:, :, None, :])
            )
        )
    n, c_in, *in_hw = ctx.spec(x4).shape
    c_w, c_out_g, kh, kw = ctx.spec(w).shape
    group = int(node.attr("group", 1))
    if c_w != c_in:
        raise node.fail(
            f"weights {list(ctx.spec(w).shape)} expect {c_w} input channels, the input has {c_in}"
        )
    attrs = _spatial_attrs(node, spatial, ("strides", "dilations", "pads"))
    strides = attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    out_pad = node.ints("output_padding") or [0] * spatial
    out_pad = [0, *out_pad] if spatial == 1 else out_pad
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = node.ints("output_shape")
    if output_shape is not None:
        output_shape = output_shape[-spatial:]
        output_shape = [1, *output_shape] if spatial == 1 else output_shape
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if (
        DYNAMIC in ctx.shape(x4)[2:]
        and output_shape is None
        and auto_pad in ("NOTSET", "VALID")
        and OpCode.CONV_TRANSPOSE2D in KERNELS
    ):
        # The output size follows the input's dynamic height and width: the runtime's
        # ConvTranspose kernel computes it when the graph is planned.
        y = ctx.emit1(
            OpCode.CONV_TRANSPOSE2D,
            [x4, w] if b == -1 else [x4, w, b],
            strides=strides,
            dilations=dilations,
            pads=[0, 0, 0, 0] if auto_pad == "VALID" else pads,
            output_padding=out_pad,
            group=group,
        )
        return [_from_2d(ctx, y, spatial)]
    out_hw, pads = _transpose_geometry(
        node, in_hw, (kh, kw), (strides, dilations, out_pad), pads, auto_pad, output_shape
    )
    batch = -1 if ctx.shape(x4)[0] == DYNAMIC else n  # -1: the input's batch
    y = ctx.emit1(
        OpCode.CONV2D_BACKPROP_INPUT,
        [x4, w],
        strides=strides,
        dilations=dilations,
        pads=pads,
        group=group,
        input_shape=[batch, c_out_g * group, *out_hw],
    )
    if b != -1:
        bias = ctx.value(b)
        if bias is None:
            raise node.fail("the bias (input 2) must be static")
        y = ctx.emit1(
            OpCode.ADD, [y, ctx.constant(f"{ctx.tensors[b].name}/nchw", bias.reshape(-1, 1, 1))]
        )
    return [_from_2d(ctx, y, spatial)]


def _transpose_geometry(
    node: OnnxNode,
    in_hw: list[int],
    kernel: tuple[int, int],
    steps: tuple[list[int], list[int], list[int]],
    pads: list[int],
    auto_pad: str,
    output_shape: list[int] | None,
) -> tuple[list[int], list[int]]:
    """ConvTranspose's output size and pads (begin, begin, end, end) from the input size,
    kernel, (strides, dilations, output_padding), explicit pads, auto_pad and
    output_shape, as ONNX defines them."""
    strides, dilations, out_pad = steps
    pads = list(pads)
    out_hw = []
    for axis, (size, k) in enumerate(zip(in_hw, kernel, strict=True)):
        s, d, op = strides[axis], dilations[axis], out_pad[axis]
        extent = (k - 1) * d + 1
        full = s * (size - 1) + op + extent
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = output_shape[axis] if output_shape is not None else size * s
            total = full - target  # may be negative with output_shape: see below
            small = total // 2
            begin = small if auto_pad == "SAME_UPPER" else total - small
            pads[axis], pads[axis + 2] = begin, total - begin
        elif auto_pad == "VALID":
            pads[axis] = pads[axis + 2] = 0
        out_hw.append(full - pads[axis] - pads[axis + 2])
    if any(o <= 0 for o in out_hw) or min(pads[:2]) < 0:
        raise node.fail(f"unsupported geometry: output size {out_hw}, pads {pads}")
    # A negative end pad (output_shape beyond the natural size) is output the convolution
    # never reaches: the gradient kernel leaves it at zero when it is not padding.
    return out_hw, [max(p, 0) for p in pads]


def lp_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """LpPool = (sum over the window of |x|^p)^(1/p): an average pool of |x|^p that counts
    padding, times the window size, to the power 1/p."""
    x = node.input(0)
    if ctx.rank(x) == 5:
        return pool3d.lp_pool_3d(ctx, node)
    p = float(node.attr("p", 2))
    x4, spatial = _to_2d(ctx, node, x)
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode"))
    kernel = attrs["kernel_shape"]
    dtype = ctx.dtype(x)
    powered = ctx.emit1(
        OpCode.POW,
        [ctx.emit1(OpCode.ABS, [x4]), ctx.constant(f"{node.name}/p", np.array(p, dtype))],
    )
    mean = ctx.emit1(OpCode.AVG_POOL2D, [powered], count_include_pad=1, **attrs)
    total = ctx.emit1(
        OpCode.MUL,
        [mean, ctx.constant(f"{node.name}/window", np.array(kernel[0] * kernel[1], dtype))],
    )
    y = ctx.emit1(OpCode.POW, [total, ctx.constant(f"{node.name}/inv_p", np.array(1 / p, dtype))])
    return [_from_2d(ctx, y, spatial)]


def global_lp_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(sum over all spatial positions of |x|^p)^(1/p)."""
    x = node.input(0)
    p = float(node.attr("p", 2))
    dtype = ctx.dtype(x)
    shape = ctx.spec(x).shape
    count = int(np.prod(shape[2:], dtype=np.int64))
    powered = ctx.emit1(
        OpCode.POW, [ctx.emit1(OpCode.ABS, [x]), ctx.constant(f"{node.name}/p", np.array(p, dtype))]
    )
    total = ctx.emit1(
        OpCode.MUL,
        [
            ctx.emit1(OpCode.GLOBAL_AVG_POOL, [powered]),
            ctx.constant(f"{node.name}/count", np.array(count, dtype)),
        ],
    )
    return [
        ctx.emit1(OpCode.POW, [total, ctx.constant(f"{node.name}/inv_p", np.array(1 / p, dtype))])
    ]
