"""One ONNX node as handlers see it: resolved input tensors, attributes, opset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.converter.errors import ConversionError


@dataclass
class OnnxNode:
    """An ONNX NodeProto with its inputs resolved to IR tensor indices (-1: absent)."""

    op_type: str
    name: str
    inputs: list[int]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 13

    def input(self, k: int) -> int:
        """Tensor index of input k, or -1 when it is absent."""
        return self.inputs[k] if k < len(self.inputs) else -1

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return [v.decode() for v in value]
        return value

    def ints(self, name: str, default: Any = None) -> list[int] | None:
        value = self.attrs.get(name, default)
        return None if value is None else [int(v) for v in value]

    @property
    def num_outputs(self) -> int:
        """Outputs that are requested (trailing empty names are absent optional outputs)."""
        n = len(self.outputs)
        while n and not self.outputs[n - 1]:
            n -= 1
        return n

    def fail(self, message: str) -> ConversionError:
        return ConversionError(f"node {self.name!r} ({self.op_type}): {message}")

    def only_first_output(self) -> None:
        """Reject nodes whose optional extra outputs are used (e.g. MaxPool indices)."""
        if self.num_outputs > 1:
            raise self.fail(
                f"only the first output is supported, but {self.num_outputs} are requested "
                f"({self.outputs})"
            )


def as_ints(value: np.ndarray | None) -> list[int] | None:
    return None if value is None else [int(v) for v in np.ravel(value)]
