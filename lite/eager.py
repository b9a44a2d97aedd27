"""Running one op at once on NumPy arrays, with the same kernels the planner uses.

Used by cloud's eager mode and by kernel tests. Each call prepares the kernel (checks,
shape inference) and computes; nothing is cached, so it is for convenience, not speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.kernels import KERNELS, supported_ops
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.ops import OpCode


def run_op(op: OpCode, inputs: Sequence[np.ndarray | None], *, num_outputs: int = 1,
           constant_inputs: Sequence[int] | None = None, **attrs: Any) -> list[np.ndarray]:
    """Run `op` on `inputs` (None for an absent optional input) and return its outputs.

    `constant_inputs` lists input positions the kernel may treat as load-time constants
    (by default every input is passed as a constant, as folding would).
    """
    if op not in KERNELS:
        raise UnsupportedOpError(f"no kernel for {op.name}; supported ops: {supported_ops()}")
    cls = KERNELS[op]
    arrays = [None if x is None else np.asarray(x) for x in inputs]
    consts = set(range(len(arrays))) if constant_inputs is None else set(constant_inputs)
    specs = [None if a is None else
             TensorSpec(a.shape, a.dtype, a if k in consts else None)
             for k, a in enumerate(arrays)]
    lo, hi = cls.num_inputs
    if not lo <= len(arrays) <= hi:
        raise ShapeError(f"{op.name}: takes {lo}..{hi} inputs, got {len(arrays)}")
    kernel = cls(Attrs(op.name, attrs, num_outputs), specs)
    if kernel.is_view:
        return [np.array(v) for v in kernel.view(arrays)][:num_outputs]
    outs = [np.empty(s.shape, s.dtype) for s in kernel.output_specs]
    step = kernel.bind(arrays, outs)
    if step is not None:
        step()
    return outs[:num_outputs]
