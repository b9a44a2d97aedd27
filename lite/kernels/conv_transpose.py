"""ConvTranspose2D on NCHW float tensors (ONNX ConvTranspose attribute semantics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.conv_common import check_filter, conv_operands, with_epilogue
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


class ConvTranspose2D(Kernel):
    """Transposed 2-D convolution (ONNX ConvTranspose): x (N, C, H, W), w (C, O/group, kh,
    kw), optional bias (O,).

    Attributes: strides, dilations, pads [top, left, bottom, right], output_padding,
    group, kernel_shape and the fused `activation`; auto_pad NOTSET or VALID (the SAME
    modes and `output_shape` are refused: converters resolve them to explicit pads).
    One GEMM gives every input pixel's contribution to each kernel tap (col2im columns);
    kh*kw strided adds scatter them onto a zeroed canvas, which is cropped by the pads.
    """

    op = OpCode.CONV_TRANSPOSE2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w, bias, group = conv_operands(self, "in_ch, out_ch/group")
        n, c, h, wd = x.shape
        if group < 1 or c % group:
            raise self.fail(f"group={group} must be positive and divide the input channels ({c})")
        if w.shape[0] != c:
            raise self.fail(
                f"input has {c} channels but weights {list(w.shape)} expect {w.shape[0]}"
            )
        o = w.shape[1] * group
        kh, kw = w.shape[2:]
        check_filter(self, w, bias, o)
        auto_pad = attrs.str("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID") or attrs.ints("output_shape", None) is not None:
            raise self.fail(
                "only explicit pads are supported (auto_pad NOTSET or VALID, no output_shape)"
            )
        strides = attrs.ints("strides", [1, 1])
        dilations = attrs.ints("dilations", [1, 1])
        pads = [0, 0, 0, 0] if auto_pad == "VALID" else attrs.ints("pads", [0, 0, 0, 0])
        out_pad = attrs.ints("output_padding", [0, 0])
        for name, values, size, low in (
            ("strides", strides, 2, 1),
            ("dilations", dilations, 2, 1),
            ("pads", pads, 4, 0),
            ("output_padding", out_pad, 2, 0),
        ):
            if len(values) != size or any(v < low for v in values):
                raise self.fail(f"{name} must hold {size} values >= {low}, got {values}")
        if any(p >= s and p >= d for p, s, d in zip(out_pad, strides, dilations, strict=True)):
            raise self.fail(
                f"output_padding {out_pad} must be smaller than the strides "
                f"{strides} or the dilations {dilations}"
            )
        canvas = [
            s * (i - 1) + (k - 1) * d + 1 + p
            for s, i, k, d, p in zip(strides, (h, wd), (kh, kw), dilations, out_pad, strict=True)
        ]
        out_hw = [canvas[0] - pads[0] - pads[2], canvas[1] - pads[1] - pads[3]]
        if min(out_hw) < 1:
            raise self.fail(f"pads {pads} leave no output (uncropped size {canvas})")
        self.strides, self.dilations, self.pads = strides, dilations, pads
        self.canvas, self.group = tuple(canvas), group
        self.activation = fused_activation(self.op.name, attrs.values)
        self.output_specs = [TensorSpec((n, o, *out_hw), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        n, c, h, wd = x.shape
        g = self.group
        cg, og, kh, kw = c // g, w.shape[1], w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = self.strides, self.dilations
        # (g, og*kh*kw, cg): each group's weights transposed, so cols = wt @ x.
        wt = w.reshape(g, cg, og * kh * kw).transpose(0, 2, 1)
        if self.input(1).value is not None:
            wt = np.ascontiguousarray(wt)
        xg = x.reshape(n, g, cg, h * wd)
        cols = temporary((n, g, og * kh * kw, h * wd), x.dtype)
        taps = cols.reshape(n, g * og, kh, kw, h, wd)
        matmul, add, copyto = np.matmul, np.add, np.copyto
        if (kh, kw) == (sh, sw) and (dh, dw) == (1, 1) and tuple(out.shape[2:]) == self.canvas:
            # Taps that tile the output without overlap (kernel == stride, no padding, as
            # in upsampling layers): each output element comes from one tap, so copies
            # replace the zeroed canvas, the adds and the crop. One copy per tap: a
            # single 6-D copy runs NumPy's loop over the output's order, innermost the
            # kw taps of one pixel (runs of 2 for 2x2); per tap, the inner loop is a
            # row of W pixels (a 16 -> 1 channel 2x2 layer on 128x128: 309 -> 65 us).
            tiles = out.reshape(n, g * og, h, kh, wd, kw).transpose(0, 1, 3, 5, 2, 4)
            pairs = [(tiles[:, :, i, j], taps[:, :, i, j]) for i in range(kh) for j in range(kw)]

            def tiled() -> None:
                matmul(wt, xg, out=cols)
                for dst, src in pairs:
                    copyto(dst, src)

            bias_const = bias is not None and self.input(2).value is not None
            return with_epilogue(tiled, out, bias, self.activation, bias_const)

        canvas = temporary((n, g * og, *self.canvas), x.dtype)
        adds = [
            (
                canvas[
                    :,
                    :,
                    i * dh : i * dh + sh * (h - 1) + 1 : sh,
                    j * dw : j * dw + sw * (wd - 1) + 1 : sw,
                ],
                taps[:, :, i, j],
            )
            for i in range(kh)
            for j in range(kw)
        ]
        top, left = self.pads[0], self.pads[1]
        oh, ow = out.shape[2:]
        crop = canvas[:, :, top : top + oh, left : left + ow]

        def main() -> None:
            matmul(wt, xg, out=cols)
            canvas.fill(0)
            for dst, src in adds:
                add(dst, src, out=dst)
            copyto(out, crop)

        bias_const = bias is not None and self.input(2).value is not None
        return with_epilogue(main, out, bias, self.activation, bias_const)
