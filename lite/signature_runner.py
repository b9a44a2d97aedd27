"""SignatureRunner: one signature of an Interpreter as a callable, as TFLite's.

    runner = interpreter.get_signature_runner("train")
    out = runner(input=x, labels=y, lr=np.float32(1e-3))   # {"loss": ..., "logits": ...}

Inputs are keyword arguments named as in the signature; a value of another dtype of the
same kind (a Python float for a float32 input) is cast, any other mismatch is an
InputError naming the input. Each distinct set of input shapes is planned once and kept
(a training loop's full batches and its last, smaller one), bound to the interpreter's
shared variables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.planner import DirectRun, ExecutionPlan

if TYPE_CHECKING:
    from sporenet.lite.interpreter import Interpreter

MAX_PLANS = 4
"""Plans kept per runner (least recently used dropped first)."""


class SignatureRunner:
    """Runs one signature of an Interpreter: `runner(**inputs) -> {output: array}`."""

    def __init__(self, interpreter: Interpreter, key: str) -> None:
        self.interpreter = interpreter
        self.key = key
        self.signature = interpreter.model.signature(key)
        self._plans: dict[tuple, ExecutionPlan] = {}
        self._last: ExecutionPlan | None = None
        # The direct path for inputs of the dtypes and shapes of a plan, and that plan.
        self._direct: tuple[ExecutionPlan | None, DirectRun | None] = (None, None)

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        """Input name -> {index, shape_signature, dtype}."""
        return self._details(self.signature.inputs)

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        """Output name -> {index, shape_signature, dtype}."""
        return self._details(self.signature.outputs)

    def _details(self, names: dict[str, int]) -> dict[str, dict[str, Any]]:
        tensors = self.interpreter.model.tensors
        return {
            name: {
                "index": i,
                "shape_signature": np.array(tensors[i].shape, np.int32),
                "dtype": tensors[i].dtype.type,
            }
            for name, i in names.items()
        }

    def _arrays(self, inputs: dict[str, Any]) -> dict[int, np.ndarray]:
        sig = self.signature
        unknown = sorted(set(inputs) - set(sig.inputs))
        missing = sorted(set(sig.inputs) - set(inputs))
        if unknown or missing:
            raise InputError(
                f"signature {self.key!r} expects inputs {sorted(sig.inputs)}; "
                f"unknown {unknown}, missing {missing}"
            )
        arrays = {}
        for name, value in inputs.items():
            index = sig.inputs[name]
            tensor = self.interpreter.model.tensors[index]
            value = np.asarray(value)
            if value.dtype != tensor.dtype:
                if not np.can_cast(value.dtype, tensor.dtype, "same_kind"):
                    raise InputError(f"input {name!r}: expected {tensor.dtype}, got {value.dtype}")
                value = value.astype(tensor.dtype)
            declared = tensor.shape
            if len(value.shape) != len(declared) or any(
                d not in (-1, s) for d, s in zip(declared, value.shape, strict=True)
            ):
                raise InputError(
                    f"input {name!r}: shape {list(value.shape)} does not match "
                    f"its signature {list(declared)} (-1: any size)"
                )
            arrays[index] = value
        return arrays

    def prepare(self, inputs: dict[str, Any]) -> ExecutionPlan:
        """The plan for these inputs' shapes, with the inputs copied in (not run yet)."""
        arrays = self._arrays(inputs)
        cache = tuple(sorted((i, a.shape) for i, a in arrays.items()))
        planned = self._plans.pop(cache, None)
        if planned is None:
            planned = self.interpreter.plan(self.key, {i: a.shape for i, a in arrays.items()})
            while len(self._plans) >= MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
        self._plans[cache] = planned  # most recently used last
        for i, a in arrays.items():
            np.copyto(planned.arrays[i], a)
        self._last = planned
        return planned

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        """Run the signature on keyword inputs; returns copies of its outputs by name."""
        last, direct = self._direct
        if direct is not None and last is self._last and direct.feed(inputs):
            self.interpreter.execute(direct.plan)
            return direct.results()
        planned = self.prepare(inputs)
        if last is not planned:
            sig = self.signature
            self._direct = (planned, DirectRun.of(planned, sig.inputs, sig.outputs))
        self.interpreter.execute(planned)
        return {name: np.array(planned.arrays[i]) for name, i in self.signature.outputs.items()}

    def output(self, name: str) -> np.ndarray:
        """A view of output `name` from the last run (no copy; valid until the next run)."""
        if self._last is None:
            raise InputError(f"signature {self.key!r} has not run yet")
        if name not in self.signature.outputs:
            raise InputError(f"no output {name!r}; outputs are {sorted(self.signature.outputs)}")
        return self._last.arrays[self.signature.outputs[name]]
