"""Resize (ONNX semantics): nearest and linear interpolation of the last two axes.

Where the output size comes from, first match wins:

1. a constant `sizes` input (ONNX input 3),
2. a constant `scales` input (ONNX input 2),
3. a `sizes` attribute (list of ints, one per axis),
4. a `scales` attribute (list of floats, one per axis).

The attribute forms let a builder or converter write a Resize without tiny constant
tensors; the input forms keep ONNX models as they are. Either way the size must be known
when the model is planned (a dynamic batch is fine: the leading axes are not resized).
The region of interest matters only for tf_crop_and_resize: a constant `roi` input (1)
or attribute, [start per axis..., end per axis...] in normalized coordinates; outputs
whose source falls outside the input get `extrapolation_value` (0.0).
Scales resize only the last two axes (H, W of NCHW); the others must have scale 1.

When both attribute forms are given, `sizes` sets the output shape and `scales` the
coordinate mapping (how ONNX's keep_aspect_ratio_policy resizes: one scale for all axes,
output sizes rounded from it).

Attributes: mode ("nearest" | "linear" | "cubic"), coordinate_transformation_mode
("half_pixel" default, "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
"asymmetric"), nearest_mode ("round_prefer_floor" default, "round_prefer_ceil", "floor",
"ceil"), cubic_coeff_a (-0.75), exclude_outside (0: edge taps are clamped; 1: taps outside
the input get weight 0 and the rest are renormalized), antialias (0; 1: when shrinking,
linear and cubic filters are stretched by 1 / scale). Coordinates are computed in float32,
as onnxruntime does, so nearest picks the same pixels.

Everything is turned into index and weight tables at prepare: nearest is one gather from
the flattened planes; linear is separable, a two-tap gather-and-blend along H then W;
cubic and antialiased filters are separable too, as a dense (out x in) weight matrix per
axis applied with two matrix products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from sporenet.lite.kernels.base import Attrs, ChannelsLast, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.conv_common import is_channels_last
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

f32 = np.float32


def source_coordinates(
    transform: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float] = (0, 1)
) -> np.ndarray:
    """Input coordinate (float32) of every output index along one axis."""
    x = np.arange(out_len, dtype=f32)
    s = f32(scale)
    if transform == "tf_crop_and_resize":
        start, end = f32(roi[0]) * f32(in_len - 1), f32(roi[1]) * f32(in_len - 1)
        if out_len == 1:
            return np.full(1, (end - start) / f32(2) + start, f32)
        return start + x * (end - start) / f32(out_len - 1)
    if transform == "half_pixel":
        return (x + f32(0.5)) / s - f32(0.5)
    if transform == "half_pixel_symmetric":
        adjustment = f32(out_len) / (s * f32(in_len))
        offset = f32(in_len) / f32(2) * (f32(1) - adjustment)
        return offset + (x + f32(0.5)) / s - f32(0.5)
    if transform == "pytorch_half_pixel":
        return (x + f32(0.5)) / s - f32(0.5) if out_len > 1 else np.zeros(out_len, f32)
    if transform == "align_corners":
        if out_len == 1:
            return np.zeros(1, f32)
        return x * f32(in_len - 1) / f32(out_len - 1)
    return x / s  # asymmetric


def nearest_indices(coords: np.ndarray, nearest_mode: str, in_len: int) -> np.ndarray:
    if nearest_mode == "floor":
        idx = np.floor(coords)
    elif nearest_mode == "ceil":
        idx = np.ceil(coords)
    else:
        floor = np.floor(coords)
        frac = coords - floor  # exact in float32, unlike coords + 0.5
        up = frac >= f32(0.5) if nearest_mode == "round_prefer_ceil" else frac > f32(0.5)
        idx = floor + up
    return np.clip(idx, 0, in_len - 1).astype(np.intp)


def linear_taps(
    coords: np.ndarray, in_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The two input indices and their weights for every output index (clamped at edges)."""
    c = np.clip(coords, f32(0), f32(in_len - 1))
    i0 = np.floor(c).astype(np.intp)
    i1 = np.minimum(i0 + 1, in_len - 1)
    w1 = (c - i0).astype(f32)
    return i0, i1, (f32(1) - w1), w1


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient `a`, at distances x."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def filter_matrix(
    coords: np.ndarray,
    in_len: int,
    *,
    cubic: bool,
    scale: float,
    a: float = -0.75,
    antialias: bool = False,
    exclude_outside: bool = False,
) -> np.ndarray:
    """The (out, in) float64 weights of a linear or cubic filter along one axis.

    Output i reads the taps nearest its source coordinate x (the lower ones on a tie); a
    downscaling antialiased filter is stretched by 1 / scale and normalized to sum 1. Taps
    beyond the edges read the edge (or get weight 0 with exclude_outside)."""
    s = min(scale, 1.0) if antialias else 1.0
    first = int(np.floor(-(2.0 if cubic else 1.0) / s)) + 1
    offsets = np.arange(first, 2 - first)  # tap positions relative to `base`
    x = coords.astype(np.float64)[:, None]
    base = np.ceil(x) - 1  # x - base is in (0, 1]
    distance = (offsets[None, :] - (x - base)) * s
    weights = _cubic(distance, a) if cubic else np.clip(1 - np.abs(distance), 0, 1)
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    taps = (base + offsets[None, :]).astype(np.intp)
    if exclude_outside:
        weights = np.where((taps >= 0) & (taps < in_len), weights, 0.0)
        weights = weights / weights.sum(axis=1, keepdims=True)
    matrix = np.zeros((len(coords), in_len))
    rows = np.broadcast_to(np.arange(len(coords))[:, None], taps.shape)
    np.add.at(matrix, (rows, np.clip(taps, 0, in_len - 1)), weights)
    return matrix


class Resize(Kernel):
    op = OpCode.RESIZE
    num_inputs = (1, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank < 2:
            raise self.fail(f"input must have rank >= 2, got shape {list(x.shape)}")
        self.mode = attrs.str("mode", "nearest")
        self.transform = attrs.str("coordinate_transformation_mode", "half_pixel")
        self.nearest_mode = attrs.str("nearest_mode", "round_prefer_floor")
        for value, allowed, name in (
            (self.mode, MODES, "mode"),
            (self.transform, TRANSFORMS, "coordinate_transformation_mode"),
            (self.nearest_mode, NEAREST, "nearest_mode"),
        ):
            if value not in allowed:
                raise self.fail(f"{name} must be one of {list(allowed)}, got {value!r}")
        policy = attrs.str("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise self.fail(
                "keep_aspect_ratio_policy must be 'stretch', 'not_larger' or 'not_smaller', "
                f"got {policy!r}"
            )
        self.cubic_a = attrs.float("cubic_coeff_a", -0.75)
        self.exclude_outside = bool(attrs.int("exclude_outside", 0))
        self.antialias = bool(attrs.int("antialias", 0))
        if attrs.ints("axes", None) is not None:
            raise self.fail("the `axes` attribute is not supported; give one value per axis")
        sizes, scales = self._size_or_scales()
        rank = x.rank
        # _size_or_scales sets exactly one of sizes and scales.
        given: list[int] | list[float] = sizes if sizes is not None else cast(list[float], scales)
        if len(given) != rank:
            raise self.fail(
                f"{'sizes' if sizes is not None else 'scales'} must hold {rank} values (one "
                f"per axis of input shape {list(x.shape)}), got {list(given)}"
            )
        if sizes is not None and policy != "stretch":
            sizes, scales = self._keep_aspect_ratio(sizes, x.shape, policy)
        if sizes is not None:
            out_shape = [int(s) for s in sizes]
            if any(s < 1 for s in out_shape):
                raise self.fail(f"sizes must be positive, got {out_shape}")
            coordinate_scales = self.attrs.floats("scales", None) or scales
            if (self.optional_input(3) is None or scales) and coordinate_scales is not None:
                if len(coordinate_scales) != rank or any(not v > 0 for v in coordinate_scales):
                    raise self.fail(
                        f"scales next to sizes must be {rank} positive values, got "
                        f"{coordinate_scales}"
                    )
                scales = coordinate_scales
            else:
                scales = [f32(o) / f32(i) for o, i in zip(out_shape, x.shape, strict=True)]
        else:
            scales = cast(list[float], scales)  # no sizes: _size_or_scales gave scales
            if any(not s > 0 for s in scales):
                raise self.fail(f"scales must be positive, got {list(scales)}")
            out_shape = [int(f32(i) * f32(s)) for i, s in zip(x.shape, scales, strict=True)]
            if any(s < 1 for s in out_shape):
                raise self.fail(f"scales {list(scales)} shrink input {list(x.shape)} to nothing")
        if any(o != i for o, i in zip(out_shape[:-2], x.shape[:-2], strict=True)):
            raise self.fail(
                f"only the last two axes can be resized; input {list(x.shape)} -> {out_shape}"
            )
        self.scales = [float(s) for s in scales]
        self.roi = self._roi(rank) if self.transform == "tf_crop_and_resize" else None
        self.extrapolation = attrs.float("extrapolation_value", 0.0)
        self.output_specs = [TensorSpec(tuple(out_shape), x.dtype)]

    def _keep_aspect_ratio(
        self, sizes: list[int], shape: tuple[int, ...], policy: str
    ) -> tuple[list[int], list[float]]:
        """ONNX's keep_aspect_ratio_policy: one scale for the resized axes (all, or
        keep_aspect_ratio_axes), the smallest (not_larger) or largest of their size ratios."""
        rank = len(shape)
        chosen = self.attrs.ints("keep_aspect_ratio_axes", None) or list(range(rank))
        if any(not 0 <= a < rank for a in chosen) or len(sizes) != rank:
            raise self.fail(f"keep_aspect_ratio_axes {chosen} do not fit rank {rank}")
        pick = min if policy == "not_larger" else max
        scale = pick(sizes[a] / shape[a] for a in chosen)
        out, scales = list(shape), [1.0] * rank
        for a in chosen:
            out[a] = int(np.floor(scale * shape[a] + 0.5))  # rounds half up, as ONNX
            scales[a] = float(scale)
        return out, scales

    def _size_or_scales(self) -> tuple[list[int] | None, list[float] | None]:
        """Sizes or scales, by the precedence in the module docstring."""
        if self.optional_input(3) is not None:
            return [int(v) for v in np.ravel(self.constant(3, "sizes"))], None
        if self.optional_input(2) is not None:
            scales = np.ravel(self.constant(2, "scales"))
            if scales.size:  # ONNX allows an empty scales tensor next to sizes
                return None, [float(v) for v in scales]
        if self.attrs.ints("sizes", None) is not None:
            return self.attrs.ints("sizes"), None
        if self.attrs.floats("scales", None) is not None:
            return None, self.attrs.floats("scales")
        raise self.fail("needs constant `sizes` or `scales` (as an input or an attribute)")

    def _roi(self, rank: int) -> list[tuple[float, float]]:
        """(start, end) per axis, from a constant roi input or the `roi` attribute."""
        if self.optional_input(1) is not None:
            values = [float(v) for v in np.ravel(self.constant(1, "roi"))]
        else:
            values = self.attrs.floats("roi", None) or []
        if len(values) != 2 * rank:
            raise self.fail(
                f"tf_crop_and_resize needs a roi of {2 * rank} values (starts, then ends, one "
                f"per axis), got {values}"
            )
        return list(zip(values[:rank], values[rank:], strict=True))

    def _coords(self, axis: int) -> np.ndarray:
        in_len = self.input(0).shape[axis]
        out_len = self.output_specs[0].shape[axis]
        roi = self.roi[axis] if self.roi is not None else (0.0, 1.0)
        return source_coordinates(self.transform, out_len, in_len, self.scales[axis], roi)

    # Layout: a 4-D nearest or linear resize gathers and blends whole (W, C) rows and
    # C-element pixels of channels-last storage, far longer runs than the short rows of
    # small NCHW planes (a decoder's 1152 planes of 7x7).
    def _layout(self) -> ChannelsLast:
        plain = self.mode in ("nearest", "linear") and not self.antialias and self.roi is None
        four = len(self.output_specs[0].shape) == 4
        return ChannelsLast.ACCEPTED if plain and four else ChannelsLast.REFUSED

    def channels_last_input(self, index: int) -> ChannelsLast:
        return self._layout() if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return self._layout()

    def channels_last_follows(self, index: int) -> int | None:
        return 0

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        if x.ndim == 4 and is_channels_last(x) and self._layout() == ChannelsLast.ACCEPTED:
            return self._bind_channels_last(x, out)
        interpolate = self._bind_interpolation(inputs, outputs)
        if self.roi is None:
            return interpolate
        # Outputs whose source row or column lies outside the input are extrapolated.
        out, rank = outputs[0], len(self.scales)
        outside = [
            np.flatnonzero((c < 0) | (c > self.input(0).shape[axis] - 1))
            for axis, c in ((a, self._coords(a)) for a in (rank - 2, rank - 1))
        ]
        rows, cols, value = outside[0], outside[1], self.extrapolation

        def compute() -> None:
            interpolate()
            out[..., rows, :] = value
            out[..., :, cols] = value

        return compute

    def _bind_interpolation(
        self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]
    ) -> Compute:
        x, out = inputs[0], outputs[0]
        h, w = x.shape[-2:]
        oh, ow = out.shape[-2:]
        planes = int(np.prod(x.shape[:-2], dtype=np.int64))
        if self.mode == "nearest":
            rows = nearest_indices(self._coords(x.ndim - 2), self.nearest_mode, h)
            cols = nearest_indices(self._coords(x.ndim - 1), self.nearest_mode, w)
            flat = (rows[:, None] * w + cols[None, :]).ravel()
            x2, out2, take = x.reshape(planes, h * w), out.reshape(planes, oh * ow), np.take
            # mode="clip": the indices are in range by construction, and the default mode
            # ("raise") copies through a fresh buffer of the output's size on every call.
            return lambda: take(x2, flat, axis=1, out=out2, mode="clip")
        if self.mode == "cubic" or self.antialias:
            return self._bind_filter(x.reshape(planes, h, w), out.reshape(planes, oh, ow))
        return self._bind_linear(x.reshape(planes, h, w), out.reshape(planes, oh, ow))

    def _bind_channels_last(self, x: np.ndarray, out: np.ndarray) -> Compute:
        """Nearest or linear on (N, H, W, C) storage: the same gathers and blends as the
        NCHW path, in the same order (so the same values), along axes 1 and 2. An NCHW
        `out` is written by one transposing copy from a channels-last temporary."""
        xt = x.transpose(0, 2, 3, 1)
        n, h, w, c = xt.shape
        oh, ow = out.shape[2:]
        dense = out.transpose(0, 2, 3, 1)
        last = dense.flags.c_contiguous
        ot = dense if last else temporary((n, oh, ow, c), out.dtype)
        if self.mode == "nearest":
            rows = nearest_indices(self._coords(2), self.nearest_mode, h)
            cols = nearest_indices(self._coords(3), self.nearest_mode, w)
            flat = (rows[:, None] * w + cols[None, :]).ravel()
            main = _gather(xt.reshape(n, h * w, c), flat, ot.reshape(n, oh * ow, c))
        else:
            main = self._linear_steps(xt, ot, (1, 2))
        if last:
            return main
        copyto = np.copyto

        def compute() -> None:
            main()
            copyto(dense, ot)

        return compute

    def _bind_filter(self, x: np.ndarray, out: np.ndarray) -> Compute:
        planes, h, w = x.shape
        oh, ow = out.shape[1:]
        rank = len(self.scales)
        work = np.float64 if x.dtype == np.float64 else np.float32
        rows, cols = (
            filter_matrix(
                self._coords(axis),
                n,
                cubic=self.mode == "cubic",
                scale=self.scales[axis],
                a=self.cubic_a,
                antialias=self.antialias,
                exclude_outside=self.exclude_outside,
            ).astype(work)
            for axis, n in ((rank - 2, h), (rank - 1, w))
        )
        cols_t = np.ascontiguousarray(cols.T)
        tmp = np.empty((planes, oh, w), work)
        result = out if out.dtype == work else np.empty((planes, oh, ow), work)
        matmul = np.matmul

        def compute() -> None:
            matmul(rows, x, out=tmp)
            matmul(tmp, cols_t, out=result)
            if result is not out:
                np.copyto(out, result, casting="unsafe")

        return compute

    def _bind_linear(self, x: np.ndarray, out: np.ndarray) -> Compute:
        if uses_dense_linear(x.shape, out.shape, x.dtype, out.dtype):
            rank = len(self.scales)
            rows, cols = (
                _tap_matrix(linear_taps(self._coords(axis), n), n, x.dtype)
                for axis, n in ((rank - 2, x.shape[1]), (rank - 1, x.shape[2]))
            )
            return _bind_dense_linear(x, out, rows, cols)
        return self._linear_steps(x, out, (1, 2))

    def _linear_steps(self, x: np.ndarray, out: np.ndarray, axes: tuple[int, int]) -> Compute:
        """Linear interpolation along x's (row, column) `axes`: (planes, H, W) or
        (N, H, W, C) arrays, `out` laid out as `x`.

        One axis at a time, each a two-tap gather and blend. The column pass is the
        costly one (its gathers write short runs: single elements, or C-element pixels),
        so an upscale along the rows runs it first, on the H input rows rather than the
        OH output rows, and the row pass then copies whole output rows; otherwise rows
        go first. Either order interpolates the same values up to rounding; both layouts
        take the same order, so they give the same values."""
        ay, ax = axes
        h, oh = x.shape[ay], out.shape[ay]
        rank = len(self.scales)
        row_taps = linear_taps(self._coords(rank - 2), h)
        col_taps = linear_taps(self._coords(rank - 1), x.shape[ax])
        mid_shape = list(x.shape)
        if oh > h:  # columns first: (planes, H, OW), then the rows into out
            mid_shape[ax] = out.shape[ax]
            mid, scratch = temporary(mid_shape, x.dtype), temporary(mid_shape, x.dtype)
            first = _blend_columns(x, mid, col_taps, ax, other=scratch)
            # The column pass is done when the row pass runs: its scratch is free then.
            second = _blend_rows(mid, out, row_taps, ay, spare=scratch)
        else:  # rows first: (planes, OH, W), then the columns into out
            mid_shape[ay] = oh
            mid = temporary(mid_shape, x.dtype)
            first = _blend_rows(x, mid, row_taps, ay)
            second = _blend_columns(mid, out, col_taps, ax)

        def compute() -> None:
            first()
            second()

        return compute


Taps = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

# Most multiply-adds per output of the two products of a linear resize (see
# uses_dense_linear): small planes in many channels (a segmentation decoder's 9x16 maps)
# run 2 to 6 times faster so than by gathers; from about 64x64 planes the gathers win.
_DENSE_MACS_PER_OUTPUT = 80


def uses_dense_linear(
    x_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: np.dtype, out_dtype: np.dtype
) -> bool:
    """Whether a linear resize of (planes, H, W) planes runs as two BLAS products with
    the dense (OW, W) and (OH, H) tap matrices (_bind_dense_linear) rather than by
    two-tap gathers and blends: when the products' multiply-adds per output, H*W/OH
    + H (the columns of H input rows, then the rows), are few."""
    (_, h, w), (_, oh, _) = x_shape, out_shape
    return (
        dtype == out_dtype
        and dtype in (np.float32, np.float64)
        and h * w / oh + h <= _DENSE_MACS_PER_OUTPUT
    )


def _tap_matrix(taps: Taps, in_len: int, dtype: np.dtype) -> np.ndarray:
    """The dense (out, in) matrix of two-tap linear weights (both taps of a clamped edge
    add up on the same input)."""
    i0, i1, w0, w1 = taps
    matrix = np.zeros((len(i0), in_len), dtype)
    index = np.arange(len(i0))
    np.add.at(matrix, (index, i0), w0.astype(dtype))
    np.add.at(matrix, (index, i1), w1.astype(dtype))
    return matrix


def _bind_dense_linear(
    x: np.ndarray, out: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> Compute:
    """Linear resize of (planes, H, W) as two products: the columns of all planes' rows
    at once, (planes*H, W) by (W, OW), then each plane's rows, (OH, H) by (H, OW).

    The weights and the values are those of the gathers; BLAS adds the products in its
    own order (within an ulp or so of them). The zero weights are real products too, so
    an infinite input spreads NaN along its row and column, as the cubic filter's
    products do."""
    planes, h, w = x.shape
    ow = out.shape[2]
    cols_t = np.ascontiguousarray(cols.T)  # (W, OW)
    mid = temporary((planes, h, ow), x.dtype)
    flat, mid_flat = x.reshape(planes * h, w), mid.reshape(planes * h, ow)
    matmul = np.matmul

    def compute() -> None:
        matmul(flat, cols_t, out=mid_flat)
        matmul(rows, mid, out=out)

    return compute


def _blend_rows(
    x: np.ndarray, out: np.ndarray, taps: Taps, ay: int, spare: np.ndarray | None = None
) -> Compute:
    """out = x[r0] * w0 + x[r1] * w1 along the row axis `ay`.

    When the output rows form a few runs (_weight_runs: an integer upscale) and a row
    is long (channels-last rows of W*C elements), each run's two products are written
    straight into its rows of `out` and a scratch, and added: three passes where
    gathering both taps first takes five (the same products and sums, so the same
    values). Short rows (NCHW planes of small W), where a strided run costs a loop per
    row, and other sizes gather whole rows first. `spare`, an array free while this
    pass runs (another pass's scratch), serves as a scratch of its shape."""
    r0, r1, rw0, rw1 = taps
    long_rows = int(np.prod(out.shape[ay + 1 :])) >= _LONG_ROW
    runs = _weight_runs(taps, x.shape[ay], out.shape[ay]) if long_rows else None
    take, multiply, add = np.take, np.multiply, np.add
    if runs is not None:
        return _blend_row_runs(x, out, runs, ay, spare)
    trail = (1,) * (x.ndim - 1 - ay)
    rw0, rw1 = rw0.reshape(-1, *trail), rw1.reshape(-1, *trail)
    other = _scratch(out.shape, out.dtype, spare)

    def blend() -> None:
        take(x, r0, axis=ay, out=out, mode="clip")  # in range: see the nearest mode
        take(x, r1, axis=ay, out=other, mode="clip")
        multiply(out, rw0, out=out)
        multiply(other, rw1, out=other)
        add(out, other, out=out)

    return blend


_LONG_ROW = 512
"""Fewest elements in an output row for _blend_rows to write its runs in place (NCHW rows
of 128 ran slower so than the gathers, channels-last rows of 1,536 faster)."""

WeightRun = tuple[slice, slice, slice, np.ndarray, np.ndarray]


def _blend_row_runs(
    x: np.ndarray, out: np.ndarray, runs: list[WeightRun], ay: int, spare: np.ndarray | None
) -> Compute:
    """_blend_rows over runs of output rows. The weights of the long runs (an integer
    upscale's phases: 0.25 and 0.75 for 2x) multiply the whole input once each, and a
    run is then one add of two such products into its rows of `out`; short runs (the
    clamped edges) multiply their own rows into `out` and a scratch and add. Both are
    the same products and sums as the gathers' (so the same values)."""
    lead = (slice(None),) * ay
    long_runs = [r for r in runs if r[0].stop - r[0].start > r[0].step]
    weights = {float(w) for r in long_runs for w in r[3:]}
    products = {}
    for w in sorted(weights):
        products[w] = _scratch(x.shape, x.dtype, spare)
        spare = None if products[w] is spare else spare
    scales = [(np.asarray(w, x.dtype), product) for w, product in products.items()]
    sums, parts = [], []
    for dst, s0, s1, w0, w1 in runs:
        target = out[(*lead, dst)]
        if float(w0) in products and float(w1) in products:
            a, b = products[float(w0)][(*lead, s0)], products[float(w1)][(*lead, s1)]
            sums.append((a, b, target))
        else:
            scratch = temporary(target.shape, out.dtype)
            parts.append((x[(*lead, s0)], w0, x[(*lead, s1)], w1, target, scratch))
    multiply, add = np.multiply, np.add

    def by_runs() -> None:
        for w, product in scales:
            multiply(x, w, out=product)
        for a, b, target in sums:
            add(a, b, out=target)
        for a, w0, b, w1, target, scratch in parts:
            multiply(a, w0, out=target)
            multiply(b, w1, out=scratch)
            add(target, scratch, out=target)

    return by_runs


def _weight_runs(taps: Taps, in_len: int, out_len: int) -> list[WeightRun] | None:
    """(output slice, tap-0 slice, tap-1 slice, w0, w1) runs covering every output index
    o (out[o] = x[i0[o]] * w0 + x[i1[o]] * w1 with 0-d weights), when the taps form at
    most _MAX_RUNS of them at a fixed output step (an upscale by an integer factor s:
    s phases, each one run plus the clamped edges); else None."""
    i0, i1, w0, w1 = taps
    step = out_len // in_len if out_len % in_len == 0 and out_len > in_len else 0
    if not step:
        return None
    runs: list[WeightRun] = []
    for phase in range(step):
        a, b = i0[phase::step].tolist(), i1[phase::step].tolist()
        u, v = w0[phase::step], w1[phase::step]
        start = 0
        for k in range(1, len(a) + 1):
            if (
                k < len(a)
                and a[k] == a[k - 1] + 1
                and b[k] == b[k - 1] + 1
                and u[k] == u[start]
                and v[k] == v[start]
            ):
                continue
            first, last = phase + start * step, phase + (k - 1) * step
            runs.append(
                (
                    slice(first, last + 1, step),
                    slice(a[start], a[k - 1] + 1),
                    slice(b[start], b[k - 1] + 1),
                    u[start : start + 1].reshape(()),
                    v[start : start + 1].reshape(()),
                )
            )
            start = k
            if len(runs) > _MAX_RUNS:
                return None
    return runs


def _blend_columns(
    x: np.ndarray, out: np.ndarray, taps: Taps, ax: int, other: np.ndarray | None = None
) -> Compute:
    """out = x[:, c0] * w0 + x[:, c1] * w1 along the column axis `ax`: the last axis of
    NCHW planes (a few strided slice copies when they do, else gathers) or the W axis of
    channels-last storage (gathers of C-element pixels, which ran faster there than
    slice copies: 277 us against 422 us for a 2x upscale of 16 channels at 64x64).
    `other`, when given, is its scratch (out's shape and dtype)."""
    c0, c1, cw0, cw1 = taps
    other = _scratch(out.shape, out.dtype, other)
    pairs = ((c0, out), (c1, other))
    if ax == x.ndim - 1:
        gather = _column_gathers(x, pairs, ax)
        blend, rest = out, other
    else:
        # Columns with channels after them: the weights repeated per channel over
        # rows of OW*C elements (a (OW, 1) operand would loop over runs of C).
        gather = _take_columns(x, pairs, ax)
        c = x.shape[-1]
        cw0, cw1 = np.repeat(cw0, c), np.repeat(cw1, c)
        blend, rest = out.reshape(-1, cw0.size), other.reshape(-1, cw0.size)
    multiply, add = np.multiply, np.add

    def compute() -> None:
        gather()
        multiply(blend, cw0, out=blend)
        multiply(rest, cw1, out=rest)
        add(blend, rest, out=blend)

    return compute


def _scratch(shape: tuple[int, ...], dtype: np.dtype, spare: np.ndarray | None) -> np.ndarray:
    """`spare` when it has this shape and dtype (a scratch free while the pass runs), else
    a new temporary."""
    if spare is not None and spare.shape == tuple(shape) and spare.dtype == dtype:
        return spare
    return temporary(shape, dtype)


def _gather(x: np.ndarray, index: np.ndarray, out: np.ndarray) -> Compute:
    """out = x[:, index] (indices in range by construction: mode="clip")."""
    take = np.take

    def gather() -> None:
        take(x, index, axis=1, out=out, mode="clip")

    return gather


_MAX_RUNS = 8
"""Most slice copies per tap for a linear resize's columns; more gather instead."""

Run = tuple[slice, slice]


def _slice_runs(index: np.ndarray, in_len: int, out_len: int) -> list[Run] | None:
    """(output slice, input slice) pairs with out[o] = x[index[o]] for every o, when the
    index table is made of a few runs of consecutive inputs at a fixed output step (an
    upscale by an integer factor s: s phases, each one run plus the clamped edges);
    else None."""
    step = out_len // in_len if out_len % in_len == 0 and out_len >= in_len else 1
    runs: list[Run] = []
    for phase in range(step):
        values = index[phase::step].tolist()
        start = 0
        for k in range(1, len(values) + 1):
            if k == len(values) or values[k] != values[k - 1] + 1:
                first, last = phase + start * step, phase + (k - 1) * step
                runs.append((slice(first, last + 1, step), slice(values[start], values[k - 1] + 1)))
                start = k
                if len(runs) > _MAX_RUNS:
                    return None
    return runs


def _column_gathers(
    rows: np.ndarray, taps: tuple[tuple[np.ndarray, np.ndarray], ...], axis: int = -1
) -> Compute:
    """The step writing target[..., o, :] = rows[..., index[o], :] along `axis` for each
    (index, target): a few strided slice copies when the index table is a few runs
    (_slice_runs), which run several times faster than a gather along the last axis;
    else that gather."""
    axis %= rows.ndim
    width = rows.shape[axis]
    lead = (slice(None),) * axis
    copies = []
    for index, target in taps:
        runs = _slice_runs(index, width, target.shape[axis])
        if runs is None:
            return _take_columns(rows, taps, axis)
        copies += [(target[(*lead, dst)], rows[(*lead, src)]) for dst, src in runs]
    copyto = np.copyto

    def gather() -> None:
        for dst, src in copies:
            copyto(dst, src)

    return gather


def _take_columns(
    rows: np.ndarray, taps: tuple[tuple[np.ndarray, np.ndarray], ...], axis: int = -1
) -> Compute:
    """The gathers along `axis` (indices in range by construction: mode="clip")."""
    take = np.take

    def gather() -> None:
        for index, target in taps:
            take(rows, index, axis=axis, out=target, mode="clip")

    return gather
