"""int16x8 Conv2D (groups and depthwise included) and FullyConnected, as TFLite's
reference integer kernels for 16-bit activations and 8-bit weights.

acc = bias + sum (q_x - z_x) * (q_w - z_w[o]) in int64 (the bias is int64, or int32);
out = clamp(z_out + MultiplyByQuantizedMultiplier(acc, s_x s_w[o] / s_out)) with
TFLite's int64 forms of the multiplication (`WideRequantizer`: a 16-bit multiplier for
convolutions, the full one with a single rounding for FullyConnected).

A product is below 2^23 in magnitude, so every partial sum of a reduction shorter than
2^30 is an integer float64 holds exactly: the sums run as the float kernels (the float
Conv2D's im2col or depthwise strategies on run-time weights, never Winograd; a GEMM for
FullyConnected) over float64 copies, then move to int64 for the bias and rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.conv import bias_values, shifted_weights
from sporenet.lite.kernels.quantized.fixed_point import WideRequantizer
from sporenet.lite.kernels.quantized.linear import fully_connected_shape
from sporenet.lite.ops import OpCode

F64, I64 = np.dtype(np.float64), np.dtype(np.int64)
_EXACT_TERMS = 1 << 30  # products below 2^23: sums of fewer terms stay below 2^53


class _Int16x8(QuantizedKernel):
    """What the int16x8 accumulating kernels share: int16 activations, int8 weights
    (read as stored: the planner leaves them integer), the output stage."""

    accepts = INT16_DTYPES
    quantized_weights = frozenset({1})

    reduced_multiplier = True  # see WideRequantizer

    def prepare_stage(self, out_channels: int, channel_shape: tuple[int, ...]) -> None:
        x, w = self.quantized_input(0), self.input(1)
        self.sx, zx = self.tensor_params(x, "the input")
        self.zx = np.float64(zx)
        weights, scales = shifted_weights(self, w, out_channels)
        self.weights = weights.astype(np.float64)
        self.weights.flags.writeable = False
        if self.weights[0].size >= _EXACT_TERMS:
            raise self.fail(f"a reduction of {self.weights[0].size} terms is too long")
        bias = bias_values(self, 2, out_channels, (np.dtype(np.int64), np.dtype(np.int32)))
        if bias is None:
            bias = np.zeros(out_channels, np.int64)
        self.bias = bias.reshape(channel_shape)
        oq, so, zo = self.declared_output(x.dtype)
        lo, hi = self.fused_clamp(so, zo, x.dtype)
        reals = (self.sx * scales / so).reshape(channel_shape)
        self.requant = WideRequantizer(reals, zo, lo, hi, reduced=self.reduced_multiplier)
        self.oq = oq


class QConv2D16(_Int16x8):
    """int16 Conv2D: x (N, C, H, W), constant int8 w (O, C/group, kh, kw) per tensor or
    per output channel, optional int64 bias (O,)."""

    op = OpCode.CONV2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.quantized_input(0), self.input(1)
        if w.rank != 4:
            raise self.fail(
                f"weights must be 4-D (out_ch, in_ch/group, kh, kw), got shape {list(w.shape)}"
            )
        self.prepare_stage(w.shape[0], (w.shape[0], 1, 1))
        float_attrs = Attrs(
            attrs.op,
            {k: v for k, v in attrs.values.items() if k not in ("activation", "rounding")},
            attrs.num_outputs,
        )
        # Run-time weights: the float kernel never picks Winograd (its transforms round).
        self.inner = Conv2D(float_attrs, [TensorSpec(x.shape, F64), TensorSpec(w.shape, F64)])
        shape = self.inner.output_specs[0].shape
        self.output_specs = [self.out_spec(shape, x.dtype, self.oq)]
        self.scratch_layout = [(x.shape, F64), (shape, F64), (shape, I64)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        xf, accf, acc = self.scratch_arrays()
        main = self.inner.bind([xf, self.weights], [accf])
        zx, bias, requant = self.zx, self.bias, self.requant
        subtract, copyto, add = np.subtract, np.copyto, np.add

        def compute() -> None:
            subtract(x, zx, out=xf)
            main()
            copyto(acc, accf, casting="unsafe")
            add(acc, bias, out=acc)
            requant.apply(acc, out)

        return compute


class QFullyConnected16(_Int16x8):
    """int16 FullyConnected: x (..., K), constant int8 w (O, K) per tensor or per output
    channel, optional int64 bias (O,); fused relu/relu6/clip as clamps."""

    op = OpCode.FULLY_CONNECTED
    num_inputs = (2, 3)
    reduced_multiplier = False

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.quantized_input(0), self.input(1)
        o, k = fully_connected_shape(self, x, w)
        self.prepare_stage(o, (o,))
        self.weights_t = np.ascontiguousarray(self.weights.T)
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        self.output_specs = [self.out_spec((*x.shape[:-1], o), x.dtype, self.oq)]
        self.scratch_layout = [((rows, k), F64), ((rows, o), F64), ((rows, o), I64)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        xf, accf, acc = self.scratch_arrays()
        x2, out2 = x.reshape(xf.shape), out.reshape(acc.shape)
        w_t, zx, bias, requant = self.weights_t, self.zx, self.bias, self.requant
        subtract, matmul, copyto, add = np.subtract, np.matmul, np.copyto, np.add

        def compute() -> None:
            subtract(x2, zx, out=xf)
            matmul(xf, w_t, out=accf)
            copyto(acc, accf, casting="unsafe")
            add(acc, bias, out=acc)
            requant.apply(acc, out2)

        return compute
