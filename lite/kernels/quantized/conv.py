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

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels import raw
from sporenet.lite.kernels.activation import scalar
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.kernels.conv_strategy import ConvStrategy
from sporenet.lite.kernels.im2col import im2col_view
from sporenet.lite.kernels.quantized import depthwise
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.kernels.quantized.gemm import (
    exact_float_dtype,
    max_abs_shifted,
    split_reduction,
    weight_bound,
)
from sporenet.lite.kernels.quantized.output_stage import Folded, OutputStage, make_stage
from sporenet.lite.kernels.quantized.rounding import OnnxOutputStage
from sporenet.lite.kernels.spatial import padded_buffer
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


KEEP_FLOAT_BYTES = 32 << 10
"""Weights whose float32 copy is at most this large keep it between calls: for small
layers the per-call conversion costs more than the GEMM, and the copy is negligible."""


FOLD_BYTES = 64 << 10
"""Layers whose float64 columns are at most this large, and whose float64 weights are at
most FOLD_WEIGHT_BYTES, run the folded route (output_stage.Folded): one GEMM and the
clamp per call, the requantization's multiply and offset inside the GEMM. On such layers
each NumPy call costs more than its arithmetic."""

FOLD_WEIGHT_BYTES = 16 << 10
"""The folded weights are float64 and kept: twice the float32 copy the other routes keep
(KEEP_FLOAT_BYTES), for a saving of about two NumPy calls per layer; so only small weight
matrices (depthwise and short reductions) fold."""

FOLD_VECTOR_BYTES = 128 << 10
"""The float64 weights up to which a layer at one position (a matrix-vector product: a
streaming step) folds. Unfolded, weights past KEEP_FLOAT_BYTES are converted to float32
on every call into scratch the plan holds for the layer, and the columns and the
stage's accumulators take more: folding up to twice that float32 size costs about the
same memory and saves the conversion and the stage's calls."""


_vecdot: Callable[..., Any] | None = getattr(np, "vecdot", None)  # NumPy >= 2.0

OWN_COLUMNS_BYTES = 16 << 10
"""A folded layer whose columns (with their row of ones) are at most this large keeps
them in an array of its own, the ones written once at bind, rather than in the plan's
shared scratch where every call rewrites them: one NumPy call less per call."""


def keep_float(w2: np.ndarray) -> np.ndarray | None:
    """A persistent float32 copy of small shifted weights, else None (converted per call)."""
    return w2.astype(np.float32) if w2.size * 4 <= KEEP_FLOAT_BYTES else None


def shift_into(src: np.ndarray, dst: np.ndarray, zero_point: int) -> Compute:
    """The step writing src - zero_point into the float array dst: a converting copy when
    the zero point is 0, else a subtraction by a 0-d operand (a scalar operand costs a
    conversion on every call)."""
    if not zero_point:
        copyto = raw.copyto
        return lambda: copyto(dst, src)
    z, subtract = scalar(dst.dtype, float(zero_point)), np.subtract
    return lambda: subtract(src, z, dst)


def bias_values(
    kernel: QuantizedKernel,
    index: int,
    out_channels: int,
    dtypes: tuple[np.dtype, ...] = (np.dtype(np.int32),),
) -> np.ndarray | None:
    """A constant integer bias (int32; int64 too for int16x8; scale s_x * s_w, zero point
    0) as int64, or None."""
    spec = kernel.optional_input(index)
    if spec is None:
        return None
    if spec.value is None or spec.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise kernel.fail(
            f"bias must be a constant {names} tensor, got {spec.dtype}"
            f"{'' if spec.value is not None else ' (not constant)'}"
        )
    if spec.shape != (out_channels,):
        raise kernel.fail(f"bias must have shape [{out_channels}], got {list(spec.shape)}")
    return spec.value.astype(np.int64)


def raw_input_stage(
    stage: OutputStage | OnnxOutputStage,
    w: np.ndarray,
    params: tuple,
    zx: int,
    raw_max: int,
    channel_shape: tuple[int, ...],
) -> tuple[OutputStage, list[tuple[int, int]]] | None:
    """The output stage, and the GEMM's exact reduction ranges, of a layer that reads its
    input unshifted: sum w (x - z_x) = sum w x - z_x sum w, and the second term joins the
    bias, so the input's conversion to float is a plain copy. None when z_x is 0, the
    stage rounds as ONNX, or the wider bias would leave the float route.

    `stage` and `params` (make_stage's, without rounding and channel shape) are those of
    the shifted input; `raw_max` is the largest |q| of the input's dtype."""
    sx, scales, so, bias, zo, lo, hi, _ = params
    if not zx or not isinstance(stage, OutputStage):
        return None
    o = w.shape[0]
    sums = w.reshape(o, -1).astype(np.int64).sum(axis=1)
    raw_bias = (np.zeros(o, np.int64) if bias is None else bias) - zx * sums
    bound = weight_bound(raw_max, w, ())
    raw = make_stage("tflite", sx, scales, so, raw_bias, zo, lo, hi, bound, channel_shape)
    if not isinstance(raw, OutputStage) or (stage.float_path and not raw.float_path):
        return None
    return raw, split_reduction(raw_max, w)


class QConv2D(QuantizedKernel):
    """int8/uint8 Conv2D: x (N, C, H, W), constant w (O, C/group, kh, kw) quantized per
    tensor or per output channel, optional int32 bias (O,).

    Ungrouped: the int8 input is padded with its zero point (once per call into a buffer
    of the kernel whose border is set at bind), its columns are gathered into float32 in
    one strided pass (copied as they are, z_x sum w joining the bias, where that stays
    exact: raw_input_stage; else shifted by -z_x), and multiplied by the weights' float
    copy in as few float32 GEMMs as exactness allows (gemm.split_reduction). Grouped and
    depthwise: the float Conv2D over shifted float copies (one exact float32 or float64
    pass; depthwise reductions are short).
    """

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
        bias = bias_values(self, 2, o)
        x_max = max_abs_shifted(x.dtype, zx)
        float_attrs = Attrs(
            attrs.op,
            {k: v for k, v in attrs.values.items() if k not in ("activation", "rounding")},
            attrs.num_outputs,
        )
        group = attrs.int("group", 1)
        # The float kernel checks shapes and attributes and gives the geometry.
        probe = Conv2D(
            float_attrs,
            [TensorSpec(x.shape, np.dtype(np.float32)), TensorSpec(w.shape, np.dtype(np.float32))],
        )
        self.win = probe.win
        shape = probe.output_specs[0].shape
        n = x.shape[0]
        oq = self.output_quant(x.dtype)
        so, zo = float(oq.scale.flat[0]), int(oq.zero_point.flat[0]) if oq.zero_point.size else 0
        lo, hi = self.fused_clamp(so, zo, x.dtype)
        bound = weight_bound(x_max, self.w, (1, 2, 3))
        self.stage = make_stage(self.rounding, sx, scales, so, bias, zo, lo, hi, bound, (o, 1))
        self.output_specs = [self.out_spec(shape, x.dtype, oq)]
        p = shape[2] * shape[3]
        self.zx, self.group = zx, group
        self.raw_max = max_abs_shifted(x.dtype, 0)
        self.depthwise_stage: OutputStage | None = None
        self.inner: Conv2D | None = None
        self.own_columns = False
        # Set by the planner (lite/float_links.py): the float64 columns a folded producer
        # writes this layer's input into, or the float64 input of the layer reading ours.
        self.float_columns: np.ndarray | None = None
        self.float_output: np.ndarray | None = None
        self.fold = self._fold(n, o, p)
        if self.fold is not None:
            kg = self.w[0].size
            f64 = np.dtype(np.float64)
            cols = (n, group, kg + 1, p)
            self.own_columns = int(np.prod(cols)) * 8 <= OWN_COLUMNS_BYTES
            self.scratch_layout = [
                ((0,) if self.own_columns else cols, f64),
                ((n, o, p), f64),
                (self.fold.mask_shape((n, o, p)), np.dtype(bool)),
            ]
        else:
            params = (sx, scales, so, bias, zo, lo, hi, bound)
            self._plan_routes(probe, float_attrs, x, shape, params)

    def _plan_routes(
        self,
        probe: Conv2D,
        float_attrs: Attrs,
        x: TensorSpec,
        shape: tuple[int, ...],
        params: tuple,
    ) -> None:
        """The unfolded routes: ungrouped GEMMs, channels-last depthwise, or the float
        Conv2D over shifted copies; sets what each binds and its scratch. `params` are
        the output stage's (make_stage's, with the accumulators' bound)."""
        sx, scales, so, bias, zo, lo, hi, bound = params
        n, o, group = x.shape[0], self.w.shape[0], self.group
        p = shape[2] * shape[3]
        x_max = max_abs_shifted(x.dtype, self.zx)
        if group == 1:
            self.chunks = split_reduction(x_max, self.w)
            self.gather_zero = self.zx
            raw = raw_input_stage(self.stage, self.w, params, self.zx, self.raw_max, (o, 1))
            if raw is not None and len(raw[1]) <= len(self.chunks):
                self.stage, self.chunks = raw
                self.gather_zero = 0
            wide = (n, o, p), self.stage.wide_dtype
            k = self.w[0].size
            f32 = np.dtype(np.float32)
            self.pointwise = probe.strategy is ConvStrategy.POINTWISE
            self.kept = keep_float(self.w.reshape(o, k))
            self.scratch_layout = [
                ((n, k, p), f32),
                ((o, 0 if self.kept is not None else k), f32),
                ((len(self.chunks), n, o, p), f32),
                wide,
            ]
        elif group == x.shape[1] == o and o >= depthwise.MIN_CHANNELS:
            self.depthwise_stage = make_stage(
                self.rounding, sx, scales, so, bias, zo, lo, hi, bound, (o,)
            )
            self.scratch_layout = depthwise.scratch_layout(
                self.win, x.shape, self.depthwise_stage.wide_dtype
            )
        else:
            ftype = exact_float_dtype(bound)
            self.inner = Conv2D(
                float_attrs, [TensorSpec(x.shape, ftype), TensorSpec(self.w.shape, ftype)]
            )
            wide = (n, o, p), self.stage.wide_dtype
            self.scratch_layout = [(x.shape, ftype), (self.w.shape, ftype), (shape, ftype), wide]

    def _fold(self, n: int, o: int, p: int) -> Folded | None:
        """The folded route (output_stage.Folded) for a layer small enough that its NumPy
        calls, not its arithmetic, set its time; else None."""
        if not isinstance(self.stage, OutputStage):
            return None
        kg = self.w[0].size + 1  # one output's weights and the offset column
        # A matrix-vector layer (one position: a streaming step): its time is its NumPy
        # calls (FOLD_VECTOR_BYTES).
        weight_limit = FOLD_VECTOR_BYTES if n * p == 1 else FOLD_WEIGHT_BYTES
        if n * self.group * kg * p * 8 > FOLD_BYTES or o * kg * 8 > weight_limit:
            return None
        return self.stage.folded(self.w.reshape(o, kg - 1), self.zx, self.raw_max)

    def float_input(self, lo: int) -> np.ndarray | None:
        """For a folded pointwise layer at one position: the float64 array (C,) that the
        folded layer computing its input may write that input into, minus `lo` (the
        producer's clamp low end, so its values are 0..255), instead of as bytes this
        layer would convert; the fold is re-made for that input (zero point z - lo
        joined to the offset). None when this layer cannot read it so."""
        x = self.input(0)
        fold = self.fold
        if fold is None or self.group != 1 or x.shape[0] != 1 or x.size != x.shape[1]:
            return None
        if self.win.kernel != (1, 1) or self.win.padded or not self.own_columns:
            return None
        w2 = self.w.reshape(self.w.shape[0], -1)
        refold = cast(OutputStage, self.stage).folded(w2, self.zx - lo, 255)
        if refold is None or refold.zero_point:
            return None
        self.fold = refold
        k = w2.shape[1]
        self.float_columns = np.empty((1, 1, k + 1, 1), np.float64)
        self.float_columns[0, 0, k, 0] = 1.0
        return self.float_columns[0, 0, :k, 0]

    def reads_strided(self, index: int) -> bool:
        # The folded route reads x only through its padded copy or im2col's strided view.
        return index == 0 and self.fold is not None

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        if self.fold is not None:
            pages.release(self.w)  # the step reads the folded float64 weights only
            return self._bind_folded(self.fold, x, out)
        if self.inner is not None:
            return self._bind_inner(self.inner, x, out)
        if self.depthwise_stage is not None:
            return depthwise.bind_depthwise_int8(
                self.win, x, self.w, self.zx, self.depthwise_stage, out, self.scratch_arrays()
            )
        cols, wf, parts, wide = self.scratch_arrays()
        n, o = out.shape[:2]
        k = cols.shape[1]
        gather = self._gather(x, cols, self.gather_zero)
        w2 = self.w.reshape(o, k)
        kept = self.kept
        if kept is not None:
            pages.release(self.w)  # the step reads the kept float32 copy only
            wf = kept
        gemms = [(wf[:, a:b], cols[:, a:b], parts[i]) for i, (a, b) in enumerate(self.chunks)]
        if n == 1:  # plain 2-D GEMMs
            gemms = [(wa, ca[0], pa[0]) for wa, ca, pa in gemms]
        if len(gemms) == 1:
            acc = parts[0]
            reduce = None
        else:
            acc = (
                wide.view(np.float64)
                if wide.dtype == np.float64
                else np.empty(wide.shape, np.float64)
            )
            reduce = parts
        stage = self.stage.bind(
            acc.reshape(n, o, -1), out.reshape(n, o, -1), wide.reshape(n, o, -1)
        )
        copyto, matmul, add_reduce = raw.copyto, np.matmul, np.add.reduce

        def compute() -> None:
            gather()
            if kept is None:
                copyto(wf, w2)
            for wa, ca, pa in gemms:
                matmul(wa, ca, out=pa)
            if reduce is not None:
                add_reduce(reduce, axis=0, dtype=np.float64, out=acc)
            stage()

        return compute

    def _bind_folded(self, fold: Folded, x: np.ndarray, out: np.ndarray) -> Compute:
        """One float64 GEMM per group, batched: (G, O/G, K/G + 1) @ (N, G, K/G + 1, P),
        the columns' last row all ones (rewritten each call: the columns are scratch)."""
        win, g = self.win, self.group
        n, c = x.shape[:2]
        o = out.shape[1]
        (kh, kw), (oh, ow) = win.kernel, win.out
        cg, p = c // g, oh * ow
        kg = cg * kh * kw
        cols, v, mask = self.scratch_arrays()
        floats = None if self.float_output is None else self.float_output.reshape(v.shape)
        if self.float_columns is not None:  # the producer writes the columns
            return self._bind_from_floats(fold, self.float_columns, v, (out, mask, floats))
        if self.own_columns:  # the row of ones written once, here
            cols = np.empty((n, g, kg + 1, p), np.float64)
            cols[:, :, kg, :] = 1.0
        ones = None if self.own_columns else cols[:, :, kg, :]
        target: np.ndarray = cols[:, :, :kg, :].reshape(n, g, cg, kh, kw, oh, ow)  # splits: a view
        if win.padded or any(e > s for e, s in zip(win.extent, x.shape[2:], strict=True)):
            xp, interior = padded_buffer(x, win, self.zx)
        else:
            xp, interior = x, None
        view: np.ndarray = im2col_view(xp, win).reshape(
            target.shape
        )  # splits C into groups: a view
        flat = view.reshape(n, g, kg, p)
        if np.may_share_memory(flat, xp):  # windows that do not overlap: 4-D is faster
            view, target = flat, cols[:, :, :kg, :]
        stage = fold.bind(v, out.reshape(n, o, p), mask, floats)
        rows = view.reshape(g, kg) if n == 1 and p == 1 and o == g else None
        if rows is not None and np.may_share_memory(rows, xp):  # a view, not a copy
            return self._bind_position(fold, rows, (x, xp, interior), v.reshape(g), stage)
        gemm: Callable[..., Any] = np.matmul
        a, b, ab = fold.weights.reshape(g, o // g, kg + 1), cols, v
        if n == 1 and g == 1:  # one 2-D product (a matrix-vector one for one position)
            gemm, a, b, ab = raw.dot, fold.weights, cols[0, 0], v[0]
            if p == 1:
                b, ab = b[:, 0], ab[:, 0]
        elif n == 1 and p == 1 and o == g and _vecdot is not None:
            # Depthwise at one position (a streaming step): row-wise dot products, which
            # NumPy dispatches faster than a batch of G one-by-one matrix products.
            gemm, a, b, ab = _vecdot, fold.weights, cols[0, :, :, 0], v.reshape(g)
        else:
            b, ab = cols, v.reshape(n, g, o // g, p)
            if n == 1:
                b, ab = b[0], ab[0]
        copyto = raw.copyto
        fill = None if ones is None else ones.fill
        shift = shift_into(view, target, fold.zero_point)

        def compute() -> None:
            if interior is not None:
                copyto(interior, x)
            shift()
            if fill is not None:
                fill(1.0)
            gemm(a, b, out=ab)
            stage()

        return compute

    def _bind_from_floats(
        self, fold: Folded, cols: np.ndarray, v: np.ndarray, ends: tuple
    ) -> Compute:
        """A pointwise layer at one position whose columns its producer wrote
        (float_input): the matrix-vector product and the output stage. `ends` is
        (out, mask, floats) as for Folded.bind."""
        out, mask, floats = ends
        stage = fold.bind(v, out.reshape(v.shape), mask, floats)
        dot, weights, b, ab = raw.dot, fold.weights, cols[0, 0, :, 0], v.reshape(-1)

        def compute() -> None:
            dot(weights, b, out=ab)
            stage()

        return compute

    def _bind_position(
        self,
        fold: Folded,
        rows: np.ndarray,
        source: tuple[np.ndarray, np.ndarray, np.ndarray | None],
        v: np.ndarray,
        stage: Compute,
    ) -> Compute:
        """A depthwise layer at one position (a streaming step): per group g, v[g] =
        rows[g] . weights[g] with the offset column, as one elementwise product and one
        BLAS product with ones. The columns are laid out (K + 1, G), window position
        by channel, as a channels-last input stores them: the gather is a plain copy
        then, and the sum runs down contiguous columns. Exact in any order (Folded).
        `source` is (x, the array `rows` views, the interior to copy x into or None)."""
        x, _, interior = source
        g, k = rows.shape
        cols = np.empty((k + 1, g), np.float64)
        cols[k] = 1.0
        weights = np.ascontiguousarray(fold.weights.T)
        fold.weights = weights.T  # the fold keeps this layout only, not a second copy
        products, ones = np.empty_like(cols), np.ones(k + 1, np.float64)
        shift = shift_into(rows.T, cols[:k], fold.zero_point)
        copyto, multiply, dot = raw.copyto, np.multiply, raw.dot

        def compute() -> None:
            if interior is not None:
                copyto(interior, x)
            shift()
            multiply(weights, cols, products)
            dot(ones, products, out=v)
            stage()

        return compute

    def _gather(self, x: np.ndarray, cols: np.ndarray, zero_point: int) -> Compute:
        """The step filling `cols` (N, K, P) with the columns of x minus `zero_point`."""
        if self.pointwise:
            return shift_into(x.reshape(cols.shape), cols, zero_point)
        win = self.win
        if win.padded or any(e > s for e, s in zip(win.extent, x.shape[2:], strict=True)):
            xp, interior = padded_buffer(x, win, self.zx)
            copyto = raw.copyto
        else:
            xp, interior = x, None
        view = im2col_view(xp, win)  # (N, C, kh, kw, OH, OW)
        shift = shift_into(view, cols.reshape(view.shape), zero_point)
        if interior is None:
            return shift

        def gather() -> None:
            copyto(interior, x)
            shift()

        return gather

    def _bind_inner(self, inner: Conv2D, x: np.ndarray, out: np.ndarray) -> Compute:
        xf, wf, accf, wide = self.scratch_arrays()
        main = inner.bind([xf, wf], [accf])
        n, o = out.shape[:2]
        stage = self.stage.bind(
            accf.reshape(n, o, -1), out.reshape(n, o, -1), wide.reshape(n, o, -1)
        )
        w, zx, copyto, subtract = self.w, xf.dtype.type(self.zx), raw.copyto, np.subtract

        def compute() -> None:
            subtract(x, zx, out=xf)
            copyto(wf, w)
            main()
            stage()

        return compute
