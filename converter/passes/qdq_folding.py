"""QDQ folding: DEQUANTIZE -> float op -> QUANTIZE becomes the op's integer kernel.

A quantized ONNX model (QDQ format, or QLinear ops imported as DEQUANTIZE / float op /
QUANTIZE) says which values are integers; the float op between the pairs is what the
runtime's int8 kernel computes. A node folds when its op has an int8 kernel, each float
activation input comes from a DEQUANTIZE of a per-tensor int8/uint8 tensor, its weights
are int8 constants with symmetric parameters, and each output is read only by QUANTIZE
nodes with one set of parameters. Its bias becomes int32 (scale input_scale *
weight_scale[c]); other float constants are quantized with their own range. Nodes that
do not fold keep their float form, which computes the same values.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.activation_fusion import CLAMPS
from sporenet.converter.passes.graph_utils import add_constant, consumers, producers, replace_uses
from sporenet.converter.quantize import params as P
from sporenet.converter.quantize.static import BIAS_INPUT, FIXED_OUTPUT, SAME_PARAMS, WEIGHT_AXIS
from sporenet.lite.graph import Model, Node, Quantization
from sporenet.lite.kernels import FILE_QUANTIZED_ONLY, QUANTIZED_KERNELS
from sporenet.lite.ops import OpCode

CONVERSIONS = frozenset({OpCode.QUANTIZE, OpCode.DEQUANTIZE, OpCode.REQUANTIZE})


def _same(a: Quantization | None, b: Quantization | None) -> bool:
    if a is None or b is None or a.scale.size != 1 or b.scale.size != 1:
        return False
    za = int(a.zero_point[0]) if a.zero_point.size else 0
    zb = int(b.zero_point[0]) if b.zero_point.size else 0
    return np.float32(a.scale[0]) == np.float32(b.scale[0]) and za == zb


def _symmetric(q: Quantization | None) -> bool:
    return q is not None and (q.zero_point.size == 0 or not np.any(q.zero_point))


class _Folder:
    def __init__(self, model: Model, graph_index: int) -> None:
        self.model = model
        self.graph_index = graph_index
        self.graph = model.graphs[graph_index]
        self.uses = consumers(self.graph)
        self.made = producers(self.graph)

    def outputs(self, node: Node) -> list[list[Node]] | None:
        """Per output, the QUANTIZE nodes reading it (all with the same parameters)."""
        result = []
        for o in node.outputs:
            readers = self.uses.get(o, [])
            if (
                not readers
                or o in self.graph.outputs
                or any(r.op != OpCode.QUANTIZE for r in readers)
            ):
                return None
            first = self.model.tensors[readers[0].outputs[0]]
            if any(
                not _same(self.model.tensors[r.outputs[0]].quantization, first.quantization)
                or self.model.tensors[r.outputs[0]].dtype != first.dtype
                for r in readers
            ):
                return None
            result.append(readers)
        return result

    def inputs(self, node: Node) -> list[int] | None:
        """The node's inputs once folded (integer activations, int32 bias), or None."""
        weight = WEIGHT_AXIS.get(node.op)
        bias_at = BIAS_INPUT.get(node.op)
        new: list[int] = []
        first_q: Quantization | None = None
        for k, i in enumerate(node.inputs):
            tensor = self.model.tensors[i] if i != -1 else None
            producer = self.made.get(i)
            if tensor is None or (
                tensor.data is not None
                and tensor.dtype.kind not in "f"
                and tensor.quantization is None
            ):
                new.append(i)  # absent, or an integer parameter (a shape)
            elif producer is not None and producer.op == OpCode.DEQUANTIZE:
                source = producer.inputs[0]
                q = self.model.tensors[source].quantization
                if q is None or q.scale.size != 1 or self.model.tensors[source].data is not None:
                    return None
                new.append(source)
            elif tensor.data is not None and tensor.quantization is not None:
                if weight is not None and k == weight[0] and not _symmetric(tensor.quantization):
                    return None  # the int8 kernels take symmetric weights
                new.append(i)
            elif tensor.data is not None and k == bias_at:
                new.append(i)  # converted below, once the input and weight scales are known
            elif tensor.data is not None and tensor.dtype.kind == "f":
                dtype = self.model.tensors[new[0]].dtype if new else np.dtype(np.int8)
                q = P.activation_params(
                    float(tensor.data.min(initial=0.0)), float(tensor.data.max(initial=0.0)), dtype
                )
                new.append(
                    add_constant(
                        self.model, f"{tensor.name}/{dtype}", P.quantize(tensor.data, q, dtype)
                    )
                )
                self.model.tensors[new[-1]].quantization = q
            else:
                return None
            if k == 0:
                first_q = self.model.tensors[new[0]].quantization
        if first_q is None or self.model.tensors[new[0]].dtype not in P.INT_RANGES:
            return None
        if bias_at is not None and bias_at < len(new) and new[bias_at] != -1:
            bias = self.model.tensors[new[bias_at]]
            w_q = self.model.tensors[new[weight[0]]].quantization if weight else None
            if bias.data is None or w_q is None:
                return None
            values, b_q = P.quantize_bias(bias.data, float(first_q.scale[0]), w_q)
            new[bias_at] = add_constant(self.model, f"{bias.name}/int32", values)
            self.model.tensors[new[bias_at]].quantization = b_q
        return new

    def fold(self, node: Node) -> bool:
        if (
            node.op not in QUANTIZED_KERNELS
            or node.op in CONVERSIONS
            or node.op in FILE_QUANTIZED_ONLY
        ):
            return False
        if str(node.attrs.get("activation", "none")) not in CLAMPS:
            return False  # an int8 kernel applies only clamps (tanh, sigmoid... stay float)
        readers = self.outputs(node)
        if readers is None:
            return False
        new_inputs = self.inputs(node)
        if new_inputs is None:
            return False
        in_q = self.model.tensors[new_inputs[0]].quantization
        outs = [self.model.tensors[r[0].outputs[0]] for r in readers]
        if node.op in SAME_PARAMS and not all(_same(t.quantization, in_q) for t in outs):
            return False
        if node.op in FIXED_OUTPUT and outs[0].dtype != self.model.tensors[new_inputs[0]].dtype:
            return False
        node.inputs = new_inputs
        for position, quantizers in enumerate(readers):
            kept = quantizers[0].outputs[0]
            for q_node in quantizers:
                if q_node.outputs[0] != kept:
                    replace_uses(self.model, self.graph_index, q_node.outputs[0], kept)
                self.graph.nodes.remove(q_node)
            node.outputs[position] = kept
        return True


def fold_qdq(model: Model) -> int:
    """Fold every foldable DEQUANTIZE -> op -> QUANTIZE group; returns how many folded."""
    folded = 0
    for gi, graph in enumerate(model.graphs):
        if not any(n.op == OpCode.QUANTIZE for n in graph.nodes):
            continue
        folder = _Folder(model, gi)
        for node in list(graph.nodes):
            if folder.fold(node):
                folded += 1
                folder = _Folder(model, gi)  # the fold changed who reads what
    return folded
