"""Binary elementwise ops (NumPy broadcasting) and comparisons."""

from __future__ import annotations

from sporenet.lite.kernels import elementwise
from sporenet.lite.kernels.quantized import elementwise as q_elementwise
from sporenet.lite.kernels.quantized import elementwise_extra as q_extra
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import int16_elementwise as q_int16_elementwise
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import FUSABLE, Channels, declare, rule

OPS = (
    declare(
        O.ADD,
        kernel=elementwise.Add,
        int8=q_elementwise.QAdd,
        grad=rule("elementwise", "add"),
        grad_differentiable=True,
        fuses=FUSABLE,
        weights=(0, 1),
        channels=Channels.ELEMENTWISE,
        int16=q_int16_elementwise.QAdd16,
    ),
    declare(
        O.SUB,
        kernel=elementwise.Sub,
        int8=q_elementwise.QSub,
        grad=rule("elementwise", "sub"),
        grad_differentiable=True,
        fuses=FUSABLE,
        weights=(0, 1),
        channels=Channels.ELEMENTWISE,
        int16=q_int16_elementwise.QSub16,
    ),
    declare(
        O.MUL,
        kernel=elementwise.Mul,
        int8=q_elementwise.QMul,
        grad=rule("elementwise", "mul"),
        grad_differentiable=True,
        fuses=FUSABLE,
        weights=(0, 1),
        channels=Channels.ELEMENTWISE,
        int16=q_int16_elementwise.QMul16,
    ),
    declare(
        O.DIV,
        kernel=elementwise.Div,
        grad=rule("elementwise", "div"),
        grad_differentiable=True,
        weights=(0, 1),
    ),
    declare(
        O.MAXIMUM,
        kernel=elementwise.Maximum,
        int8=q_extra.QMaximum,
        int8_file_only=True,
        grad=rule("elementwise", "maximum"),
        grad_differentiable=True,
        channels=Channels.ELEMENTWISE,
        int16=q_int16.QMaximum16,
    ),
    declare(
        O.MINIMUM,
        kernel=elementwise.Minimum,
        int8=q_extra.QMinimum,
        int8_file_only=True,
        grad=rule("elementwise", "minimum"),
        grad_differentiable=True,
        channels=Channels.ELEMENTWISE,
        int16=q_int16.QMinimum16,
    ),
    declare(O.POW, kernel=elementwise.Pow),
    declare(
        O.EQUAL,
        kernel=elementwise.Equal,
        int8=q_extra.QEqual,
        int8_file_only=True,
        int16=q_int16.QEqual16,
    ),
    declare(
        O.GREATER,
        kernel=elementwise.Greater,
        int8=q_extra.QGreater,
        int8_file_only=True,
        int16=q_int16.QGreater16,
    ),
    declare(
        O.LESS,
        kernel=elementwise.Less,
        int8=q_extra.QLess,
        int8_file_only=True,
        int16=q_int16.QLess16,
    ),
    declare(O.FLOOR_DIV, kernel=elementwise.FloorDiv),
    declare(O.FLOOR_MOD, kernel=elementwise.FloorMod),
    declare(O.ATAN2, kernel=elementwise.Atan2),
    declare(
        O.SQUARED_DIFFERENCE,
        kernel=elementwise.SquaredDifference,
        int8=q_extra.QSquaredDifference,
        int8_file_only=True,
    ),
)
