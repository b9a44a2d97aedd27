"""The op declarations (lite/opset/) are consistent, and the old tables are their views."""

from __future__ import annotations

import pytest

from sporenet.lite.kernels import FILE_QUANTIZED_ONLY, KERNELS, QUANTIZED_KERNELS
from sporenet.lite.kernels.activation import FUSED_ACTIVATIONS
from sporenet.lite.kernels.training.activation_grad import DERIVATIVES
from sporenet.lite.opset import CLAMPS, DECLARATIONS, FROM_OUTPUT, FUSABLE, Activation


def test_each_declared_kernel_runs_its_own_op() -> None:
    for op, d in DECLARATIONS.items():
        for kernel in (d.kernel, d.int8):
            if kernel is not None:
                assert kernel.op == op, f"{op.name} declares {kernel.__name__} of {kernel.op.name}"
        assert d.kernel is not None or d.int8 is not None, f"{op.name} has no kernel"


def test_traits_are_consistent() -> None:
    for op, d in DECLARATIONS.items():
        assert not d.int8_file_only or d.int8 is not None, op.name
        assert not d.grad_differentiable or d.grad is not None, op.name
        assert d.fuses <= FUSABLE, op.name
        assert d.activation is None or d.activation in Activation, op.name
        kernel = d.kernel or d.int8
        assert kernel is not None
        most = kernel.num_inputs[1]
        positions = [*d.weights, *d.writes]
        if d.quant.weight is not None:
            positions.append(d.quant.weight[0])
        if d.quant.bias is not None:
            positions.append(d.quant.bias)
        assert most < 0 or all(k < most for k in positions), (op.name, positions, most)


def test_views_follow_the_declarations() -> None:
    assert dict(KERNELS) == {op: d.kernel for op, d in DECLARATIONS.items() if d.kernel}
    assert dict(QUANTIZED_KERNELS) == {op: d.int8 for op, d in DECLARATIONS.items() if d.int8}
    assert set(FILE_QUANTIZED_ONLY) == {op for op, d in DECLARATIONS.items() if d.int8_file_only}
    with pytest.raises(TypeError):
        KERNELS[next(iter(KERNELS))] = None  # type: ignore[index]


def test_activation_tables_name_enum_members() -> None:
    """The fused forms the float kernels apply, the derivatives ACTIVATION_GRAD knows and
    the int8 clamps are all spelled by the one enum."""
    assert set(FUSED_ACTIVATIONS) <= set(Activation)
    assert set(DERIVATIVES) <= set(Activation)
    assert {*FUSED_ACTIVATIONS, Activation.CLIP, Activation.LEAKY_RELU} >= FUSABLE
    assert CLAMPS <= FROM_OUTPUT
    declared = {d.activation for d in DECLARATIONS.values() if d.activation is not None}
    assert declared <= set(DERIVATIVES), sorted(declared - set(DERIVATIVES))
