"""DYNAMIC_QUANTIZE: ONNX DynamicQuantizeLinear's values, for dynamically quantized models.

The integer products of a dynamically quantized model (ConvInteger, MatMulInteger) read
x quantized to uint8 at run time less its zero point. This kernel gives those values as
float32 (small integers, exact) in one step, with the same float32 arithmetic and
ties-to-even rounding as onnxruntime's DynamicQuantizeLinear:

    lo, hi = min(min(x), 0), max(max(x), 0)
    scale = (hi - lo) / 255                   (1 when x is all zeros)
    zero_point = clamp(round(-lo / scale), 0, 255)
    y = clamp(round(x / scale), -zero_point, 255 - zero_point)

so zero_point + y is the uint8 value DynamicQuantizeLinear writes. Outputs (y, scale,
zero_point); scale and zero_point are float32 scalars.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from sporenet.lite.kernels.base import Attrs, ChannelsLast, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode

_FLOAT32 = np.dtype(np.float32)


class DynamicQuantize(Kernel):
    """x -> (y, scale, zero_point) of DynamicQuantizeLinear (see the module docstring)."""

    op = OpCode.DYNAMIC_QUANTIZE
    num_inputs = (1, 1)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype != _FLOAT32:
            raise self.fail(f"x must be float32, got {x.dtype}")
        if x.size == 0:
            raise self.fail(f"x must have at least one element, got shape {list(x.shape)}")
        self.output_specs = [
            TensorSpec(x.shape, _FLOAT32),
            TensorSpec((), _FLOAT32),
            TensorSpec((), _FLOAT32),
        ]

    # Every step is elementwise or a whole-tensor reduction: any memory layout will do.
    def channels_last_input(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED if index == 0 else ChannelsLast.REFUSED

    # y keeps x's layout: a channels-last chain between convolutions stays so through the
    # quantization, instead of converting in this step's passes.
    elementwise = True

    def channels_last_follows(self, index: int) -> int | None:
        return 0 if index == 0 else None

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = cast(np.ndarray, inputs[0])  # a required input
        y, scale_out, zp_out = outputs
        f32 = np.float32
        zero, one, levels = f32(0), f32(1), f32(255)
        lowest, highest = np.minimum.reduce, np.maximum.reduce
        # np.clip: one pass, where maximum then minimum take two (and each is slower).
        divide, rint, clip = np.divide, np.rint, np.clip
        flat = x.reshape(-1) if x.flags.c_contiguous else x

        def compute() -> None:
            x_lo, x_hi = f32(lowest(flat, axis=None)), f32(highest(flat, axis=None))
            lo, hi = min(x_lo, zero), max(x_hi, zero)
            scale = f32(f32(hi - lo) / levels)
            if scale == zero:
                scale = one
            zp = min(max(f32(np.rint(f32(-f32(lo / scale)))), zero), levels)
            divide(x, scale, out=y)
            rint(y, out=y)
            # Division by a positive scale and rounding are monotonic, so every y lies
            # between the quantized min and max: the clamp only runs when one of those
            # falls outside the range (a zero point rounded away from -lo / scale; NaN).
            low, high = -zp, f32(levels - zp)
            if not (rint(f32(x_lo / scale)) >= low and rint(f32(x_hi / scale)) <= high):
                clip(y, low, high, out=y)
            scale_out[...] = scale
            zp_out[...] = zp

        return compute
