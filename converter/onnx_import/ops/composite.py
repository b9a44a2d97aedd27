"""ONNX ops without a runtime op of their own, built from ones that have one:
Swish (alpha != 1; SILU otherwise), Sign, Shrink, IsNaN, IsInf, Trilu, EyeLike, CumSum."""

from __future__ import annotations

import string

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode, as_ints
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.ops import OpCode


def _scalar(ctx: ImportContext, node: OnnxNode, name: str, value: float, like: int) -> int:
    return ctx.constant(f"{node.name}/{name}", np.array(value, ctx.dtype(like)))


def _not(ctx: ImportContext, node: OnnxNode, x: int) -> int:
    return ctx.emit1(OpCode.EQUAL, [x, ctx.constant(f"{node.name}/false", np.array(False))])


def swish(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x * sigmoid(alpha * x): the SILU op when alpha is 1."""
    x = node.input(0)
    alpha = float(node.attr("alpha", 1.0))
    if alpha == 1.0:
        return [ctx.emit1(OpCode.SILU, [x])]
    scaled = ctx.emit1(OpCode.MUL, [x, _scalar(ctx, node, "alpha", alpha, x)])
    return [ctx.emit1(OpCode.MUL, [x, ctx.emit1(OpCode.SIGMOID, [scaled])])]


def sign(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """1 where x > 0, -1 where x < 0, else 0 (NaN stays NaN)."""
    x = node.input(0)
    zero, one = _scalar(ctx, node, "zero", 0, x), _scalar(ctx, node, "one", 1, x)
    if ctx.dtype(x).kind == "u":
        return [ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.GREATER, [x, zero]), one, zero])]
    minus = _scalar(ctx, node, "minus_one", -1, x)
    y = ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.LESS, [x, zero]), minus, zero])
    y = ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.GREATER, [x, zero]), one, y])
    if ctx.dtype(x).kind == "f":
        y = ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.EQUAL, [x, x]), y, x])
    return [y]


def shrink(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x + bias where x < -lambd, x - bias where x > lambd, else 0."""
    x = node.input(0)
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    zero = _scalar(ctx, node, "zero", 0, x)
    b = _scalar(ctx, node, "bias", bias, x)
    low = ctx.emit1(OpCode.LESS, [x, _scalar(ctx, node, "minus_lambd", -lambd, x)])
    high = ctx.emit1(OpCode.GREATER, [x, _scalar(ctx, node, "lambd", lambd, x)])
    y = ctx.emit1(OpCode.WHERE, [high, ctx.emit1(OpCode.SUB, [x, b]), zero])
    return [ctx.emit1(OpCode.WHERE, [low, ctx.emit1(OpCode.ADD, [x, b]), y])]


def is_nan(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    return [_not(ctx, node, ctx.emit1(OpCode.EQUAL, [x, x]))]


def is_inf(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    checks = []
    if int(node.attr("detect_positive", 1)):
        checks.append(ctx.emit1(OpCode.EQUAL, [x, _scalar(ctx, node, "inf", np.inf, x)]))
    if int(node.attr("detect_negative", 1)):
        checks.append(ctx.emit1(OpCode.EQUAL, [x, _scalar(ctx, node, "minus_inf", -np.inf, x)]))
    if not checks:
        dims = ctx.shape(x)
        if DYNAMIC in dims:
            raise node.fail("needs a static input shape when detecting nothing")
        return [ctx.constant(node.outputs[0], np.zeros(dims, np.bool_))]
    if len(checks) == 1:
        return checks
    return [ctx.emit1(OpCode.MAXIMUM, checks)]


def _last_two_static(ctx: ImportContext, node: OnnxNode, x: int) -> tuple[int, int]:
    dims = ctx.shape(x)
    if len(dims) < 2 or DYNAMIC in dims[-2:]:
        raise node.fail(f"needs static last two dimensions, got shape {list(dims)}")
    return dims[-2], dims[-1]


def trilu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x where the (static) upper or lower triangle mask of the last two axes holds, else 0."""
    x = node.input(0)
    rows, cols = _last_two_static(ctx, node, x)
    k = 0
    if node.input(1) != -1:
        value = as_ints(ctx.value(node.input(1)))
        if value is None:
            return [_trilu_at_run_time(ctx, node, x, rows, cols)]
        k = value[0]
    ones = np.ones((rows, cols), np.bool_)
    mask = np.triu(ones, k) if int(node.attr("upper", 1)) else np.tril(ones, k)
    return [
        ctx.emit1(
            OpCode.WHERE,
            [ctx.constant(f"{node.name}/mask", mask), x, _scalar(ctx, node, "zero", 0, x)],
        )
    ]


def _trilu_at_run_time(ctx: ImportContext, node: OnnxNode, x: int, rows: int, cols: int) -> int:
    """Trilu with k known only at run time: the diagonal offset j - i of every element
    compared with k (upper keeps j - i >= k, lower j - i <= k), the rest set to 0."""
    k = node.input(1)
    if ctx.dtype(k) != np.int64:
        k = ctx.emit1(OpCode.CAST, [k], to="int64")
    i, j = np.indices((rows, cols), dtype=np.int64)
    offset = ctx.constant(f"{node.name}/offsets", j - i)
    upper = int(node.attr("upper", 1))
    dropped = ctx.emit1(OpCode.LESS if upper else OpCode.GREATER, [offset, k])
    return ctx.emit1(OpCode.WHERE, [dropped, _scalar(ctx, node, "zero", 0, x), x])


ONNX_DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
}


def eye_like(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    rows, cols = _last_two_static(ctx, node, x)
    code = node.attr("dtype")
    if code is not None and int(code) not in ONNX_DTYPES:
        raise node.fail(f"dtype {code} cannot be stored")
    dtype = ONNX_DTYPES[int(code)] if code is not None else ctx.dtype(x)
    return [ctx.constant(node.outputs[0], np.eye(rows, cols, int(node.attr("k", 0)), dtype=dtype))]


def cumsum(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Cumulative sum along a static axis as a MatMul with a constant triangular matrix
    (the axis is moved last and back with Transposes)."""
    x = node.input(0)
    axis_value = as_ints(ctx.value(node.input(1)))
    if axis_value is None and node.input(1) in ctx.fed:
        # A shape-like graph input: the CUMSUM kernel reads it when the graph is planned.
        exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))
        inputs = [x, node.input(1)]
        return [ctx.emit1(OpCode.CUMSUM, inputs, exclusive=exclusive, reverse=reverse)]
    if axis_value is None:
        raise node.fail("axis (input 1) must be static")
    rank = ctx.rank(x)
    axis = axis_value[0] + rank if axis_value[0] < 0 else axis_value[0]
    n = ctx.spec(x).shape[axis]
    if ctx.shape(x)[axis] == DYNAMIC:
        raise node.fail("the summed axis must have a static size")
    i, j = np.indices((n, n))
    exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))
    keep = (i >= j) if reverse else (i <= j)
    if exclusive:
        keep &= i != j
    tri = ctx.constant(f"{node.name}/triangle", keep.astype(ctx.dtype(x)))
    if axis == rank - 1:
        return [ctx.emit1(OpCode.MATMUL, [x, tri])]
    perm = [d for d in range(rank) if d != axis] + [axis]
    inverse = list(np.argsort(perm))
    moved = ctx.emit1(OpCode.TRANSPOSE, [x], perm=perm)
    summed = ctx.emit1(OpCode.MATMUL, [moved, tri])
    return [ctx.emit1(OpCode.TRANSPOSE, [summed], perm=[int(p) for p in inverse])]


def one_hot(ctx: ImportContext, node: OnnxNode) -> list[int]:
    depth, values = node.input(1), node.input(2)
    if any(ctx.value(k) is None and k not in ctx.fed for k in (depth, values)):
        # Fed as shape-like graph inputs they are read when the runtime plans the graph.
        raise node.fail("depth and values (inputs 1 and 2) must be static")
    return [
        ctx.emit1(OpCode.ONE_HOT, [node.input(0), depth, values], axis=int(node.attr("axis", -1)))
    ]


def hardmax(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """OneHot(ArgMax(x)): 1 at the first maximum along `axis`, 0 elsewhere. Before opset 13
    the input is coerced to 2-D at `axis` (default 1), as for Softmax."""
    x = node.input(0)
    rank = ctx.rank(x)
    shape = list(ctx.shape(x))
    axis = int(node.attr("axis", -1 if node.opset >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    coerce = node.opset < 13 and axis < rank - 1
    if coerce:
        if shape.count(DYNAMIC) > 1:
            raise node.fail("needs at most one dynamic dimension")
        x = ctx.emit1(OpCode.FLATTEN, [x], axis=axis)
        axis = 1
    depth = ctx.spec(x).shape[axis]
    index = ctx.emit1(OpCode.ARGMAX, [x], axis=axis, keepdims=0)
    dtype = ctx.dtype(x)
    y = ctx.emit1(
        OpCode.ONE_HOT,
        [
            index,
            ctx.constant(f"{node.name}/depth", np.array(depth, np.int64)),
            ctx.constant(f"{node.name}/values", np.array([0, 1], dtype)),
        ],
        axis=axis,
    )
    return [ctx.emit1(OpCode.RESHAPE, [y], shape=shape) if coerce else y]


def _einsum_terms(equation: str, ranks: list[int], node: OnnxNode) -> tuple[list[str], str]:
    """The operands' index letters and the output's, with every ellipsis spelled out as
    letters the equation does not use (aligned to the right, as broadcasting is)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks) or len(ranks) > 2:
        raise node.fail(f"Einsum of {len(ranks)} operands is not supported (one or two)")
    spare = [c for c in string.ascii_letters if c not in equation]
    widths = [r - (len(t) - 3) if "..." in t else 0 for t, r in zip(terms, ranks, strict=True)]
    ellipsis = "".join(spare[: max(widths)])
    terms = [
        t.replace("...", ellipsis[len(ellipsis) - w :]) for t, w in zip(terms, widths, strict=True)
    ]
    if not arrow:  # implicit output: the ellipsis, then indices that appear once, sorted
        letters = "".join(terms)
        once = sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis)
        rhs = ellipsis + "".join(once)
    rhs = rhs.replace("...", ellipsis)
    return terms, rhs


def _diagonal(ctx: ImportContext, node: OnnxNode, term: str, index: int) -> tuple[str, int]:
    """Take the diagonal of every index repeated within one operand: a product with an
    identity mask, summed over the second occurrence (exact: one term is not zero)."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        first, second = term.index(c), term.index(c, term.index(c) + 1)
        n = ctx.spec(index).shape[first]
        shape = [1] * len(term)
        shape[first] = shape[second] = n
        mask = ctx.constant(
            f"{node.name}/diagonal_{c}", np.eye(n, dtype=ctx.dtype(index)).reshape(shape)
        )
        product = ctx.emit1(OpCode.MUL, [index, mask])
        index = ctx.emit1(OpCode.REDUCE_SUM, [product], axes=[second], keepdims=0)
        term = term[:second] + term[second + 1 :]
    return term, index


def einsum(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """One or two operands (an ellipsis spelled out as letters, diagonals taken first):
    Transpose/Reshape to a batched (B, M, K) @ (B, K, N) MatMul, ReduceSum for indices
    summed within one operand."""
    inputs = [i for i in node.inputs if i != -1]
    terms, out = _einsum_terms(str(node.attr("equation")), [ctx.rank(i) for i in inputs], node)
    sizes: dict[str, int] = {}
    for k, (term, index) in enumerate(zip(terms, inputs, strict=True)):
        if DYNAMIC in ctx.shape(index):
            raise node.fail("Einsum needs static input shapes")
        if len(term) != ctx.rank(index):
            raise node.fail(
                f"operand {k} has rank {ctx.rank(index)}, but the equation gives it "
                f"{len(term)} indices"
            )
        sizes.update(zip(term, ctx.spec(index).shape, strict=True))
        terms[k], inputs[k] = _diagonal(ctx, node, term, index)

    def reduce_only(term: str, index: int, keep: set[str]) -> tuple[str, int]:
        """Sum away indices of `term` that are not in `keep`."""
        drop = [k for k, c in enumerate(term) if c not in keep]
        if not drop:
            return term, index
        index = ctx.emit1(OpCode.REDUCE_SUM, [index], axes=drop, keepdims=0)
        return "".join(c for c in term if c in keep), index

    def permute(term: str, index: int, order: str) -> int:
        perm = [term.index(c) for c in order]
        return index if perm == sorted(perm) else ctx.emit1(OpCode.TRANSPOSE, [index], perm=perm)

    if len(inputs) == 1:
        term, x = reduce_only(terms[0], inputs[0], set(out))
        return [permute(term, x, out)]
    (ta, tb), (a, b) = terms, inputs
    ta, a = reduce_only(ta, a, set(out) | set(tb))
    tb, b = reduce_only(tb, b, set(out) | set(ta))
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    a_kept = [c for c in ta if c not in tb]
    b_kept = [c for c in tb if c not in ta]

    def size(chars: list[str]) -> int:
        return int(np.prod([sizes[c] for c in chars], dtype=np.int64))

    a3 = ctx.emit1(
        OpCode.RESHAPE,
        [permute(ta, a, "".join(batch + a_kept + contract))],
        shape=[size(batch), size(a_kept), size(contract)],
    )
    b3 = ctx.emit1(
        OpCode.RESHAPE,
        [permute(tb, b, "".join(batch + contract + b_kept))],
        shape=[size(batch), size(contract), size(b_kept)],
    )
    product = ctx.emit1(OpCode.MATMUL, [a3, b3])
    result_term = "".join(batch + a_kept + b_kept)
    y = ctx.emit1(OpCode.RESHAPE, [product], shape=[sizes[c] for c in result_term])
    return [permute(result_term, y, out)]
