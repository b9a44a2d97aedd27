"""Sliding-window geometry shared by convolution and pooling (ONNX attribute semantics).

`window()` reads `strides`, `dilations`, `pads` ([top, left, bottom, right]) and `auto_pad`
from a node's attributes, checks them, and returns the output size and the explicit padding
the kernel has to apply. Kernels then work on a padded view of the input, so the per-call
code never thinks about borders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sporenet.lite.kernels.base import Attrs, Kernel

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window over an (H, W) plane, with its resolved padding."""

    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    out: tuple[int, int]  # output (OH, OW)

    @property
    def extent(self) -> tuple[int, int]:
        """Rows and columns of padded input the windows actually touch."""
        return tuple(  # type: ignore[return-value]
            (o - 1) * s + (k - 1) * d + 1
            for o, s, k, d in zip(self.out, self.strides, self.kernel, self.dilations, strict=True)
        )

    @property
    def padded(self) -> bool:
        return any(self.pads)

    def tap(self, i: int, j: int) -> tuple[slice, slice]:
        """Slices of the padded plane read by kernel tap (i, j) for every output position."""
        (sh, sw), (dh, dw), (oh, ow) = self.strides, self.dilations, self.out
        return (
            slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (ow - 1) + 1, sw),
        )


def _pair(op: Kernel, attrs: Attrs, name: str, default: int) -> tuple[int, int]:
    values = attrs.ints(name, [default, default])
    if len(values) != 2:
        raise op.fail(f"attribute {name!r} must hold 2 values (H, W), got {values}")
    if any(v < 1 for v in values):
        raise op.fail(f"attribute {name!r} must be positive, got {values}")
    return values[0], values[1]


def window(
    op: Kernel,
    in_hw: tuple[int, int],
    kernel: tuple[int, int],
    attrs: Attrs,
    *,
    ceil_mode: bool = False,
) -> Window:
    """Resolve the window over an input plane of size `in_hw` (ONNX Conv/Pool semantics).

    With `ceil_mode` the output size rounds up, but a window that would start entirely
    inside the bottom/right padding is dropped (ONNX, PyTorch and onnxruntime agree).
    """
    strides = _pair(op, attrs, "strides", 1)
    dilations = _pair(op, attrs, "dilations", 1)
    auto_pad = attrs.str("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise op.fail(f"auto_pad must be one of {list(AUTO_PADS)}, got {auto_pad!r}")
    pads = attrs.ints("pads", None)
    if pads is not None and auto_pad != "NOTSET" and any(pads):
        raise op.fail(f"explicit pads {pads} cannot be combined with auto_pad={auto_pad!r}")
    if pads is None or auto_pad != "NOTSET":
        pads = [0, 0, 0, 0]
    if len(pads) != 4:
        raise op.fail(f"pads must hold 4 values [top, left, bottom, right], got {pads}")
    if any(p < 0 for p in pads):
        raise op.fail(f"pads must be non-negative, got {pads}")
    if any(k < 1 for k in kernel):
        raise op.fail(f"kernel size must be positive, got {list(kernel)}")
    effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    out = []
    for axis in range(2):
        size, s, eff = in_hw[axis], strides[axis], effective[axis]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + eff - size)
            small = total // 2
            begin = small if auto_pad == "SAME_UPPER" else total - small
            pads[axis], pads[axis + 2] = begin, total - begin
        span = size + pads[axis] + pads[axis + 2] - eff
        if span < 0:
            raise op.fail(
                f"window {list(kernel)} (dilations {list(dilations)}) is larger than the "
                f"padded input {list(in_hw)} + pads {pads}"
            )
        if ceil_mode and auto_pad == "NOTSET":
            o = -(-span // s) + 1
            if (o - 1) * s >= size + pads[axis]:
                o -= 1
        else:
            o = span // s + 1
        out.append(o)
    return Window(
        kernel=(int(kernel[0]), int(kernel[1])),
        strides=strides,
        dilations=dilations,
        pads=(pads[0], pads[1], pads[2], pads[3]),
        out=(out[0], out[1]),
    )


def padded_buffer(
    x: np.ndarray, win: Window, fill: float, *, axes: tuple[int, int] = (-2, -1)
) -> tuple[np.ndarray, np.ndarray]:
    """A scratch array holding `x` padded by `win` (plus any ceil-mode overhang), with its
    border set to `fill` once, and the view of its interior that each call copies `x` into.
    `axes` are x's (row, column) axes: the last two (NCHW), or (1, 2) for NHWC.

    The scratch belongs to the kernel (not the planner's arena), so its border survives
    between calls and only the interior is rewritten.
    """
    ay, ax = (a % x.ndim for a in axes)
    h, w = x.shape[ay], x.shape[ax]
    top, left, bottom, right = win.pads
    eh, ew = win.extent
    shape = list(x.shape)
    shape[ay], shape[ax] = max(h + top + bottom, eh), max(w + left + right, ew)
    buf = np.full(shape, fill, x.dtype)
    interior = [slice(None)] * x.ndim
    interior[ay], interior[ax] = slice(top, top + h), slice(left, left + w)
    return buf, buf[tuple(interior)]


def check_nchw(op: Kernel, shape: tuple[int, ...], what: str = "input") -> None:
    if len(shape) != 4:
        raise op.fail(f"{what} must be 4-D (N, C, H, W), got shape {list(shape)}")
    if math.prod(shape) == 0:
        raise op.fail(f"{what} must not be empty, got shape {list(shape)}")
