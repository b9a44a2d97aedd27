"""Static int8/uint8 quantization of a float graph with calibrated ranges.

Every node whose op has an int8 kernel (lite's QUANTIZED_KERNELS), whose weights are
constants and whose float tensors all have a range becomes an integer node: its
activations int8 (or uint8) with per-tensor affine parameters, its weights symmetric int8
(per output channel by default), its bias int32. Other nodes stay float; a QUANTIZE or
DEQUANTIZE node is put wherever a tensor crosses between the two worlds, and the model's
inputs and outputs stay float. Quantized tensors keep their float tensor's name, so the
report can pair them; conversion tensors get a suffix.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.passes.graph_utils import add_constant, add_tensor
from sporenet.converter.quantize import params as P
from sporenet.lite.graph import Model, Node, Quantization
from sporenet.lite.kernels import FILE_QUANTIZED_ONLY, QUANTIZED_KERNELS
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_map, derived_set

# Views of the op declarations' quantizer traits (lite/opset/, `Quant`).
WEIGHT_AXIS: Mapping[OpCode, tuple[int, int]] = derived_map(lambda d: d.quant.weight)
"""op -> (weight input, output-channel axis of the weight as lite lays it out)"""
BIAS_INPUT: Mapping[OpCode, int] = derived_map(lambda d: d.quant.bias)
SAME_PARAMS: Set[OpCode] = derived_set(lambda d: d.quant.keeps_params)
"""Ops that only move or select values: the output keeps the input's parameters."""
FIXED_OUTPUT: Mapping[OpCode, tuple[float, int]] = derived_map(lambda d: d.quant.fixed_output)
"""(scale, int8 zero point) of outputs whose range is known: TFLite's choices."""


def int8_ops() -> frozenset[OpCode]:
    """Ops the runtime has integer kernels for that the quantizer may choose parameters for."""
    return frozenset(QUANTIZED_KERNELS) - FILE_QUANTIZED_ONLY


@dataclass
class FloatOp:
    """A node left in float, and why."""

    node: str
    op: str
    reason: str


class _Rewriter:
    def __init__(
        self,
        model: Model,
        ranges: Mapping[str, tuple[float, float]],
        dtype: np.dtype,
        per_channel: bool,
    ) -> None:
        self.model = model
        self.ranges = ranges
        self.dtype = dtype
        self.per_channel = per_channel
        self.graph = model.graphs[0]
        self.float_ops: list[FloatOp] = []
        self.quantized: set[int] = set()  # activation tensors that are now integer
        self.to_int: dict[int, int] = {}  # float tensor -> its QUANTIZE'd copy
        self.to_float: dict[int, int] = {}  # integer tensor -> its DEQUANTIZE'd copy
        self.out: list[Node] = []
        self.supported = int8_ops()

    # ---- tensors
    def params_for(self, index: int) -> Quantization | None:
        lo_hi = self.ranges.get(self.model.tensors[index].name)
        return None if lo_hi is None else P.activation_params(*lo_hi, self.dtype)

    def as_int(self, index: int, q: Quantization) -> int:
        if index in self.quantized:
            return index
        if index not in self.to_int:
            tensor = self.model.tensors[index]
            new = add_tensor(self.model, f"{tensor.name}/quantized", index)
            self.model.tensors[new].dtype = self.dtype
            self.model.tensors[new].quantization = q
            self.out.append(
                Node(
                    OpCode.QUANTIZE,
                    [index],
                    [new],
                    {"dtype": str(self.dtype)},
                    name=f"{tensor.name}/quantize",
                )
            )
            self.to_int[index] = new
        return self.to_int[index]

    def as_float(self, index: int) -> int:
        if index not in self.quantized:
            return index
        if index not in self.to_float:
            tensor = self.model.tensors[index]
            new = add_tensor(self.model, f"{tensor.name}/dequantized", index)
            self.model.tensors[new].dtype = np.dtype(np.float32)
            self.model.tensors[new].quantization = None
            self.out.append(
                Node(OpCode.DEQUANTIZE, [index], [new], name=f"{tensor.name}/dequantize")
            )
            self.to_float[index] = new
        return self.to_float[index]

    def input_params(self, index: int) -> Quantization | None:
        tensor = self.model.tensors[index]
        if index in self.quantized:
            return tensor.quantization
        if tensor.data is not None:
            return P.activation_params(
                float(tensor.data.min(initial=0.0)), float(tensor.data.max(initial=0.0)), self.dtype
            )
        return self.params_for(index)

    # ---- nodes
    def why_float(self, node: Node) -> str | None:
        if node.op not in self.supported:
            return "no int8 kernel"
        weight = WEIGHT_AXIS.get(node.op)
        for k, i in enumerate(node.inputs):
            if i == -1:
                continue
            tensor = self.model.tensors[i]
            if tensor.dtype.kind != "f":
                continue
            if weight is not None and k == weight[0]:
                if tensor.data is None:
                    if node.op == OpCode.MATMUL:
                        continue  # two activations
                    return "its weights are not constant"
            elif k == BIAS_INPUT.get(node.op):
                if tensor.data is None:
                    return "its bias is not constant"
            elif self.input_params(i) is None:
                return f"input {tensor.name!r} has no calibrated range"
        for i in node.outputs:
            tensor = self.model.tensors[i]
            if tensor.dtype.kind != "f":
                return f"output {tensor.name!r} is {tensor.dtype}"
            if (
                node.op not in SAME_PARAMS
                and node.op not in FIXED_OUTPUT
                and (self.params_for(i) is None)
            ):
                return f"output {tensor.name!r} has no calibrated range"
        return None

    def keep_float(self, node: Node, reason: str) -> None:
        node.inputs = [i if i == -1 else self.as_float(i) for i in node.inputs]
        self.out.append(node)
        if any(self.model.tensors[i].dtype.kind == "f" for i in node.outputs):
            self.float_ops.append(FloatOp(node.name, node.op.name, reason))

    def quantize_node(self, node: Node) -> None:
        weight = WEIGHT_AXIS.get(node.op)
        bias_at = BIAS_INPUT.get(node.op)
        inputs = list(node.inputs)
        first_q: Quantization | None = None
        w_q: Quantization | None = None
        for k, i in enumerate(inputs):
            if i in self.quantized and first_q is None:
                first_q = self.model.tensors[i].quantization
            if i == -1 or self.model.tensors[i].dtype.kind != "f" or k == bias_at:
                continue
            tensor = self.model.tensors[i]
            if weight is not None and k == weight[0] and tensor.data is not None:
                axis = weight[1] % tensor.data.ndim if self.per_channel else None
                values, w_q = P.quantize_weights(tensor.data, axis)
                inputs[k] = self._constant(f"{tensor.name}/int8", values, w_q)
            elif tensor.data is not None:
                q = self.input_params(i)
                if q is None:  # why_float checked every float input has parameters
                    raise ConversionError(f"{node.name}: {tensor.name!r} has no parameters")
                inputs[k] = self._constant(
                    f"{tensor.name}/{self.dtype}", P.quantize(tensor.data, q, self.dtype), q
                )
            else:
                q = self.input_params(i)
                inputs[k] = self.as_int(i, q)  # type: ignore[arg-type]
            if first_q is None:
                first_q = self.model.tensors[inputs[k]].quantization
        if bias_at is not None and bias_at < len(inputs) and inputs[bias_at] != -1:
            bias = self.model.tensors[inputs[bias_at]]
            if first_q is None or w_q is None or bias.data is None:
                raise ConversionError(f"{node.name}: no input or weight parameters for its bias")
            values, b_q = P.quantize_bias(bias.data, float(first_q.scale[0]), w_q)
            inputs[bias_at] = self._constant(f"{bias.name}/int32", values, b_q)
        node.inputs = inputs
        for i in node.outputs:
            tensor = self.model.tensors[i]
            if node.op in SAME_PARAMS and first_q is not None:
                tensor.quantization = first_q
            elif node.op in FIXED_OUTPUT:
                tensor.quantization = P.fixed_params(*FIXED_OUTPUT[node.op], self.dtype)
            else:
                tensor.quantization = self.params_for(i)
            tensor.dtype = self.dtype
            self.quantized.add(i)
        self.out.append(node)

    def _constant(self, name: str, values: np.ndarray, q: Quantization) -> int:
        index = add_constant(self.model, name, values)
        self.model.tensors[index].quantization = q
        return index

    def run(self) -> list[FloatOp]:
        for node in self.graph.nodes:
            reason = self.why_float(node)
            if reason is None:
                self.quantize_node(node)
            else:
                self.keep_float(node, reason)
        self.graph.nodes = self.out
        self._float_outputs()
        return self.float_ops

    def _float_outputs(self) -> None:
        """Model outputs stay float: a dequantized copy takes the output's name and place."""
        for position, index in enumerate(self.graph.outputs):
            if index not in self.quantized:
                continue
            tensor = self.model.tensors[index]
            name = tensor.name
            tensor.name = f"{name}/{self.dtype}"
            new = self.as_float(index)
            self.model.tensors[new].name = name
            self.graph.outputs[position] = new
            for sig in self.model.signatures.values():
                sig.outputs = {k: new if i == index else i for k, i in sig.outputs.items()}
        self.graph.nodes = self.out


def quantize_static(
    model: Model,
    ranges: Mapping[str, tuple[float, float]],
    *,
    dtype: np.dtype,
    per_channel: bool = True,
) -> list[FloatOp]:
    """Rewrite `model` (one graph, in place) to integer kernels; returns the ops left float."""
    return _Rewriter(model, ranges, np.dtype(dtype), per_channel).run()
