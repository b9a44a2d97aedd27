"""Quantized RESIZE (NCHW int8/uint8, output parameters equal to the input's, as TFLite
requires):

- nearest: the float kernel's choice of source pixel, found once at bind by resizing a
  plane of pixel numbers, then a gather of the integers;
- linear (int8, int16): TFLite's reference integer bilinear resize: source coordinates in
  1/1024 pixel steps (scale_10 = round(1024 * in / out), or (in - 1) / (out - 1) with
  align_corners, less half a pixel with half_pixel_centers), the four neighbours
  weighted in 2^-20 and rounded half away from zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import resize
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.ops import OpCode


def _c_div(a: np.ndarray, b: int) -> np.ndarray:
    """C's integer division: toward zero."""
    return np.sign(a) * (np.abs(a) // b)


def _coordinates(out: int, size: int, align: bool, half: bool) -> tuple[np.ndarray, ...]:
    """(scaled, low, high) source coordinates of each output position, as TFLite's
    ComputeInterpolationValuesInteger."""
    scale = ((1 << 10) * size + out // 2) // out
    if align and out > 1:
        scale = ((1 << 10) * (size - 1) + (out - 1) // 2) // (out - 1)
    value = np.arange(out, dtype=np.int64)
    scaled = value * scale + scale // 2 - (1 << 9) if half else value * scale
    low = np.maximum(_c_div(scaled, 1 << 10), 0)
    high = np.minimum(_c_div(scaled + (1 << 10) - 1, 1 << 10), size - 1)
    return scaled, low, high


class QResize(QuantizedKernel):
    op = OpCode.RESIZE
    num_inputs = (1, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        params = self.tensor_params(x, "the input")
        oq = attrs.output_quant[0] if attrs.output_quant else None
        if (
            oq is not None
            and self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output") != params
        ):
            raise self.fail("output quantization must equal the input's")
        if x.rank != 4:
            raise self.fail(f"input must be NCHW, got shape {list(x.shape)}")
        float_x = TensorSpec(x.shape, np.dtype(np.float32))
        self.inner = resize.Resize(attrs, [float_x, *self.inputs[1:]])
        n, c, oh, ow = self.inner.output_specs[0].shape
        if (n, c) != x.shape[:2]:
            raise self.fail("only the spatial axes (2, 3) may be resized")
        self.mode = self.inner.mode
        transform = self.inner.transform
        if self.mode == "linear":
            integer = x.dtype in (np.dtype(np.int8), np.dtype(np.int16))
            if not integer or transform not in ("align_corners", "half_pixel", "asymmetric"):
                raise self.fail(
                    f"int8 bilinear resizing takes align_corners, half_pixel or asymmetric "
                    f"coordinates on int8 or int16, got {transform!r} on {x.dtype}"
                )
        elif self.mode != "nearest":
            raise self.fail(f"mode {self.mode!r} has no int8 form (nearest, linear)")
        self.transform = transform
        quant = self.quantization(x, "the input")
        self.output_specs = [self.out_spec((n, c, oh, ow), x.dtype, quant)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        out = outputs[0]
        n, c, h, w = x.shape
        oh, ow = out.shape[2:]
        if self.mode == "nearest":
            # The eager helpers import the kernel registry, which imports this module.
            from sporenet.lite.eager import evaluate, prepare_kernel

            plane = TensorSpec((1, 1, h, w), np.dtype(np.float32))
            sizes = dict(self.attrs.values, sizes=[1, 1, oh, ow])
            kernel = prepare_kernel(OpCode.RESIZE, sizes, [plane], 1)
            numbers = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
            (picked,) = evaluate(kernel, [numbers])
            source = picked.reshape(-1).astype(np.int64)
            flat_x, flat_out = x.reshape(n, c, h * w), out.reshape(n, c, oh * ow)

            def nearest() -> None:
                np.take(flat_x, source, axis=2, out=flat_out)

            return nearest
        align, half = self.transform == "align_corners", self.transform == "half_pixel"
        ys, y0, y1 = _coordinates(oh, h, align, half)
        xs, x0, x1 = _coordinates(ow, w, align, half)
        dy = (ys - (1 << 10) * y0).reshape(-1, 1)
        dx = (xs - (1 << 10) * x0).reshape(1, -1)
        weights = [
            ((1 << 10) - dy) * ((1 << 10) - dx),
            dy * ((1 << 10) - dx),
            ((1 << 10) - dy) * dx,
            dy * dx,
        ]
        corners = [(y0, x0), (y1, x0), (y0, x1), (y1, x1)]
        acc = np.empty((n, c, oh, ow), np.int64)

        def compute() -> None:
            acc.fill(0)
            for (ry, rx), weight in zip(corners, weights, strict=True):
                np.add(acc, x[:, :, ry[:, None], rx[None, :]].astype(np.int64) * weight, out=acc)
            rounded = acc + np.where(acc > 0, 1 << 19, -(1 << 19))
            np.copyto(out, _c_div(rounded, 1 << 20), casting="unsafe")

        return compute
