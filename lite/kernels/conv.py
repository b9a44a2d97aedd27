"""Conv2D and ConvTranspose2D on NCHW float tensors (ONNX attribute semantics).

Conv2D picks one of three strategies when the model is planned:

- pointwise: a 1x1, stride-1, unpadded, ungrouped convolution is one GEMM per image on the
  (C, H*W) view of the input, with no copy at all;
- depthwise: group == in_channels == out_channels runs as kh*kw vectorised multiply-adds of
  whole shifted planes (one per kernel tap), which beats building columns for 9 taps;
- im2col: everything else. The column matrix is a strided view of the (padded) input,
  copied into a buffer allocated once in `bind`, then multiplied with the weights
  (pre-shaped to (groups, out/groups, in/groups*kh*kw)) by BLAS.

Weights (out_ch, in_ch/group, kh, kw) may be constants or run-time tensors: every weight
view is taken in `bind`, where the arrays are final.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.spatial import Window, check_nchw, padded_buffer, window
from sporenet.lite.ops import OpCode


def im2col_view(xp: np.ndarray, win: Window) -> np.ndarray:
    """Read-only (N, C, kh, kw, OH, OW) view of a padded input: the column matrix of `win`."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    (kh, kw), (oh, ow) = win.kernel, win.out
    (th, tw), (dh, dw) = win.strides, win.dilations
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, kh, kw, oh, ow),
        strides=(sn, sc, sh * dh, sw * dw, sh * th, sw * tw), writeable=False,
    )


class Conv2D(Kernel):
    """2-D convolution: x (N, C, H, W), w (O, C/group, kh, kw), optional bias (O,).

    Attributes: strides, dilations, pads [top, left, bottom, right], auto_pad, group,
    kernel_shape (checked against the weights when given) and the fused `activation`.
    """

    op = OpCode.CONV2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.require_float(0), self.require_float(1)
        bias = self.optional_input(2)
        check_nchw(self, x.shape)
        if w.rank != 4:
            raise self.fail(
                f"weights must be 4-D (out_ch, in_ch/group, kh, kw), got shape {list(w.shape)}"
            )
        if x.dtype != w.dtype:
            raise self.fail(f"input dtype {x.dtype} differs from weight dtype {w.dtype}")
        group = attrs.int("group", 1)
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        if group < 1 or c % group or o % group:
            raise self.fail(
                f"group={group} must be positive and divide both the input channels ({c}) "
                f"and the output channels ({o})"
            )
        if cg * group != c:
            raise self.fail(
                f"input has {c} channels but weights {list(w.shape)} with group={group} "
                f"expect {cg * group}"
            )
        kernel_shape = attrs.ints("kernel_shape", None)
        if kernel_shape is not None and list(kernel_shape) != [kh, kw]:
            raise self.fail(f"kernel_shape {kernel_shape} differs from the weights' {[kh, kw]}")
        if bias is not None and bias.shape != (o,):
            raise self.fail(f"bias must have shape [{o}], got {list(bias.shape)}")
        if bias is not None and bias.dtype != x.dtype:
            raise self.fail(f"bias dtype {bias.dtype} differs from input dtype {x.dtype}")
        self.win = window(self, (h, wd), (kh, kw), attrs)
        self.group = group
        self.activation = fused_activation(self.op.name, attrs.values)
        self.output_specs = [TensorSpec((n, o, *self.win.out), x.dtype)]
        if kh == kw == 1 and self.win.strides == (1, 1) and not self.win.padded and group == 1:
            self.strategy = "pointwise"
        elif group == c == o:
            self.strategy = "depthwise"
        else:
            self.strategy = "im2col"

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if self.strategy == "depthwise":
            main = self._bind_depthwise(x, w, out)
        elif self.strategy == "pointwise":
            main = self._bind_pointwise(x, w, out)
        else:
            main = self._bind_im2col(x, w, out)
        return _with_epilogue(main, out, bias, self.activation)

    def _bind_pointwise(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        n, c, h, wd = x.shape
        o = w.shape[0]
        w2 = w.reshape(o, c)
        matmul = np.matmul
        if n == 1:
            x2, out2 = x.reshape(c, h * wd), out.reshape(o, h * wd)
        else:
            x2, out2 = x.reshape(n, c, h * wd), out.reshape(n, o, h * wd)
        return lambda: matmul(w2, x2, out=out2)

    def _bind_im2col(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        win, g = self.win, self.group
        n = x.shape[0]
        o, cg, kh, kw = w.shape
        oh, ow = win.out
        copyto, matmul = np.copyto, np.matmul
        if win.padded:
            xp, interior = padded_buffer(x, win, 0.0)
        else:
            xp, interior = x, None
        src = im2col_view(xp, win)
        cols = np.empty(src.shape, x.dtype)
        k = cg * kh * kw
        if g == 1 and n == 1:
            # The common case as one plain 2-D GEMM: (O, K) @ (K, OH*OW).
            wmat, cmat, omat = w.reshape(o, k), cols.reshape(k, oh * ow), out.reshape(o, -1)
        else:
            wmat = w.reshape(g, o // g, k)
            cmat = cols.reshape(n, g, k, oh * ow)
            omat = out.reshape(n, g, o // g, oh * ow)
        if interior is None:
            def compute() -> None:
                copyto(cols, src)
                matmul(wmat, cmat, out=omat)
        else:
            def compute() -> None:
                copyto(interior, x)
                copyto(cols, src)
                matmul(wmat, cmat, out=omat)
        return compute

    def _bind_depthwise(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        win = self.win
        c = x.shape[1]
        kh, kw = win.kernel
        if win.padded:
            xp, interior = padded_buffer(x, win, 0.0)
        else:
            xp, interior = x, None
        # One (plane view, per-channel weight) pair per tap; weights shaped (C, 1, 1).
        taps = [(xp[(..., *win.tap(i, j))], w[:, 0, i, j].reshape(c, 1, 1))
                for i in range(kh) for j in range(kw)]
        (v0, w0), rest = taps[0], taps[1:]
        tmp = np.empty_like(out)
        copyto, multiply, add = np.copyto, np.multiply, np.add

        def compute() -> None:
            if interior is not None:
                copyto(interior, x)
            multiply(v0, w0, out=out)
            for v, wt in rest:
                multiply(v, wt, out=tmp)
                add(out, tmp, out=out)

        return compute


def _with_epilogue(main: Compute, out: np.ndarray, bias: np.ndarray | None,
                   act: object) -> Compute:
    """Wrap a convolution step with the bias add and the fused activation (both in place)."""
    if bias is None and act is None:
        return main
    b = None if bias is None else bias.reshape(-1, 1, 1)
    add = np.add
    if act is None:
        def with_bias() -> None:
            main()
            add(out, b, out=out)
        return with_bias
    if b is None:
        def with_act() -> None:
            main()
            act(out)  # type: ignore[operator]
        return with_act

    def with_both() -> None:
        main()
        add(out, b, out=out)
        act(out)  # type: ignore[operator]

    return with_both
