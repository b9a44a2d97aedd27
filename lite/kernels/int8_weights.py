"""A float GEMM over int8/uint8 weights kept as integers, dequantized block by block.

A dynamically quantized model (weight-only) stores a large dense layer's weights as int8:
dequantized once at load they take four times the file's bytes, and every call streams
all of them from memory. Kept as integers, the layer reads them where they lie (the
mapped file's pages, no copy), and each call dequantizes a block of output rows into a
small float buffer that stays in cache while the GEMM reads it, computing the transposed
product W_block @ x^T, which BLAS runs fastest for the few rows of x a sequence gives.
The result is transposed into the output once at the end. While BLAS runs one thread, a
block is small enough for OpenBLAS's unpacked kernels (conv_common.gemm says why): for a
sequence of 20 rows and 1024 inputs that is 48 rows, and it beats 512-row blocks by a
fifth, conversion included. Those kernels take x^T as a contiguous copy: read through a
transposed view, OpenBLAS also requires the output block to hold at most 1,200 elements,
which halves the rows per block (an LSTM's 512 inputs: 56 rows instead of 96, and each
call packing its operands when the limit is missed).

The blocks hold the integers q themselves; the zero points and scales apply to the small
(out, rows) product instead of to every weight on every call:
x @ ((q - zp) * s)^T = (x @ q^T - rowsum(x) zp^T) * s, which equals the product with the
dequantized weights up to float rounding (exactly, for integer-valued x and s = 1, while
the sums stay below 2^24, as the integer ops of a dynamically quantized model need).
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import pages
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.conv_common import UNPACKED_GEMM
from sporenet.lite.kernels.quantized.convert import broadcast_params, dequantize_array
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.threads import BLAS

BLOCK_ROWS = 512
"""Output features per block: 512 rows of 1024 inputs are 2 MiB of float32."""

MIN_UNPACKED_ROWS = 16
"""The fewest output features a one-thread block takes (fewer: a block per call costs
more in call overhead than unpacked kernels save)."""

ROW_MULTIPLE = 8
"""Unpacked blocks hold a multiple of this many rows (whole SIMD registers of output)."""

MIN_ELEMENTS = 1 << 18
"""Smaller weights are dequantized whole at bind: their float copy is small, and one
GEMM call beats a loop of blocks."""


def channel_params(quant: Quantization, n_out: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(zero points, scales) per output channel (axis 0, or per tensor) as float32
    (n_out, 1) columns; None for a zero point that is 0 everywhere or a scale that is 1
    everywhere (the step then skips it)."""
    scale, zp = broadcast_params(quant, 2)
    scale32 = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (n_out,))
    zp32 = np.broadcast_to(np.asarray(zp, np.float32).reshape(-1), (n_out,))
    return (
        None if not np.any(zp32) else np.ascontiguousarray(zp32).reshape(n_out, 1),
        None if np.all(scale32 == 1) else np.ascontiguousarray(scale32).reshape(n_out, 1),
    )


def bind_product_t(
    x2: np.ndarray,
    w: np.ndarray,
    zp: np.ndarray | None,
    scale: np.ndarray | None,
    out_t: np.ndarray,
) -> Compute:
    """The step writing out_t = (w - zp) * scale @ x2^T, shape (out, rows), for (out, in)
    integer weights `w` read where they lie, with `zp` and `scale` (out, 1) columns or None
    (see the module docstring)."""
    n_out, n_in = w.shape
    dtype = out_t.dtype
    # Written before they are read on every call: temporaries from the plan's arena.
    buf = temporary((min(BLOCK_ROWS, n_out), n_in), dtype)
    rowsum = temporary((1, x2.shape[0]), dtype)
    # The zero point's correction zp * rowsum(x): the column and a buffer for the product.
    shift = None if zp is None else (zp, temporary(out_t.shape, dtype))
    x_t = x2.T  # a transposed view: packed BLAS calls read it as it lies
    spans = _spans(w, buf, out_t, BLOCK_ROWS)
    unpacked_rows = UNPACKED_GEMM // max(1, n_in * x2.shape[0]) // ROW_MULTIPLE * ROW_MULTIPLE
    unpacked = MIN_UNPACKED_ROWS <= unpacked_rows < BLOCK_ROWS
    spans_one_thread = _spans(w, buf, out_t, unpacked_rows) if unpacked else spans
    # The unpacked kernels' operand: x^T as a contiguous (in, rows) copy (module docstring).
    x_cols = temporary((n_in, x2.shape[0]), dtype) if unpacked else x_t
    threads = BLAS.get if BLAS.available else (lambda: 1)
    copyto, subtract, multiply, matmul = np.copyto, np.subtract, np.multiply, np.matmul
    add_reduce = np.add.reduce

    def compute() -> None:
        one_thread = threads() == 1
        operand = x_t
        if one_thread and unpacked:
            copyto(x_cols, x_t)
            operand = x_cols
        for block, b, o in spans_one_thread if one_thread else spans:
            copyto(b, block, casting="unsafe")  # integers: exact in float32
            matmul(b, operand, out=o)
        if shift is not None:
            column, correction = shift
            add_reduce(x_t, axis=0, keepdims=True, out=rowsum)
            multiply(column, rowsum, out=correction)
            subtract(out_t, correction, out=out_t)
        if scale is not None:
            multiply(out_t, scale, out=out_t)

    return compute


def _spans(
    w: np.ndarray, buf: np.ndarray, out_t: np.ndarray, rows: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(weight block, its float buffer, its output rows) for blocks of `rows` rows."""
    n_out = w.shape[0]
    return [
        (w[s:e], buf[: e - s], out_t[s:e])
        for s, e in ((s, min(s + rows, n_out)) for s in range(0, n_out, rows))
    ]


def bind_matmul(
    x2: np.ndarray, w: np.ndarray, quant: Quantization, out2: np.ndarray
) -> Compute | np.ndarray:
    """The step computing out2 = x2 @ dequantize(w).T for (out, in) integer weights `w`
    quantized along axis 0 (or per tensor); or, for weights under MIN_ELEMENTS, their
    float32 (out, in) value, for the caller's float path."""
    if w.size < MIN_ELEMENTS:
        value = dequantize_array(w, quant)
        pages.release(w)
        return value
    zp, scale = channel_params(quant, w.shape[0])
    out_t = temporary((w.shape[0], x2.shape[0]), out2.dtype)
    # The scales apply in the transposing copy into out2: one pass instead of two.
    product = bind_product_t(x2, w, zp, None, out_t)
    copyto, multiply, result = np.copyto, np.multiply, out_t.T
    if scale is None:

        def compute() -> None:
            product()
            copyto(out2, result)

        return compute
    scale_row = scale.reshape(1, -1)

    def scaled() -> None:
        product()
        multiply(result, scale_row, out=out2)

    return scaled
