"""A float GEMM over int8/uint8 weights kept as integers, dequantized block by block.

A dynamically quantized model (weight-only) stores a large dense layer's weights as int8:
dequantized once at load they take four times the file's bytes, and every call streams
all of them from memory. Kept as integers, the layer holds one int8 copy, and each call
dequantizes a block of output columns into a small float buffer that stays in cache while
the GEMM reads it. For a few rows (a sequence's time steps) the GEMM is bound by the
weights' memory traffic, so the integer form is faster as well as four times smaller.

The blocks are float32 (q - zero_point) * scale, as `dequantize_array` computes them, so
the layer multiplies by the same weights as a dequantized copy would hold.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import pages
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.quantized.convert import broadcast_params, dequantize_array
from sporenet.lite.kernels.workspace import temporary

BLOCK_COLUMNS = 256
"""Output columns per block: a block of 1024 input rows is 1 MiB of float32, one core's L2."""

MIN_ELEMENTS = 1 << 18
"""Smaller weights are dequantized whole at bind: their float copy is small, and one
GEMM call beats a loop of blocks."""


def _channel_params(quant: Quantization, n_out: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(zero points, scales) per output channel as float32 vectors; None for a zero point
    that is 0 everywhere or a scale that is 1 everywhere (the step then skips it)."""
    scale, zp = broadcast_params(quant, 2)
    scale32 = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (n_out,))
    zp32 = np.broadcast_to(np.asarray(zp, np.float32).reshape(-1), (n_out,))
    return (
        None if not np.any(zp32) else np.ascontiguousarray(zp32),
        None if np.all(scale32 == 1) else np.ascontiguousarray(scale32),
    )


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
    n_out, n_in = w.shape
    dtype = out2.dtype
    zp, scale = _channel_params(quant, n_out)
    # The integers as (in, out) blocks of columns, each contiguous: the kernel's one copy
    # (the file's pages of the (out, in) original are given back).
    spans = []
    full = temporary((n_in, BLOCK_COLUMNS), dtype)  # rewritten for every block
    for s in range(0, n_out, BLOCK_COLUMNS):
        e = min(s + BLOCK_COLUMNS, n_out)
        buf = full if e - s == BLOCK_COLUMNS else temporary((n_in, e - s), dtype)
        spans.append(
            (
                np.ascontiguousarray(w[s:e].T),
                buf,
                out2[:, s:e],
                None if zp is None else zp[s:e],
                None if scale is None else scale[s:e],
            )
        )
    pages.release(w)
    copyto, subtract, multiply, matmul = np.copyto, np.subtract, np.multiply, np.matmul

    def compute() -> None:
        for block, buf, out, z, sc in spans:
            copyto(buf, block, casting="unsafe")  # integers: exact in float32
            if z is not None:
                subtract(buf, z, out=buf)
            if sc is not None:
                multiply(buf, sc, out=buf)
            matmul(x2, buf, out=out)

    return compute
