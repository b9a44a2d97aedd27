"""Quantized ONNX ops: the dynamic-quantization family and the QDQ / QLinear family.

Dynamic quantization (onnxruntime's quantize_dynamic) computes integer products of
activations quantized at run time: DynamicQuantizeLinear runs as float ops that produce
the same uint8 values, scale and zero point; MatMulInteger and ConvInteger subtract the
zero points and run the float kernels on integer-valued floats, whose weights are stored
as int8 (zero point in their quantization, dequantized once at load) and whose integer
results are cast to int32 as ONNX declares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import conv as conv_ops
from sporenet.lite import lowp
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.transform import ONNX_DTYPES as KERNEL_CAST_TYPES
from sporenet.lite.ops import OpCode

Handler = Callable[[ImportContext, OnnxNode], list[int]]

ROUNDER = np.float32(1.5 * 2**23)
"""(v + ROUNDER) - ROUNDER rounds a float32 |v| < 2**22 to the nearest integer, ties to
even, as ONNX's quantization ops round (the runtime has no Round op)."""


def _round(ctx: ImportContext, x: int, name: str) -> int:
    c = ctx.constant(f"{name}/rounder", np.array(ROUNDER, np.float32))
    return ctx.emit1(OpCode.SUB, [ctx.emit1(OpCode.ADD, [x, c]), c])


def _required(ctx: ImportContext, node: OnnxNode, k: int, what: str) -> np.ndarray:
    """The static value of input k, which must be present."""
    value = ctx.static_input(node, k, what)
    if value is None:
        raise node.fail(f"{what} (input {k}) is required")
    return value


def _scalar(ctx: ImportContext, name: str, value: float) -> int:
    return ctx.constant(name, np.array(value, np.float32))


def dynamic_quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """y = saturate(round(x / scale) + zp) over [min(x, 0), max(x, 0)] mapped to 0..255:
    one DYNAMIC_QUANTIZE node giving the centred values round(x / scale) clamped to
    [-zp, 255 - zp], the scale and the zero point (the integer ops read the centred values
    directly); the uint8 output is their sum with the zero point, kept only if read."""
    x = node.input(0)
    if ctx.dtype(x) != np.float32:
        raise node.fail(f"x must be float32, got {ctx.dtype(x)}")
    centred, scale, zp = ctx.emit(OpCode.DYNAMIC_QUANTIZE, [x], num_outputs=3)
    q8 = ctx.emit1(OpCode.CAST, [ctx.emit1(OpCode.ADD, [centred, zp])], to="uint8")
    zp8 = ctx.emit1(OpCode.CAST, [zp], to="uint8")
    ctx.centred[q8] = (zp8, centred, zp)
    return [q8, scale, zp8]


def _lstm_weight(
    ctx: ImportContext, node: OnnxNode, at: int, scale_at: int, zp_at: int, what: str
) -> int:
    """DynamicQuantizeLSTM's W or R ([dirs, rows, 4H], int8 or uint8, a scale and zero
    point per direction or per direction and column) in the LSTM kernel's layout [dirs, 4H,
    rows]: int8 with its parameters, dequantized once at load, when they lie along one
    axis (per direction, or per column of a single direction); else float32."""
    w = ctx.static_input(node, at, what)
    scale = ctx.static_input(node, scale_at, f"{what}_scale")
    zp = ctx.static_input(node, zp_at, f"{what}_zero_point") if node.input(zp_at) != -1 else None
    if w is None or scale is None:
        raise node.fail(f"{what} (input {at}) and {what}_scale (input {scale_at}) are required")
    if w.ndim != 3 or w.dtype not in (np.int8, np.uint8):
        raise node.fail(
            f"{what} must be int8 or uint8 [num_directions, rows, 4*hidden], "
            f"got {w.dtype} {list(w.shape)}"
        )
    dirs, cols = w.shape[0], w.shape[2]
    zp = np.zeros(scale.size, np.int64) if zp is None else zp.astype(np.int64).reshape(-1)
    if scale.size not in (dirs, dirs * cols) or zp.size != scale.size:
        raise node.fail(
            f"{what}_scale and {what}_zero_point must have {dirs} (per direction) or "
            f"{dirs}x{cols} (per column) values, got {scale.size} and {zp.size}"
        )
    values = np.ascontiguousarray(_as_int8(w).transpose(0, 2, 1))
    if w.dtype == np.uint8:  # stored int8: values and zero points move by 128 (exact)
        zp = zp - 128
    name = f"{ctx.tensors[node.input(at)].name}/T"
    scale = scale.astype(np.float32).reshape(-1)
    if scale.size == dirs or dirs == 1:
        q = Quantization(scale=scale, zero_point=zp, axis=0 if scale.size == dirs else 1)
        # The LSTM kernel reads int8 weights as stored: no float copy during conversion.
        return ctx.quantized_constant(name, values, q, as_stored=True)
    # Per column of two directions: two axes, which one Quantization cannot express.
    shape = (dirs, cols, 1)
    real = (values.astype(np.float32) - zp.reshape(shape)) * scale.reshape(shape)
    return ctx.constant(name, real.astype(np.float32))


def dynamic_quantize_lstm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """com.microsoft DynamicQuantizeLSTM onto the LSTM kernel: X, W, R, B, sequence_lens,
    initial_h, initial_c, P, then W_scale, W_zero_point, R_scale, R_zero_point. The
    integer weights become constants stored int8, and the kernel rounds X and each state
    to uint8 before its products as onnxruntime does (lite/kernels/recurrent_quant.py)."""
    from sporenet.converter.onnx_import.ops import recurrent

    inputs = [
        node.input(0),
        _lstm_weight(ctx, node, 1, 8, 9, "W"),
        _lstm_weight(ctx, node, 2, 10, 11, "R"),
        *[node.input(k) for k in range(3, 8)],
    ]
    lstm = dataclasses.replace(node, op_type="LSTM", inputs=inputs)
    return recurrent.recurrent(ctx, lstm, quantize_activations=True)


def _centred(ctx: ImportContext, node: OnnxNode, x: int, zp_index: int, what: str) -> int:
    """float32(x) - zero_point for an integer activation."""
    if ctx.dtype(x).kind not in "iu":
        raise node.fail(f"{what} must be int8 or uint8, got {ctx.dtype(x)}")
    known = ctx.centred.get(x)
    if known is not None and known[0] == zp_index:
        # x from DynamicQuantizeLinear with its own zero point: DYNAMIC_QUANTIZE's centred
        # values are x - zp exactly (small integers in float32), with no casts.
        return known[1]
    xf = ctx.emit1(OpCode.CAST, [x], to="float32")
    if zp_index == -1:
        return xf
    zp = ctx.value(zp_index)
    if zp is not None and zp.size == 1 and int(zp.reshape(-1)[0]) == 0:
        return xf
    return ctx.emit1(OpCode.SUB, [xf, ctx.emit1(OpCode.CAST, [zp_index], to="float32")])


def _as_int8(w: np.ndarray) -> np.ndarray:
    """int8 weights as they are; uint8 ones moved by -128 into int8 (v ^ 0x80 is v - 128
    in two's complement), with no wider temporary."""
    return w if w.dtype == np.int8 else np.bitwise_xor(w, np.uint8(0x80)).view(np.int8)


def _int_weight(
    ctx: ImportContext,
    node: OnnxNode,
    w: np.ndarray,
    zp: np.ndarray | None,
    axis: int,
    name: str,
    *,
    as_stored: bool = False,
) -> int:
    """w - zp as a constant stored int8 with its zero point (uint8 values move by 128);
    `as_stored` as for ImportContext.quantized_constant."""
    if w.dtype not in (np.int8, np.uint8):
        raise node.fail(f"the weights must be int8 or uint8, got {w.dtype}")
    zp = np.zeros(1, np.int64) if zp is None else zp.astype(np.int64).reshape(-1)
    if w.dtype == np.uint8:
        zp = zp - 128
    if zp.size not in (1, w.shape[axis]):
        raise node.fail(f"{zp.size} weight zero points for {w.shape[axis]} channels")
    q = Quantization(scale=np.ones(zp.size, np.float32), zero_point=zp, axis=axis)
    return ctx.quantized_constant(name, _as_int8(w), q, as_stored=as_stored)


def _to_int32(ctx: ImportContext, y: int, name: str) -> int:
    """An integer-valued float result as int32: rounded first, since fast convolution
    algorithms (Winograd) leave errors far below 0.5 that a truncating cast would keep."""
    half = _scalar(ctx, f"{name}/half", 0.5)
    return ctx.emit1(
        OpCode.CAST, [ctx.emit1(OpCode.FLOOR, [ctx.emit1(OpCode.ADD, [y, half])])], to="int32"
    )


def matmul_integer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(A - a_zp) @ (B - b_zp) in int32."""
    a, b = node.input(0), node.input(1)
    af = _centred(ctx, node, a, node.input(2), "A")
    weight = ctx.value(b)
    zp_b = ctx.value(node.input(3)) if node.input(3) != -1 else None
    if weight is not None and weight.ndim == 2 and (node.input(3) == -1 or zp_b is not None):
        # FullyConnected reads int8 weights as stored: no float copy during conversion.
        w = _int_weight(
            ctx,
            node,
            np.ascontiguousarray(weight.T),
            zp_b,
            0,
            f"{ctx.tensors[b].name}/T",
            as_stored=True,
        )
        y = ctx.emit1(OpCode.FULLY_CONNECTED, [af, w])
    else:
        y = ctx.emit1(OpCode.MATMUL, [af, _centred(ctx, node, b, node.input(3), "B")])
    return [_to_int32(ctx, y, node.name)]


def conv_integer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Conv of (x - x_zp) and (w - w_zp) in int32 (padding adds zeros of x - x_zp)."""
    x, w = node.input(0), node.input(1)
    xf = _centred(ctx, node, x, node.input(2), "x")
    weight = ctx.value(w)
    if weight is None or not _is_static(ctx, node, 3):  # weights given as a graph input
        wq = _centred(ctx, node, w, -1, "w")
        if node.input(3) != -1:
            wq = ctx.emit1(OpCode.SUB, [wq, _param_tensor(ctx, node, 3, 0, 4)])
    else:
        zp_w = ctx.static_input(node, 3, "the weight zero point")
        wq = _int_weight(ctx, node, weight, zp_w, 0, f"{ctx.tensors[w].name}/int8")
    y = conv_ops.conv(ctx, dataclasses.replace(node, inputs=[xf, wq]))[0]
    return [_to_int32(ctx, y, node.name)]


# ---- QDQ and QLinear ops: quantize / dequantize steps around float ops.
# An activation's QuantizeLinear is a QUANTIZE node and its DequantizeLinear a DEQUANTIZE
# node (converter/passes/qdq_folding.py then folds DEQUANTIZE -> op -> QUANTIZE into the
# op's integer kernel); constants and per-axis activations are quantized by float ops
# ending in a cast. DequantizeLinear of a constant (the weights) keeps the integer values
# in the file with their scale and zero point, dequantized once at load.

INT_RANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
# 16-bit QuantizeLinear/DequantizeLinear run as float ops (the int8 kernels take 8 bits).
ANY_RANGE = {**INT_RANGE, np.dtype(np.int16): (-32768, 32767), np.dtype(np.uint16): (0, 65535)}
_OUTPUT_DTYPES = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16}  # ONNX type codes
SMALL_CONSTANT = 16
"""Quantized constants with fewer elements (scalars such as a rescale factor) are stored
dequantized: integers would save nothing there."""


def _params(
    ctx: ImportContext, node: OnnxNode, scale_at: int, zp_at: int, axis: int, rank: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Static scale and zero point (reshaped to broadcast along `axis` when per-axis)."""
    scale = ctx.static_input(node, scale_at, "the scale")
    zp = ctx.static_input(node, zp_at, "the zero point") if zp_at < len(node.inputs) else None
    if scale is None:
        raise node.fail(f"the scale (input {scale_at}) is required")
    if scale.size > 1:
        shape = [1] * rank
        shape[axis % rank] = -1
        scale = scale.reshape(shape)
        zp = None if zp is None else zp.reshape(shape)
    return scale.astype(np.float32), zp


def _is_static(ctx: ImportContext, node: OnnxNode, *positions: int) -> bool:
    """Whether every present input at `positions` is known at conversion time."""
    return all(node.input(k) == -1 or ctx.value(node.input(k)) is not None for k in positions)


def _param_tensor(ctx: ImportContext, node: OnnxNode, k: int, axis: int, rank: int) -> int:
    """Input k (a scale or zero point given as a graph input) as float32, shaped to
    broadcast along `axis` when it has one value per slice."""
    index = node.input(k)
    if ctx.dtype(index) != np.float32:
        index = ctx.emit1(OpCode.CAST, [index], to="float32")
    shape = ctx.shape(index)
    block = int(node.attr("block_size", 0))
    if block:  # one value per block of `block` slices: repeat each along the axis
        length = ctx.shape(node.input(0))[axis % rank]
        if length < 0:
            raise node.fail("blocked quantization needs a static size along its axis")
        repeat = ctx.constant(f"{node.name}/blocks", np.arange(length, dtype=np.int64) // block)
        return ctx.emit1(OpCode.GATHER, [index, repeat], axis=axis % rank)
    if len(shape) == 1 and shape[0] != 1 and rank > 1:
        target = [1] * rank
        target[axis % rank] = -1
        index = ctx.emit1(OpCode.RESHAPE, [index], shape=target)
    return index


def _quantize_with(
    ctx: ImportContext, x: int, scale: int, zp: int | None, dtype: np.dtype, name: str
) -> int:
    """saturate(round(x / scale) + zero_point) as `dtype`, parameters as tensors."""
    lo, hi = ANY_RANGE[dtype]
    y = _round(ctx, ctx.emit1(OpCode.DIV, [x, scale]), name)
    if zp is not None:
        y = ctx.emit1(OpCode.ADD, [y, zp])
    y = ctx.emit1(OpCode.MAXIMUM, [y, _scalar(ctx, f"{name}/qmin", lo)])
    y = ctx.emit1(OpCode.MINIMUM, [y, _scalar(ctx, f"{name}/qmax", hi)])
    return ctx.emit1(OpCode.CAST, [y], to=str(dtype))


def _output_dtype(ctx: ImportContext, node: OnnxNode, zp_at: int) -> np.dtype:
    """The integer type of a quantized output: the zero point's, else output_dtype, else
    uint8 (ONNX's default)."""
    if node.input(zp_at) != -1:
        dtype = ctx.dtype(node.input(zp_at))
    else:
        dtype = np.dtype(_OUTPUT_DTYPES.get(int(node.attr("output_dtype", 2)), np.float64))
    if dtype not in ANY_RANGE:
        raise node.fail(
            f"quantization to {dtype} is not supported (int8, uint8, int16 and uint16 are)"
        )
    return dtype


def _blocked(node: OnnxNode) -> bool:
    """Whether the node quantizes by blocks (block_size): its parameters then run as
    tensors repeated along the axis, whether they are constants or not."""
    return int(node.attr("block_size", 0)) > 0


def _quantize_float(
    ctx: ImportContext,
    node: OnnxNode,
    x: int,
    scale: np.ndarray,
    zp: np.ndarray | None,
    dtype: np.dtype,
    name: str,
) -> int:
    """saturate(round(x / scale) + zero_point) as `dtype`."""
    if dtype not in ANY_RANGE:
        raise node.fail(f"only 8- and 16-bit integer quantization is supported, got {dtype}")
    lo, hi = ANY_RANGE[dtype]
    y = _round(ctx, ctx.emit1(OpCode.DIV, [x, ctx.constant(f"{name}/scale", scale)]), name)
    if zp is not None and np.any(zp != 0):
        y = ctx.emit1(OpCode.ADD, [y, ctx.constant(f"{name}/zp", zp.astype(np.float32))])
    y = ctx.emit1(OpCode.MAXIMUM, [y, _scalar(ctx, f"{name}/qmin", lo)])
    y = ctx.emit1(OpCode.MINIMUM, [y, _scalar(ctx, f"{name}/qmax", hi)])
    return ctx.emit1(OpCode.CAST, [y], to=str(dtype))


def _dequantize(
    ctx: ImportContext,
    node: OnnxNode,
    q: int,
    scale: np.ndarray,
    zp: np.ndarray | None,
    axis: int,
    name: str,
) -> int:
    """(q - zero_point) * scale as float32; a constant q stays integer in the file."""
    value = ctx.value(q)
    if (
        value is not None
        and ctx.tensors[q].data is not None
        and value.dtype in INT_RANGE
        and value.size >= SMALL_CONSTANT
    ):
        per_axis = scale.size > 1
        quant = Quantization(
            scale=scale.reshape(-1).astype(np.float32),
            zero_point=(
                np.zeros(scale.size, np.int64) if zp is None else zp.reshape(-1).astype(np.int64)
            ),
            axis=axis % max(value.ndim, 1) if per_axis else 0,
        )
        return ctx.quantized_constant(f"{ctx.tensors[q].name}/q", value, quant)
    own = ctx.spec(q).quant
    if own is not None:  # an integer tensor with parameters: a DEQUANTIZE node
        same = (
            scale.size == own.scale.size == 1
            and np.float32(scale.reshape(-1)[0]) == np.float32(own.scale[0])
            and int(0 if zp is None else zp.reshape(-1)[0])
            == int(own.zero_point[0] if own.zero_point.size else 0)
        )
        if not same:
            raise node.fail(
                f"dequantizes {ctx.tensors[q].name!r} with scale {scale.reshape(-1)}"
                f" and zero point {zp}, but it was quantized with scale "
                f"{own.scale} and zero point {own.zero_point}"
            )
        return ctx.emit1(OpCode.DEQUANTIZE, [q], name=f"{name}/dequantize")
    y = ctx.emit1(OpCode.CAST, [q], to="float32")
    if zp is not None and np.any(zp != 0):
        y = ctx.emit1(OpCode.SUB, [y, ctx.constant(f"{name}/zp", zp.astype(np.float32))])
    return ctx.emit1(OpCode.MUL, [y, ctx.constant(f"{name}/scale", scale)])


def _quantize(
    ctx: ImportContext,
    node: OnnxNode,
    x: int,
    scale: np.ndarray,
    zp: np.ndarray | None,
    dtype: np.dtype,
    name: str,
) -> int:
    """A QUANTIZE node for a per-tensor quantized activation (what the QDQ folding turns
    into integer kernels); constants and per-axis activations are quantized by float ops."""
    if ctx.value(x) is not None or scale.size != 1 or dtype not in INT_RANGE:
        return _quantize_float(ctx, node, x, scale, zp, dtype, name)
    quant = Quantization(
        scale=scale.reshape(1).astype(np.float32),
        zero_point=np.zeros(1, np.int64) if zp is None else zp.reshape(1).astype(np.int64),
    )
    return ctx.emit1(
        OpCode.QUANTIZE, [x], dtype=str(dtype), output_quant=[quant], name=f"{name}/quantize"
    )


def _lowp_target(ctx: ImportContext, node: OnnxNode) -> np.dtype | None:
    """QuantizeLinear's output type when it is a low-precision one (float8, int4, ...)."""
    if node.input(2) != -1:
        dtype = ctx.dtype(node.input(2))
    else:
        code = int(node.attr("output_dtype", 0))
        dtype = KERNEL_CAST_TYPES.get(code, np.dtype(np.uint8))
    return dtype if lowp.is_lowp(dtype) else None


def _quantize_lowp(ctx: ImportContext, node: OnnxNode, dtype: np.dtype) -> int:
    """QuantizeLinear to a low-precision type: integers as saturate(round(x / scale) + zp)
    then an exact Cast; floats (float8, float4) as x / scale + zp cast with rounding to
    nearest even and the node's saturation."""
    x, axis = node.input(0), int(node.attr("axis", 1))
    rank = ctx.rank(x)
    if ctx.dtype(x) != np.float32:
        x = ctx.emit1(OpCode.CAST, [x], to="float32")
    kind = lowp.lowp_type(dtype)
    if kind is None:
        raise ConversionError(f"QuantizeLinear to {dtype}: expected a low-precision type")
    y = ctx.emit1(OpCode.DIV, [x, _param_tensor(ctx, node, 1, axis, rank)])
    if kind.kind != "float":
        y = _round(ctx, y, node.name)
    if node.input(2) != -1:
        y = ctx.emit1(OpCode.ADD, [y, _param_tensor(ctx, node, 2, axis, rank)])
    if kind.kind != "float":
        lo = -(1 << (kind.bits - 1)) if kind.kind == "int" else 0
        hi = (1 << (kind.bits - 1)) - 1 if kind.kind == "int" else (1 << kind.bits) - 1
        y = ctx.emit1(OpCode.MAXIMUM, [y, _scalar(ctx, f"{node.name}/qmin", lo)])
        y = ctx.emit1(OpCode.MINIMUM, [y, _scalar(ctx, f"{node.name}/qmax", hi)])
    saturate = int(node.attr("saturate", 1))
    return ctx.emit1(OpCode.CAST, [y], to=kind.name, saturate=saturate)


def quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    target = _lowp_target(ctx, node)
    if target is not None:
        return [_quantize_lowp(ctx, node, target)]
    axis = int(node.attr("axis", 1))
    dtype = _output_dtype(ctx, node, 2)
    if _blocked(node) or not _is_static(ctx, node, 1, 2):
        rank = ctx.rank(x)
        zp = _param_tensor(ctx, node, 2, axis, rank) if node.input(2) != -1 else None
        return [
            _quantize_with(ctx, x, _param_tensor(ctx, node, 1, axis, rank), zp, dtype, node.name)
        ]
    scale, zp = _params(ctx, node, 1, 2, axis, ctx.rank(x))
    return [_quantize(ctx, node, x, scale, zp, dtype, node.name)]


def dequantize_linear(ctx: ImportContext, node: OnnxNode) -> list[int]:
    q = node.input(0)
    if ctx.dtype(q) == np.int32:  # a bias quantized to int32 (zero point 0)
        scale = _required(ctx, node, 1, "the scale")
        value = ctx.value(q)
        if value is not None:
            return [
                ctx.constant(
                    f"{node.name}/bias",
                    (value.astype(np.float64) * scale.astype(np.float64)).astype(np.float32),
                )
            ]
    axis = int(node.attr("axis", 1))
    if lowp.is_lowp(ctx.dtype(q)):  # float8, int4, ...: through float32
        y = _dq_dynamic(ctx, node, q, 1, 2, axis)
        scale_type = ctx.dtype(node.input(1))
        if scale_type != np.float32:
            kind = lowp.lowp_type(scale_type)
            y = ctx.emit1(OpCode.CAST, [y], to=kind.name if kind else str(scale_type))
        return [y]
    if ctx.dtype(q) not in ANY_RANGE and ctx.dtype(q) != np.int32:
        raise node.fail(
            f"dequantizing {ctx.dtype(q)} is not supported (int8, uint8, int16, uint16, int32 are)"
        )
    if _blocked(node) or not _is_static(ctx, node, 1, 2):
        y = _dq_dynamic(ctx, node, q, 1, 2, axis)
    else:
        scale, zp = _params(ctx, node, 1, 2, axis, ctx.rank(q))
        y = _dequantize(ctx, node, q, scale, zp, axis, node.name)
    if node.input(1) != -1 and ctx.dtype(node.input(1)) == np.float16:
        y = ctx.emit1(OpCode.CAST, [y], to="float16")  # the output has the scale's type
    return [y]


def _dq_dynamic(
    ctx: ImportContext, node: OnnxNode, q: int, scale_at: int, zp_at: int, axis: int
) -> int:
    """(float32(q) - zero_point) * scale with the parameters as tensors."""
    rank = ctx.rank(q)
    y = ctx.emit1(OpCode.CAST, [q], to="float32")
    if node.input(zp_at) != -1:
        y = ctx.emit1(OpCode.SUB, [y, _param_tensor(ctx, node, zp_at, axis, rank)])
    return ctx.emit1(OpCode.MUL, [y, _param_tensor(ctx, node, scale_at, axis, rank)])


def _dq_input(ctx: ImportContext, node: OnnxNode, at: int, axis: int = 1) -> int:
    """Input `at` of a QLinear op (followed by its scale and zero point) as float."""
    q = node.input(at)
    if not _is_static(ctx, node, at + 1, at + 2):
        return _dq_dynamic(ctx, node, q, at + 1, at + 2, axis)
    scale, zp = _params(ctx, node, at + 1, at + 2, axis, ctx.rank(q))
    return _dequantize(ctx, node, q, scale, zp, axis, f"{node.name}/in{at}")


def _q_output(ctx: ImportContext, node: OnnxNode, y: int, scale_at: int, zp_at: int) -> int:
    dtype = _output_dtype(ctx, node, zp_at)
    if not _is_static(ctx, node, scale_at, zp_at):
        rank = ctx.rank(y)
        zp = _param_tensor(ctx, node, zp_at, 1, rank) if node.input(zp_at) != -1 else None
        return _quantize_with(
            ctx, y, _param_tensor(ctx, node, scale_at, 1, rank), zp, dtype, f"{node.name}/out"
        )
    scale, zp = _params(ctx, node, scale_at, zp_at, 1, ctx.rank(y))
    return _quantize(ctx, node, y, scale, zp, dtype, f"{node.name}/out")


def _float_node(node: OnnxNode, op_type: str, inputs: list[int], **attrs: object) -> OnnxNode:
    return dataclasses.replace(node, op_type=op_type, inputs=inputs, attrs={**node.attrs, **attrs})


def qlinear_conv(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B int32]."""
    x = _dq_input(ctx, node, 0)
    w = _dq_input(ctx, node, 3, axis=0)
    inputs = [x, w]
    if node.input(8) != -1:
        bias = _required(ctx, node, 8, "the bias")
        x_scale = _required(ctx, node, 1, "x_scale").astype(np.float64).reshape(-1)
        w_scale = _required(ctx, node, 4, "w_scale").astype(np.float64).reshape(-1)
        inputs.append(
            ctx.constant(
                f"{node.name}/bias",
                (bias.astype(np.float64) * x_scale * w_scale).astype(np.float32),
            )
        )
    y = conv_ops.conv(ctx, _float_node(node, "Conv", inputs))[0]
    return [_q_output(ctx, node, y, 6, 7)]


def qlinear_matmul(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp."""
    from sporenet.converter.onnx_import.ops import linear

    a = _dq_input(ctx, node, 0)
    b = _dq_input(ctx, node, 3, axis=-1)
    y = linear.matmul(ctx, _float_node(node, "MatMul", [a, b]))[0]
    return [_q_output(ctx, node, y, 6, 7)]


def qlinear_binary(op: OpCode) -> Handler:
    """com.microsoft QLinearAdd / QLinearMul: a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        y = ctx.emit1(op, [_dq_input(ctx, node, 0), _dq_input(ctx, node, 3)])
        return [_q_output(ctx, node, y, 6, 7)]

    return convert


def qlinear_unary(convert_float: Handler) -> Handler:
    """com.microsoft QLinearSigmoid / QLinearLeakyRelu / QLinearGlobalAveragePool /
    QLinearAveragePool / QLinearSoftmax: x, x_s, x_zp, y_s, y_zp around a float op."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        x = _dq_input(ctx, node, 0)
        y = convert_float(ctx, _float_node(node, node.op_type.removeprefix("QLinear"), [x]))[0]
        return [_q_output(ctx, node, y, 3, 4)]

    return convert


def qlinear_concat(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """com.microsoft QLinearConcat: y_s, y_zp, then (x, x_s, x_zp) per input."""
    from sporenet.converter.onnx_import.ops import shape

    parts = [_dq_input(ctx, node, k) for k in range(2, len(node.inputs), 3)]
    y = shape.concat(ctx, _float_node(node, "Concat", parts))[0]
    return [_q_output(ctx, node, y, 0, 1)]


def qgemm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """com.microsoft QGemm: A, a_s, a_zp, B, b_s, b_zp, C (int32), y_s, y_zp; without
    y_scale the output is float."""
    from sporenet.converter.onnx_import.ops import linear

    a = _dq_input(ctx, node, 0)
    b = _dq_input(ctx, node, 3, axis=0 if int(node.attr("transB", 0)) else -1)
    inputs = [a, b]
    if node.input(6) != -1:
        c = _required(ctx, node, 6, "C")
        a_scale = _required(ctx, node, 1, "a_scale").astype(np.float64).reshape(-1)
        b_scale = _required(ctx, node, 4, "b_scale").astype(np.float64).reshape(-1)
        alpha = float(node.attr("alpha", 1.0))
        inputs.append(
            ctx.constant(
                f"{node.name}/bias",
                (c.astype(np.float64) * a_scale * b_scale * alpha).astype(np.float32),
            )
        )
    y = linear.gemm(ctx, _float_node(node, "Gemm", inputs, beta=1.0))[0]
    if node.input(7) == -1:
        return [y]
    return [_q_output(ctx, node, y, 7, 8)]
