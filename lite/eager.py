"""Running one op at once on NumPy arrays, with the same kernels the planner uses.

`prepare_kernel` and `evaluate` are the one way to prepare a kernel for a node and run it
on constant inputs. `fold` is constant folding, the one rule of which nodes are computed
once instead of at every run: the planner calls it at load time, the ONNX importer as it
emits nodes, and the graph passes (`fold_node`) at conversion time, each with the kernel
that runs the node (the int8 one for a quantized node). `run_op` (cloud's eager mode,
kernel tests) prepares and computes in one call; nothing is cached, so it is for
convenience, not speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.graph import Model, Node, Quantization
from sporenet.lite.kernels import KERNELS, QUANTIZED_KERNELS, kernel_class, supported_ops
from sporenet.lite.kernels.base import Attrs, Kernel, TensorSpec
from sporenet.lite.kernels.float16 import Float32Compute, widens
from sporenet.lite.kernels.quantized.base import is_quantized
from sporenet.lite.ops import OpCode


def prepare_kernel(
    op: OpCode,
    attrs: dict[str, Any],
    in_specs: Sequence[TensorSpec | None],
    num_outputs: int,
    *,
    where: str | None = None,
    check_outputs: bool = True,
    output_quant: Sequence[Quantization | None] = (),
    output_dtypes: Sequence[np.dtype] = (),
    model: Model | None = None,
) -> Kernel:
    """The runtime kernel for one node, prepared for `in_specs` (None: an absent optional
    input). Every failure is a ShapeError, prefixed with `where` (the node) when given.
    The kernel is the int8 one when the first input is quantized (kernel_class);
    `output_quant`/`output_dtypes` are what the file declares on the outputs; `model` is
    given to control-flow kernels, which plan their subgraphs.
    `check_outputs=False` accepts a kernel with
    fewer outputs than `num_outputs` (an optimizer update writes its state in place)."""
    prefix = f"{where}: " if where else ""
    cls = kernel_class(op, in_specs[0] if in_specs else None, where or op.name)
    lo, hi = cls.num_inputs
    if not lo <= len(in_specs) <= hi:
        raise ShapeError(f"{where or op.name}: takes {lo}..{hi} inputs, got {len(in_specs)}")
    try:
        attributes = Attrs(op.name, attrs, num_outputs, output_quant, output_dtypes, model=model)
        if cls is KERNELS.get(op) and widens(op, in_specs):
            kernel: Kernel = Float32Compute(cls, attributes, list(in_specs))
        else:
            kernel = cls(attributes, list(in_specs))
    except ShapeError as exc:
        if not where:
            raise
        raise type(exc)(f"{prefix}{exc}") from None
    except (ValueError, TypeError, IndexError, OverflowError, KeyError) as exc:
        raise ShapeError(f"{where or op.name}: invalid attributes or inputs ({exc})") from None
    if check_outputs and len(kernel.output_specs) < num_outputs:
        raise ShapeError(
            f"{where or op.name}: produces {len(kernel.output_specs)} outputs, "
            f"the node lists {num_outputs}"
        )
    return kernel


def evaluate(kernel: Kernel, values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run a prepared kernel on constant inputs; the outputs are new arrays."""
    inputs = list(values)
    if kernel.is_view:
        outs = [np.array(v) for v in kernel.view(inputs)]
    else:
        outs = [np.empty(s.shape, s.dtype) for s in kernel.output_specs]
        step = kernel.bind(inputs, outs)
        if step is not None:
            step()
    return outs


def fold(kernel: Kernel) -> list[np.ndarray] | None:
    """The outputs of a prepared kernel computed now, or None when its node must run with
    the graph: the kernel is not `foldable`, or an input's value is unknown and the kernel
    does not know its outputs from the input shapes alone (Shape)."""
    if not kernel.foldable:
        return None
    specs = kernel.inputs
    known = all(s is None or s.value is not None for s in specs) or all(
        s.value is not None for s in kernel.output_specs
    )
    if not known:
        return None
    return evaluate(kernel, [None if s is None else s.value for s in specs])


def fold_node(
    model: Model, node: Node, in_specs: Sequence[TensorSpec | None]
) -> list[np.ndarray] | None:
    """`fold` for a node of a graph being rewritten, prepared as the planner prepares it,
    with its inputs' specs carrying their values and quantization; None also when no kernel
    takes these inputs (the node is left for the planner, which reports the error with the
    node's place)."""
    outputs = [model.tensors[i] for i in node.outputs]
    try:
        cls = kernel_class(node.op, in_specs[0] if in_specs else None, node.op.name)
        if not cls.foldable:
            return None  # known before preparing it (an If would plan its subgraphs)
        kernel = prepare_kernel(
            node.op,
            node.attrs,
            in_specs,
            len(node.outputs),
            output_quant=[t.quantization for t in outputs],
            output_dtypes=[t.dtype for t in outputs],
        )
    except (ShapeError, UnsupportedOpError):
        return None
    if type(kernel) is not QUANTIZED_KERNELS.get(node.op) and any(
        is_quantized(s) and k not in kernel.quantized_weights for k, s in enumerate(in_specs)
    ):
        return None  # a float kernel's quantized weight: the planner dequantizes it first
    return fold(kernel)


def run_op(
    op: OpCode,
    inputs: Sequence[np.ndarray | None],
    *,
    num_outputs: int = 1,
    constant_inputs: Sequence[int] | None = None,
    model: Model | None = None,
    **attrs: Any,
) -> list[np.ndarray]:
    """Run `op` on `inputs` (None for an absent optional input) and return its outputs.

    `constant_inputs` lists input positions the kernel may treat as load-time constants
    (by default every input is passed as a constant, as folding would). Control-flow ops
    need the `model` whose subgraphs they run.
    """
    if op not in KERNELS:
        raise UnsupportedOpError(f"no kernel for {op.name}; supported ops: {supported_ops()}")
    arrays = [None if x is None else np.asarray(x) for x in inputs]
    consts = set(range(len(arrays))) if constant_inputs is None else set(constant_inputs)
    specs = [
        None if a is None else TensorSpec(a.shape, a.dtype, a if k in consts else None)
        for k, a in enumerate(arrays)
    ]
    kernel = prepare_kernel(op, attrs, specs, num_outputs, check_outputs=False, model=model)
    return evaluate(kernel, arrays)[:num_outputs]
