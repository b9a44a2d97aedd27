"""FullyConnected (x @ W.T + b, fused activation) and batched MatMul."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels import int8_weights, raw
from sporenet.lite.kernels.activation import (
    bound_activation,
    fused_activation,
    then_activation,
)
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.conv_common import ROW_PRODUCT_ROWS, matmul_for, row_products
from sporenet.lite.kernels.quantized.base import is_quantized
from sporenet.lite.kernels.quantized.convert import dequantize_array
from sporenet.lite.ops import OpCode


class FullyConnected(Kernel):
    """y = x @ W.T + b over the last axis of x; W is (out_features, in_features) as in TFLite.

    W may be an int8/uint8 constant with its quantization parameters (weight-only): the
    kernel reads it as stored (`quantized_weights`) and keeps it as integers
    (kernels/int8_weights.py)."""

    op = OpCode.FULLY_CONNECTED
    num_inputs = (2, 3)
    quantized_weights = frozenset({1})

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.require_float(0), self.input(1)
        self.int8 = is_quantized(w) and w.value is not None
        if not self.int8:
            self.require_float(1)
        bias = self.optional_input(2)
        if w.rank != 2:
            raise self.fail(f"weights must be 2-D (out, in), got shape {list(w.shape)}")
        if x.rank < 1 or x.shape[-1] != w.shape[1]:
            raise self.fail(
                f"input shape {list(x.shape)} does not end in the weights' in_features {w.shape[1]}"
            )
        if bias is not None and bias.shape != (w.shape[0],):
            raise self.fail(f"bias must have shape [{w.shape[0]}], got {list(bias.shape)}")
        if x.dtype != w.dtype and not self.int8:
            raise self.fail(f"input dtype {x.dtype} differs from weight dtype {w.dtype}")
        self.output_specs = [TensorSpec((*x.shape[:-1], w.shape[0]), x.dtype)]
        self.activation = fused_activation(self.op.name, attrs.values)
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        # 2-3 rows over weights beyond L2's: one W @ x[i] per row (conv_common.row_products).
        self.row_products = not self.int8 and row_products(rows, w.shape[1], w.shape[0])
        self.transposed = not self.int8 and not self.row_products and _few_rows(rows, *w.shape)
        if self.transposed:  # x.T and (x @ W.T).T, see _few_rows
            self.scratch_layout = [((w.shape[1], rows), x.dtype), ((w.shape[0], rows), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w = required(inputs, 0), required(inputs, 1)
        bias = inputs[2] if len(inputs) > 2 else None
        out = outputs[0]
        x2 = x.reshape(-1, x.shape[-1])
        out2 = out.reshape(-1, out.shape[-1])
        quant = self.input(1).quant  # present whenever self.int8 (is_quantized)
        if self.int8 and quant is not None and (quant.scale.size == 1 or quant.axis == 0):
            bound = int8_weights.bind_matmul(x2, w, quant, out2)
            if callable(bound):
                return self._then(bound, out2, bias)
            w = bound
        elif self.int8:  # per input channel: dequantized whole, once
            w, file_value = dequantize_array(w, quant), w
            pages.release(file_value)
        # BLAS reads the (out, in) weights transposed as they lie in the file: a packed
        # (in, out) copy would double their memory and gain nothing.
        wt = w.T
        if self.row_products and x2.shape[0] in ROW_PRODUCT_ROWS:
            return self._then(_row_products(x2, w, out2), out2, bias)
        if self.transposed:
            return self._then(_transposed_product(x2, w, out2, *self.scratch_arrays()), out2, bias)
        matmul, add = matmul_for(x2, wt, out2), np.add
        act = self.activation
        if bias is None:
            return then_activation(lambda: matmul(x2, wt, out=out2), out2, act)
        bias = row_bias(bias, out2)
        # A single output: the product into a temporary and the bias added out of place
        # (NumPy runs an in-place ufunc on one element through a buffer).
        product = np.empty_like(out2) if out2.size == 1 else out2
        activate = None if act is None else bound_activation(act, out2, last=True)

        # One closure for the product, the bias and the activation: on an MLP's small layers
        # each further call level is a visible share of the step.
        def compute() -> None:
            matmul(x2, wt, out=product)
            add(product, bias, out2)
            if activate is not None:
                activate()

        return compute

    def _then(self, product: Compute, out2: np.ndarray, bias: np.ndarray | None) -> Compute:
        """`product` (which writes x @ W.T into out2) followed by the bias and activation."""
        if bias is None:
            return then_activation(product, out2, self.activation)
        add, bias = np.add, row_bias(bias, out2)

        def with_bias() -> None:
            product()
            add(out2, bias, out=out2)

        return then_activation(with_bias, out2, self.activation)


def row_bias(bias: np.ndarray, out2: np.ndarray) -> np.ndarray:
    """The bias as the ufunc adding it to `out2` (rows, out) reads it fastest: for one
    row, shaped (1, out) like the row, since NumPy sets up a broadcast of a 1-D operand
    against a 2-D one on every call, which costs as much as the addition itself."""
    return bias.reshape(1, -1) if out2.shape[0] == 1 else bias


def _few_rows(rows: int, out_features: int, in_features: int) -> bool:
    """Whether x @ W.T runs faster as (W @ x.T).T: for a few rows (a batch of tokens or
    time steps) and weights beyond the smallest, OpenBLAS multiplies x by the transposed
    weights with a kernel several times slower than the one it runs with W as the left
    operand; the two transposing copies are of the small operands. A single row is a
    matrix-vector product, already at memory speed."""
    return 2 <= rows <= 48 and rows * out_features * in_features >= 1 << 18


def _row_products(x2: np.ndarray, w: np.ndarray, out2: np.ndarray) -> Compute:
    """The step out2 = x2 @ w.T as one matrix-vector product w @ x2[i] per row (np.matmul
    where w or a row is not contiguous, which np.dot would first copy)."""
    calls = []
    for i in range(x2.shape[0]):
        dense = w.flags.c_contiguous and x2[i].flags.c_contiguous and out2[i].flags.c_contiguous
        calls.append((np.dot if dense else np.matmul, x2[i], out2[i]))

    def product() -> None:
        for f, v, o in calls:
            f(w, v, out=o)

    return product


def _transposed_product(
    x2: np.ndarray, w: np.ndarray, out2: np.ndarray, xt: np.ndarray, ot: np.ndarray
) -> Compute:
    """The step out2 = x2 @ w.T computed as ot = w @ xt with xt = x2.T (temporaries)."""
    copy, dot = raw.copyto, raw.dot
    x2t, ott = x2.T, ot.T

    def product() -> None:
        copy(xt, x2t)
        dot(w, xt, out=ot)
        copy(out2, ott)

    return product


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """Result shape of np.matmul(a, b), or None when the shapes do not fit."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        return None
    shape = [*batch, a2[-2], b2[-1]]
    if len(b) == 1:
        shape.pop(-1)
    if len(a) == 1:
        shape.pop(-2 if len(b) != 1 else -1)
    return tuple(shape)


class MatMul(Kernel):
    """NumPy matmul semantics: batched over leading axes with broadcasting, 1-D promoted."""

    op = OpCode.MATMUL
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.input(0), self.input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        if a.rank == 0 or b.rank == 0:
            raise self.fail("inputs must have rank >= 1")
        shape = matmul_shape(a.shape, b.shape)
        if shape is None:
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied")
        self.output_specs = [TensorSpec(tuple(shape), a.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out = inputs[0], inputs[1], outputs[0]
        return lambda: np.matmul(a, b, out=out)
