"""Quantized CONV2D_BACKPROP_INPUT: TFLite's int8 TRANSPOSE_CONV on NCHW tensors.

inputs (x, w, -, bias): x (N, I, H, W) int8, w (I, O, kh, kw) int8 symmetric (per tensor or
per output channel, axis 1), an optional int32 bias (scale s_x * s_w[o]) as input 3.
acc[n, o] = bias[o] + the scatter of (q_x - z_x) * q_w over the windows, cropped by
`pads` [top, left, bottom, right] to `input_shape`; out = clamp(z_out +
MultiplyByQuantizedMultiplier(acc, s_x * s_w[o] / s_out)), as TFLite's reference integer
TransposeConv. The products are summed in float64, exact for any int8 layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.base import REQUIRED, Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, WideRequantizer
from sporenet.lite.ops import OpCode


class QConv2DBackpropInput(QuantizedKernel):
    op = OpCode.CONV2D_BACKPROP_INPUT
    num_inputs = (2, 4)
    bias_dtypes: ClassVar[tuple[np.dtype, ...]] = (np.dtype(np.int32),)

    def requantizer(
        self, reals: np.ndarray, zero_point: int, lo: int, hi: int
    ) -> Requantizer | WideRequantizer:
        """The output stage: TFLite's int32 MultiplyByQuantizedMultiplier."""
        return Requantizer(reals, zero_point, lo, hi)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, self.zx = self.tensor_params(x, "the input")
        w = self.input(1)
        if x.rank != 4 or w.rank != 4 or w.shape[0] != x.shape[1]:
            raise self.fail(f"input {list(x.shape)} and weights {list(w.shape)} do not match")
        q = w.quant
        if w.value is None or q is None or w.dtype != np.int8 or q.zero_point.any():
            raise self.fail("weights must be constant int8 with zero points 0")
        channels = w.shape[1]
        if q.scale.size not in (1, channels) or (q.scale.size > 1 and q.axis != 1):
            raise self.fail("weights need one scale or one per output channel (axis 1)")
        self.sh, self.sw = attrs.ints("strides", [1, 1])
        self.pads = attrs.ints("pads", [0, 0, 0, 0])
        given = attrs.ints("input_shape", REQUIRED)
        if len(given) != 4 or given[1] != channels or min(self.pads) < 0:
            raise self.fail(f"input_shape {given} and pads {self.pads} do not fit the weights")
        n = x.shape[0] if given[0] == -1 else given[0]
        shape = (n, channels, given[2], given[3])
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        scales = np.broadcast_to(q.scale.astype(np.float64), (channels,))
        lo, hi = self.fused_clamp(so, zo, x.dtype)
        self.requant = self.requantizer((sx * scales / so).reshape(1, -1, 1, 1), zo, lo, hi)
        bias = self.optional_input(3)
        self.bias = None
        if bias is not None:
            if bias.value is None or bias.dtype not in self.bias_dtypes or bias.size != channels:
                names = " or ".join(str(d) for d in self.bias_dtypes)
                raise self.fail(f"bias must be a constant {names} of {channels} values")
            self.bias = bias.value.astype(np.int64).reshape(1, -1, 1, 1)
        self.weights = w.value.astype(np.float64).reshape(w.shape[0], -1)
        self.output_specs = [self.out_spec(shape, x.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        out = outputs[0]
        n, cin, h, w = x.shape
        _, cout, oh, ow = out.shape
        kh, kw = self.input(1).shape[2:]
        sh, sw, (top, left, _, _) = self.sh, self.sw, self.pads
        full = np.zeros(
            (n, cout, max((h - 1) * sh + kh, top + oh), max((w - 1) * sw + kw, left + ow))
        )
        weights, bias, requant, zx = self.weights, self.bias, self.requant, self.zx
        acc = np.empty(out.shape, np.int64)

        def compute() -> None:
            shifted = (x.astype(np.float64) - zx).reshape(n, cin, h * w).transpose(0, 2, 1)
            cols = (shifted @ weights).reshape(n, h, w, cout, kh, kw)
            full.fill(0)
            for fy in range(kh):
                for fx in range(kw):
                    view = full[
                        :, :, fy : fy + (h - 1) * sh + 1 : sh, fx : fx + (w - 1) * sw + 1 : sw
                    ]
                    view += cols[:, :, :, :, fy, fx].transpose(0, 3, 1, 2)
            np.copyto(acc, full[:, :, top : top + oh, left : left + ow], casting="unsafe")
            if bias is not None:
                np.add(acc, bias, out=acc)
            requant.apply(acc, out)

        return compute


class QConv2DBackpropInput16(QConv2DBackpropInput):
    """int16x8 TRANSPOSE_CONV: int16 input, int8 weights, int64 bias, TFLite's int64
    requantization with the 16-bit reduced multiplier, as its convolutions."""

    accepts = INT16_DTYPES
    quantized_weights = frozenset({1})  # the int8 weights are read as stored
    bias_dtypes = (np.dtype(np.int64), np.dtype(np.int32))

    def requantizer(
        self, reals: np.ndarray, zero_point: int, lo: int, hi: int
    ) -> Requantizer | WideRequantizer:
        return WideRequantizer(reals, zero_point, lo, hi, reduced=True)
