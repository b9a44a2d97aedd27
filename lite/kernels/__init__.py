"""The kernel registries, derived from the op declarations (lite/opset/).

`KERNELS` (float or dtype-generic kernels), `QUANTIZED_KERNELS` (int8/uint8 inputs with
quantization) and `FILE_QUANTIZED_ONLY` are read-only views; an op's kernels are declared
once, in its family's module under lite/opset/.
"""

from __future__ import annotations

from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.kernels.base import Kernel, TensorSpec
from sporenet.lite.kernels.quantized.base import is_int16_quantized, is_quantized
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import DerivedMap, DerivedSet, derived_map, derived_set

KERNELS: DerivedMap[OpCode, type[Kernel]] = derived_map(lambda d: d.kernel)
QUANTIZED_KERNELS: DerivedMap[OpCode, type[Kernel]] = derived_map(lambda d: d.int8)
"""The planner picks these when a node's first input is int8/uint8 with quantization."""
INT16_KERNELS: DerivedMap[OpCode, type[Kernel]] = derived_map(lambda d: d.int16)
"""int16x8 kernels (16-bit activations, 8-bit weights, TFLite's reference arithmetic),
picked when a node's first input is int16 with quantization."""

FILE_QUANTIZED_ONLY: DerivedSet[OpCode] = derived_set(lambda d: d.int8_file_only)
"""int8 kernels written for the parameters a TFLite file declares (TFLite's rounding;
operands that must share one set of parameters; variables): the static quantizer and QDQ
folding leave these ops float rather than choose parameters for them."""


def max_op_versions() -> dict[int, int]:
    """Newest op version this runtime runs, per op code (float and int8 kernels)."""
    versions = {int(op): kernel.version for op, kernel in QUANTIZED_KERNELS.items()}
    for op, kernel in INT16_KERNELS.items():
        versions[int(op)] = max(kernel.version, versions.get(int(op), 1))
    for op, kernel in KERNELS.items():
        versions[int(op)] = max(kernel.version, versions.get(int(op), 1))
    return versions


def supported_ops() -> list[str]:
    """Names of every op this runtime has a kernel for, sorted."""
    return sorted(op.name for op in {*KERNELS, *QUANTIZED_KERNELS, *INT16_KERNELS})


def kernel_class(op: OpCode, first: TensorSpec | None, where: str) -> type[Kernel]:
    """The kernel for a node: the int8 one when its first input is a quantized int8/uint8
    tensor, the int16x8 one when it is quantized int16, else the float (or dtype-generic)
    one."""
    if is_int16_quantized(first):
        cls = INT16_KERNELS.get(op)
        if cls is None:
            raise UnsupportedOpError(
                f"{where}: no int16x8 kernel for {op.name}; int16x8 ops: "
                f"{', '.join(sorted(o.name for o in INT16_KERNELS))}"
            )
        return cls
    if is_quantized(first):
        cls = QUANTIZED_KERNELS.get(op)
        if cls is None:
            raise UnsupportedOpError(
                f"{where}: no int8 kernel for {op.name} (input {first.dtype} with "  # type: ignore[union-attr]
                f"quantization); int8 ops: {', '.join(sorted(o.name for o in QUANTIZED_KERNELS))}"
            )
        return cls
    cls = KERNELS.get(op)
    if cls is None:
        raise UnsupportedOpError(
            f"{where}: {op.name} runs only on int8/uint8 tensors with "
            f"quantization, got {None if first is None else first.dtype}"
        )
    return cls
