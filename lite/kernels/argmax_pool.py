"""MediaPipe's max pooling with window indices and its inverse, on NCHW float tensors:

- MAX_POOL_WITH_ARGMAX: each window's maximum and where it is within the window,
  fy * kw + fx + 0.1 as float32 (the first maximum in row-major window order; positions
  outside the input never count), as MediaPipe's MaxPoolingWithArgmax2D;
- MAX_UNPOOL: each value written back to the position its index names in its window of
  an output of `output_size`, zeros elsewhere (MaxUnpooling2D); indices naming a
  position outside the output are skipped.

`pads` are the [top, left] offsets of the first window before the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import REQUIRED, Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


def _window(kernel: Kernel, attrs: Attrs) -> tuple[int, int, int, int, int, int]:
    kh, kw = attrs.ints("kernel_shape", REQUIRED)
    sh, sw = attrs.ints("strides", REQUIRED)
    ph, pw = attrs.ints("pads", [0, 0])
    if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0:
        raise kernel.fail(f"kernel {[kh, kw]}, strides {[sh, sw]}, pads {[ph, pw]} are invalid")
    return kh, kw, sh, sw, ph, pw


class MaxPoolWithArgmax(Kernel):
    """Outputs (max, index), each (N, C, out_h, out_w) float32."""

    op = OpCode.MAX_POOL_WITH_ARGMAX

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank != 4:
            raise self.fail(f"input must be NCHW, got shape {list(x.shape)}")
        self.window = _window(self, attrs)
        _, _, sh, sw, ph, pw = self.window
        oh, ow = attrs.ints("output_size", [0, 0])
        if oh < 1 or ow < 1:
            raise self.fail(f"output_size {[oh, ow]} must be positive")
        n, c, h, w = x.shape
        if (oh - 1) * sh - ph >= h or (ow - 1) * sw - pw >= w:
            raise self.fail(f"output_size {[oh, ow]} has windows past the {h}x{w} input")
        shape = (n, c, oh, ow)
        self.output_specs = [TensorSpec(shape, x.dtype), TensorSpec(shape, np.dtype(np.float32))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, best, where = required(inputs, 0), outputs[0], outputs[1]
        kh, kw, sh, sw, ph, pw = self.window
        n, c, oh, ow = best.shape
        h, w = x.shape[2:]
        # A padded copy wide enough for every window; padding is -inf, which a strict
        # "greater than" never picks over the initial lowest value.
        ph_end = max((oh - 1) * sh + kh - ph - h, 0)
        pw_end = max((ow - 1) * sw + kw - pw - w, 0)
        padded = np.full((n, c, h + ph + ph_end, w + pw + pw_end), -np.inf, x.dtype)
        inner = padded[:, :, ph : ph + h, pw : pw + w]
        views = [
            (
                fy * kw + fx,
                padded[:, :, fy : fy + (oh - 1) * sh + 1 : sh, fx : fx + (ow - 1) * sw + 1 : sw],
            )
            for fy in range(kh)
            for fx in range(kw)
        ]
        index = np.empty(best.shape, np.int64)
        better = np.empty(best.shape, np.bool_)
        lowest = np.finfo(best.dtype).min

        def compute() -> None:
            np.copyto(inner, x)
            best.fill(lowest)
            index.fill(0)
            for k, view in views:
                np.greater(view, best, out=better)
                np.copyto(best, view, where=better)
                index[better] = k
            np.add(index, 0.1, out=where, casting="unsafe")

        return compute


class MaxUnpool(Kernel):
    """inputs (values, index) of one shape; output (N, C, *output_size)."""

    op = OpCode.MAX_UNPOOL
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, index = self.require_float(0), self.input(1)
        if x.rank != 4 or index.shape != x.shape:
            raise self.fail(
                f"values {list(x.shape)} and indices {list(index.shape)} must be one NCHW shape"
            )
        self.window = _window(self, attrs)
        oh, ow = attrs.ints("output_size", REQUIRED)
        if oh < 0 or ow < 0:
            raise self.fail(f"output_size {[oh, ow]} must not be negative")
        self.output_specs = [TensorSpec((*x.shape[:2], oh, ow), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, index, out = required(inputs, 0), required(inputs, 1), outputs[0]
        _, kw, sh, sw, ph, pw = self.window
        n, c, h, w = x.shape
        oh, ow = out.shape[2:]
        rows = (np.arange(h) * sh - ph).reshape(h, 1)
        cols = (np.arange(w) * sw - pw).reshape(1, w)
        flat_out = out.reshape(n * c, oh * ow)
        flat_x = x.reshape(n * c, h * w)
        plane = np.arange(n * c).reshape(-1, 1)

        def compute() -> None:
            k = index.astype(np.int64)  # truncated, as in C
            y = rows + k // kw
            xx = cols + k % kw
            ok = ((k >= 0) & (y >= 0) & (y < oh) & (xx >= 0) & (xx < ow)).reshape(n * c, -1)
            target = (y * ow + xx).reshape(n * c, -1)
            out.fill(0)
            p = np.broadcast_to(plane, ok.shape)
            flat_out[p[ok], target[ok]] = flat_x[ok]

        return compute
