"""Quantization: fake quantization for training, and the int8 boundaries."""

from __future__ import annotations

from sporenet.lite.kernels import dynamic_quantize, fake_quant
from sporenet.lite.kernels.quantized import convert as q_convert
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare, rule

OPS = (
    # straight-through: the gradient's own gradient treats the rounding as the identity
    declare(
        O.FAKE_QUANT,
        kernel=fake_quant.FakeQuant,
        grad=rule("fake_quant", "fake_quant"),
        grad_differentiable=True,
    ),
    declare(
        O.FAKE_QUANT_GRAD,
        kernel=fake_quant.FakeQuantGrad,
        grad=rule("backward", "fake_quant_grad"),
        grad_differentiable=True,
    ),
    declare(O.DYNAMIC_QUANTIZE, kernel=dynamic_quantize.DynamicQuantize),
    # float (or float16) in: QUANTIZE, DEQUANTIZE; int8 in: DEQUANTIZE, REQUANTIZE
    declare(O.QUANTIZE, kernel=q_convert.Quantize),
    declare(
        O.DEQUANTIZE,
        kernel=q_convert.Dequantize,
        int8=q_convert.Dequantize,
        raw_constants=True,
        int16=q_convert.Dequantize,
    ),
    declare(O.REQUANTIZE, int8=q_convert.Requantize, int16=q_int16.QRequantize16),
)
