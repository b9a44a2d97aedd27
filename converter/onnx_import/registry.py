"""The explicit table of ONNX op types the converter imports, and the runtime ops each needs.

An ONNX op is available when its handler exists and every IR op it maps onto has a kernel
in this runtime (so the list grows as kernels land, and never promises what cannot run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import activation, constant, elementwise, linear, shape
from sporenet.lite.kernels import KERNELS
from sporenet.lite.ops import OpCode


@dataclass(frozen=True)
class Handler:
    """Converts one ONNX node; `requires` are the IR ops its usual translation emits."""

    convert: Callable[[ImportContext, OnnxNode], list[int]]
    requires: tuple[OpCode, ...] = ()


def _h(convert: Callable[[ImportContext, OnnxNode], list[int]], *requires: OpCode) -> Handler:
    return Handler(convert, requires)


_E = elementwise
_A = activation
HANDLERS: dict[str, Handler] = {
    # constants and pass-through
    "Constant": _h(constant.constant),
    "ConstantOfShape": _h(constant.constant_of_shape),
    "Shape": _h(constant.shape),
    "Size": _h(constant.size),
    "Identity": _h(constant.identity),
    "Dropout": _h(constant.dropout),
    # linear algebra
    "Gemm": _h(linear.gemm, OpCode.FULLY_CONNECTED, OpCode.MATMUL, OpCode.ADD, OpCode.MUL),
    "MatMul": _h(linear.matmul, OpCode.FULLY_CONNECTED, OpCode.MATMUL),
    # binary elementwise
    "Add": _h(_E.binary(OpCode.ADD), OpCode.ADD),
    "Sub": _h(_E.binary(OpCode.SUB), OpCode.SUB),
    "Mul": _h(_E.binary(OpCode.MUL), OpCode.MUL),
    "Div": _h(_E.binary(OpCode.DIV), OpCode.DIV),
    "Pow": _h(_E.binary(OpCode.POW), OpCode.POW),
    "Equal": _h(_E.binary(OpCode.EQUAL), OpCode.EQUAL),
    "Greater": _h(_E.binary(OpCode.GREATER), OpCode.GREATER),
    "Less": _h(_E.binary(OpCode.LESS), OpCode.LESS),
    "Sum": _h(_E.variadic(OpCode.ADD), OpCode.ADD),
    "Mean": _h(_E.variadic(OpCode.ADD, mean=True), OpCode.ADD, OpCode.DIV),
    "Max": _h(_E.variadic(OpCode.MAXIMUM), OpCode.MAXIMUM),
    "Min": _h(_E.variadic(OpCode.MINIMUM), OpCode.MINIMUM),
    "PRelu": _h(_E.prelu, OpCode.PRELU),
    "Where": _h(_E.where, OpCode.WHERE),
    # unary and activations
    "Relu": _h(_A.unary(OpCode.RELU), OpCode.RELU),
    "Sigmoid": _h(_A.unary(OpCode.SIGMOID), OpCode.SIGMOID),
    "Tanh": _h(_A.unary(OpCode.TANH), OpCode.TANH),
    "LeakyRelu": _h(_A.unary(OpCode.LEAKY_RELU, alpha=0.01), OpCode.LEAKY_RELU),
    "Elu": _h(_A.unary(OpCode.ELU, alpha=1.0), OpCode.ELU),
    "Selu": _h(_A.selu, OpCode.ELU, OpCode.MUL),
    "HardSigmoid": _h(_A.unary(OpCode.HARD_SIGMOID, alpha=0.2, beta=0.5),
                      OpCode.HARD_SIGMOID),
    "HardSwish": _h(_A.unary(OpCode.HARD_SWISH), OpCode.HARD_SWISH),
    "Softplus": _h(_A.unary(OpCode.SOFTPLUS), OpCode.SOFTPLUS),
    "Softsign": _h(_A.softsign, OpCode.ABS, OpCode.ADD, OpCode.DIV),
    "Gelu": _h(_A.gelu, OpCode.GELU),
    "Clip": _h(_A.clip, OpCode.CLIP),
    "Exp": _h(_A.unary(OpCode.EXP), OpCode.EXP),
    "Log": _h(_A.unary(OpCode.LOG), OpCode.LOG),
    "Sqrt": _h(_A.unary(OpCode.SQRT), OpCode.SQRT),
    "Neg": _h(_A.unary(OpCode.NEG), OpCode.NEG),
    "Abs": _h(_A.unary(OpCode.ABS), OpCode.ABS),
    "Reciprocal": _h(_A.unary(OpCode.RECIPROCAL), OpCode.RECIPROCAL),
    "Erf": _h(_A.unary(OpCode.ERF), OpCode.ERF),
    "Floor": _h(_A.unary(OpCode.FLOOR), OpCode.FLOOR),
    "Ceil": _h(_A.unary(OpCode.CEIL), OpCode.CEIL),
    # shape and layout
    "Reshape": _h(shape.reshape, OpCode.RESHAPE),
    "Flatten": _h(shape.flatten, OpCode.FLATTEN),
}


def handler_available(op_type: str) -> bool:
    """Whether `op_type` has a handler and every runtime op it needs has a kernel."""
    handler = HANDLERS.get(op_type)
    return handler is not None and all(op in KERNELS for op in handler.requires)


def supported_onnx_ops() -> list[str]:
    """Every ONNX op type the converter accepts with this runtime, sorted."""
    return sorted(op for op in HANDLERS if handler_available(op))
