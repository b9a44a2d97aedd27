"""Quantized Conv2D (groups and depthwise included) on NCHW int8/uint8 tensors.

acc[n, o, y, x] = bias[o] + sum (q_x - z_x) * (q_w - z_w[o]) over the window, in int32
semantics; out = clamp(z_out + MultiplyByQuantizedMultiplier(acc, s_x * s_w[o] / s_out)).

The integer sum runs as the float convolution over shifted float copies of input and
weights (see gemm.py for why it is exact): the float Conv2D kernel is reused with
run-time weights, so it keeps its pointwise, depthwise and im2col strategies (never
Winograd, whose transforms are not exact). Padding is real zero, i.e. q = z_x, which is
0.0 after the shift. The weights stay int8 between calls; their float copy, the shifted
input and the accumulators live in the plan's shared scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.kernels.quantized.gemm import exact_float_dtype, max_abs_shifted, weight_bound
from sporenet.lite.ops import OpCode


def shifted_weights(
    kernel: QuantizedKernel, w: TensorSpec, out_channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """The constant weights minus their zero points (int8 when that fits, else int16) and
    the per-output-channel scales, checked against the output channel count."""
    q = w.quant
    if w.value is None:
        raise kernel.fail("weights must be a constant known when the model loads")
    if q is None or w.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise kernel.fail(f"weights must be int8/uint8 with quantization, got {w.dtype}")
    if q.scale.size not in (1, out_channels) or (q.scale.size > 1 and q.axis != 0):
        raise kernel.fail(
            f"weights must be quantized per tensor or per output channel "
            f"(axis 0, {out_channels} scales), got {q.scale.size} scales on "
            f"axis {q.axis}"
        )
    zp = q.zero_point.astype(np.int64) if q.zero_point.size else np.zeros(1, np.int64)
    scales = np.broadcast_to(q.scale.astype(np.float64), (out_channels,))
    if not zp.any():
        return w.value, scales
    shape = (out_channels,) + (1,) * (w.rank - 1)
    shifted = w.value.astype(np.int16) - np.broadcast_to(zp, (out_channels,)).reshape(shape)
    if shifted.min() >= -128 and shifted.max() <= 127:
        shifted = shifted.astype(np.int8)
    return shifted, scales


def bias_values(kernel: QuantizedKernel, index: int, out_channels: int) -> np.ndarray | None:
    """A constant int32 bias (scale s_x * s_w, zero point 0) as int64, or None."""
    spec = kernel.optional_input(index)
    if spec is None:
        return None
    if spec.value is None or spec.dtype != np.int32:
        raise kernel.fail(
            f"bias must be a constant int32 tensor, got {spec.dtype}"
            f"{'' if spec.value is not None else ' (not constant)'}"
        )
    if spec.shape != (out_channels,):
        raise kernel.fail(f"bias must have shape [{out_channels}], got {list(spec.shape)}")
    return spec.value.astype(np.int64)


class QConv2D(QuantizedKernel):
    """int8/uint8 Conv2D: x (N, C, H, W), constant w (O, C/group, kh, kw) quantized per
    tensor or per output channel, optional int32 bias (O,)."""

    op = OpCode.CONV2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.quantized_input(0), self.input(1)
        sx, zx = self.tensor_params(x, "the input")
        if w.rank != 4:
            raise self.fail(
                f"weights must be 4-D (out_ch, in_ch/group, kh, kw), got shape {list(w.shape)}"
            )
        o = w.shape[0]
        self.w, scales = shifted_weights(self, w, o)
        self.bias = bias_values(self, 2, o)
        ftype = exact_float_dtype(weight_bound(max_abs_shifted(x.dtype, zx), self.w, (1, 2, 3)))
        float_attrs = Attrs(
            attrs.op,
            {k: v for k, v in attrs.values.items() if k != "activation"},
            attrs.num_outputs,
        )
        self.inner = Conv2D(float_attrs, [TensorSpec(x.shape, ftype), TensorSpec(w.shape, ftype)])
        shape = self.inner.output_specs[0].shape
        oq = self.output_quant(x.dtype)
        so, zo = float(oq.scale.flat[0]), int(oq.zero_point.flat[0]) if oq.zero_point.size else 0
        lo, hi = self.fused_clamp(so, zo, x.dtype)
        self.requant = Requantizer((sx * scales / so).reshape(o, 1, 1), zo, lo, hi)
        self.zx = ftype.type(zx)
        self.output_specs = [self.out_spec(shape, x.dtype, oq)]
        self.scratch_layout = [
            (x.shape, ftype),
            (w.shape, ftype),
            (shape, ftype),
            (shape, np.dtype(np.int64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        xf, wf, accf, acc = self.scratch_arrays()
        main = self.inner.bind([xf, wf], [accf])
        w, zx, requant, copyto, subtract = self.w, self.zx, self.requant, np.copyto, np.subtract
        bias = None if self.bias is None else self.bias.reshape(-1, 1, 1)

        def compute() -> None:
            subtract(x, zx, out=xf)
            copyto(wf, w)
            main()
            copyto(acc, accf, casting="unsafe")
            if bias is not None:
                np.add(acc, bias, out=acc)
            requant.apply(acc, out)

        return compute
