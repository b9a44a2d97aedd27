"""What Conv2D and ConvTranspose2D share: the operand checks they start from and the
epilogue (bias add, fused activation) that follows their main step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.lite.kernels import raw
from sporenet.lite.kernels.activation import InPlace, then_activation, with_scratch
from sporenet.lite.kernels.base import Compute, Kernel, TensorSpec
from sporenet.lite.kernels.spatial import check_nchw
from sporenet.lite.threads import BLAS

# Largest constant bias (in bytes of output) expanded to a full output image, so adding it
# is one contiguous pass instead of a broadcast over short rows. The pass is about twice as
# fast, but the expanded copy is memory held for the model's lifetime: above this size the
# broadcast costs microseconds per call and the copy megabytes per model.
_BIAS_EXPAND_LIMIT = 128 << 10


def conv_operands(
    kernel: Kernel,
    weight_axes: str,
) -> tuple[TensorSpec, TensorSpec, TensorSpec | None, int]:
    """The checked (x, w, bias, group) both convolutions start from: a float NCHW input,
    4-D weights (`weight_axes`, kh, kw) of the input's dtype, an optional bias."""
    x, w = kernel.require_float(0), kernel.require_float(1)
    bias = kernel.optional_input(2)
    check_nchw(kernel, x.shape)
    if w.rank != 4:
        raise kernel.fail(f"weights must be 4-D ({weight_axes}, kh, kw), got shape {list(w.shape)}")
    if x.dtype != w.dtype:
        raise kernel.fail(f"input dtype {x.dtype} differs from weight dtype {w.dtype}")
    return x, w, bias, kernel.attrs.int("group", 1)


def check_filter(kernel: Kernel, w: TensorSpec, bias: TensorSpec | None, out_ch: int) -> None:
    """kernel_shape, when given, must match the weights; the bias has one value per output
    channel."""
    kh, kw = w.shape[2:]
    kernel_shape = kernel.attrs.ints("kernel_shape", None)
    if kernel_shape is not None and list(kernel_shape) != [kh, kw]:
        raise kernel.fail(f"kernel_shape {kernel_shape} differs from the weights' {[kh, kw]}")
    if bias is not None and bias.shape != (out_ch,):
        raise kernel.fail(f"bias must have shape [{out_ch}], got {list(bias.shape)}")


def is_channels_last(a: np.ndarray) -> bool:
    """Whether a 4-D array is an (N, C, H, W) view of channels-last memory (and not
    contiguous NCHW as well, as it is when C or H*W is 1)."""
    return not a.flags.c_contiguous and a.transpose(0, 2, 3, 1).flags.c_contiguous


def with_epilogue(
    main: Compute,
    out: np.ndarray,
    bias: np.ndarray | None,
    act: InPlace | None,
    bias_const: bool,
) -> Compute:
    """Wrap a convolution step with the bias add and the fused activation (both in place).

    A constant bias is expanded once to a whole output image when that is small, so the add
    is one contiguous pass instead of a broadcast over short rows.
    """
    if bias is None:
        return then_activation(main, out, act)
    act = with_scratch(act, out, last=True)
    n, o = out.shape[:2]
    plane = out[0, 0].size
    target: np.ndarray
    b: np.ndarray
    if bias_const and o * plane * out.itemsize <= _BIAS_EXPAND_LIMIT:
        target, b = out.reshape(n, o * plane), np.repeat(bias, plane)
    else:
        target, b = out.reshape(n, o, plane), bias.reshape(o, 1)
    add = np.add
    if act is None:

        def with_bias() -> None:
            main()
            add(target, b, out=target)

        return with_bias

    # One closure, not the activation wrapped around the bias step: each call level
    # costs a small convolution a visible share of its time.
    def with_both() -> None:
        main()
        add(target, b, out=target)
        act(out)

    return with_both


# Largest output (elements) whose product calls raw.dot (see matmul_for).
_DOT_MAX_OUTPUT = 8192


def matmul_for(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Callable[..., object]:
    """The function to call as f(a, b, out=out) for out = a @ b: raw.dot where it applies
    (2-D operands of out's float dtype, out C-contiguous and apart from them), else
    np.matmul. Both run the product in BLAS; raw.dot calls it with less overhead than
    matmul's gufunc loop, several microseconds on a small layer, and a one-column
    result (a classifier's last layer) does not take matmul's loop outside BLAS. But
    dot clears its output before the product, one more pass over it, which on a large
    output with few products per element (a 1x1 layer of 16 input channels: a fifth
    of its time) costs more than matmul's overhead: large outputs take np.matmul."""
    if (
        out.size <= _DOT_MAX_OUTPUT
        and a.ndim == b.ndim == out.ndim == 2
        and a.dtype == b.dtype == out.dtype
        and out.dtype in (np.float32, np.float64)
        and out.flags.c_contiguous
        and out.shape == (a.shape[0], b.shape[1])
        and not np.may_share_memory(out, a)
        and not np.may_share_memory(out, b)
    ):
        return raw.dot
    return np.matmul


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Compute:
    """The step out = a @ b for 2-D operands, split into products OpenBLAS runs unpacked.

    OpenBLAS multiplies products of at most about a million multiply-adds (M*N*K) with
    kernels that read the operands in place, and larger ones by first packing both into
    panels. Just above that size the packing costs more than it saves (a 1280-channel 1x1
    head on a 3x3 map: a 160x1280 weight matrix packed on every call), so such a product
    runs as a few column (or row) blocks of `out` under the limit, each an unpacked call.
    Larger products keep one call (packing pays off; benchmarks/lite_inference.py shows
    the layers near both edges), and so does any product while BLAS runs several
    threads (the blocks would each run on one)."""
    matmul = matmul_for(a, b, out)
    if a.ndim != 2 or b.ndim != 2:
        return lambda: matmul(a, b, out=out)
    (m, k), n = a.shape, b.shape[1]
    work = m * n * k
    parts = unpacked_parts(work)
    if parts == 1:
        return lambda: matmul(a, b, out=out)
    if n >= m:
        step = -(-n // parts)
        blocks = [(a, b[:, j : j + step], out[:, j : j + step]) for j in range(0, n, step)]
    else:
        step = -(-m // parts)
        blocks = [(a[i : i + step], b, out[i : i + step]) for i in range(0, m, step)]

    threads = BLAS.get if BLAS.available else (lambda: 1)
    calls = [(matmul_for(x, y, z), x, y, z) for x, y, z in blocks]

    def compute() -> None:
        if threads() != 1:
            matmul(a, b, out=out)
            return
        for product, x, y, z in calls:
            product(x, y, out=z)

    return compute


def unpacked_parts(work: int) -> int:
    """Into how many blocks gemm splits a product of `work` multiply-adds on one thread:
    enough to keep each under UNPACKED_GEMM when that takes a few (up to
    _SPLIT_GEMM_LIMIT), else 1 (small products already run unpacked, and large ones gain
    from packing)."""
    if UNPACKED_GEMM < work <= _SPLIT_GEMM_LIMIT:
        return -(-work // UNPACKED_GEMM)
    return 1


ROW_PRODUCT_ROWS = (2, 3)
"""Row counts of a left operand that products run as one matrix-vector product per row:
OpenBLAS (SkylakeX kernels, AMD EPYC) multiplies a 2- or 3-row matrix by a weight matrix
1.4 to 3 times slower than it runs the rows as separate products (2 x 256 by 256 x 1024:
65 us, two rows 23 us; a 2 x 768 state by a 3072 x 768 layer: 614 us, 194 us); from 4 rows
on its GEMM kernels hold their own."""

ROW_PRODUCT_MIN = 1 << 18
"""Fewest multiply-adds (rows x in x out) a 2- or 3-row product runs row by row: below
this the weights sit in L2 and one GEMM call beats the separate products (one Xeon,
SkylakeX kernels, same process: 2 x 128 by 128 x 384 stacked over two directions
14 us against 20 us row by row, 2 x 256 by 256 x 256 10.5 us against 17.4 us)."""


def row_products(rows: int, in_features: int, out_features: int) -> bool:
    """Whether a product of `rows` rows runs as one matrix-vector product per row."""
    return rows in ROW_PRODUCT_ROWS and rows * in_features * out_features >= ROW_PRODUCT_MIN


# OpenBLAS's unpacked ("small matrix") limit on M*N*K, and the largest product split to
# stay under it (see gemm).
UNPACKED_GEMM = 1_000_000
_SPLIT_GEMM_LIMIT = 8_000_000
