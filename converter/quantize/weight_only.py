"""Weight-only modes: float16 constants, or int8 weights of Conv/FC/MatMul with float
activations ("dynamic range"). The runtime dequantizes such constants to float32 once at
load, so every kernel stays float and only the file shrinks."""

from __future__ import annotations

import numpy as np

from sporenet.converter.quantize import params as P
from sporenet.converter.quantize.static import WEIGHT_AXIS
from sporenet.lite.graph import Model

MIN_FP16_ELEMENTS = 16
"""Smaller float constants (scalars, epsilons, shape-like values) stay float32: they save
nothing and some of them would lose meaning in float16."""


def to_float16(model: Model) -> int:
    """Store float32 constants of at least MIN_FP16_ELEMENTS as float16 (those whose values
    do not fit float16's range stay float32); returns how many were converted."""
    converted = 0
    for tensor in model.tensors:
        data = tensor.data
        if data is None or data.dtype != np.float32 or data.size < MIN_FP16_ELEMENTS:
            continue
        half = data.astype(np.float16)
        if not np.array_equal(np.isfinite(half), np.isfinite(data)):
            continue
        half.flags.writeable = False
        tensor.data, tensor.dtype = half, half.dtype
        converted += 1
    return converted


def to_int8_weights(model: Model, *, per_channel: bool = True) -> int:
    """Store the constant float weights of Conv2D, FullyConnected and MatMul as symmetric
    int8 with their scales; returns how many were quantized."""
    done: set[int] = set()
    for graph in model.graphs:
        for node in graph.nodes:
            spec = WEIGHT_AXIS.get(node.op)
            if spec is None or spec[0] >= len(node.inputs):
                continue
            index = node.inputs[spec[0]]
            tensor = model.tensors[index] if index != -1 else None
            if (
                tensor is None
                or index in done
                or tensor.data is None
                or tensor.data.dtype != np.float32
                or tensor.data.ndim < 2
            ):
                continue
            if not _only_weight_of(model, index):
                continue
            axis = spec[1] % tensor.data.ndim if per_channel else None
            values, q = P.quantize_weights(tensor.data, axis)
            values.flags.writeable = False
            tensor.data, tensor.dtype, tensor.quantization = values, values.dtype, q
            done.add(index)
    return len(done)


def _only_weight_of(model: Model, index: int) -> bool:
    """Whether every reader of tensor `index` reads it as a Conv/FC/MatMul weight."""
    for graph in model.graphs:
        for node in graph.nodes:
            for k, i in enumerate(node.inputs):
                if i == index and (node.op not in WEIGHT_AXIS or WEIGHT_AXIS[node.op][0] != k):
                    return False
    return True
