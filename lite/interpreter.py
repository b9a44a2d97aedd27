"""The Interpreter: TFLite's API shape over a planned sporenet graph."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from sporenet.lite import lowp
from sporenet.lite.dims import value_input_candidates
from sporenet.lite.dtypes import STRING, as_strings, is_string
from sporenet.lite.errors import InputError, ShapeError, ValueNeededError
from sporenet.lite.format import load, parse
from sporenet.lite.graph import DYNAMIC, Model, shape_text
from sporenet.lite.kernels import raw
from sporenet.lite.planner import DirectRun, ExecutionPlan, plan
from sporenet.lite.signature_runner import SignatureRunner
from sporenet.lite.threads import BLAS
from sporenet.lite.variables import state_tensors, writable_copies
from sporenet.lite.warmup import budget_for, warm_up, writes_state


class Interpreter:
    """Loads a model, plans it once, and runs it.

    Interpreter(model_path=...) memory-maps the file; Interpreter(model_content=bytes) reads
    from memory. `num_threads` bounds the BLAS thread pool while invoke() runs (None: the
    runtime's default, `lite.threads.default_threads()`: 1, or $SPORENET_THREADS).

    A model with a "train" signature has state its graphs write (weights, optimizer
    slots, running statistics): the interpreter keeps writable copies of those tensors in
    `variables`, shared by every signature, so `get_signature_runner("train")` steps and
    `get_signature_runner("infer")` sees the weights it learned. A converted streaming
    model's state (TFLite resource variables) lives there too, so it persists between
    invokes; `reset_all_variables()` restores it.
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        model_content: bytes | None = None,
        num_threads: int | None = None,
        *,
        model: Model | None = None,
        signature: str = "infer",
    ) -> None:
        started = time.process_time()
        given = [x is not None for x in (model_path, model_content, model)]
        if sum(given) != 1:
            raise ValueError("pass exactly one of model_path, model_content or model")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
        if model is not None:
            self.model = model
        elif model_content is not None:
            self.model = parse(model_content)
        else:
            self.model = load(model_path)  # type: ignore[arg-type]
        self.num_threads = num_threads
        self.signature = self.model.signature(signature)
        self.variables: dict[int, np.ndarray] = writable_copies(
            self.model, state_tensors(self.model)
        )
        self._runners: dict[str, SignatureRunner] = {}
        self._shapes: dict[int, tuple[int, ...]] = {}
        self._input_names = self.signature.inputs
        self._output_names = self.signature.outputs
        self._input_indices = frozenset(self._input_names.values())
        # Shape-like inputs (a target shape, sizes, a Range bound fed at run time): the
        # plan depends on their values, so set_tensor keeps every input until invoke, which
        # re-plans when those values change.
        self._value_inputs: frozenset[int] = frozenset()
        self._values: dict[int, np.ndarray] = {}
        self._pending: dict[int, np.ndarray] = {}
        self._plan: ExecutionPlan = self._first_plan()  # type: ignore[assignment]
        # run()'s path for feeds of the planned dtypes and shapes, and the plan it is of
        # (rebuilt when a re-plan replaces that plan).
        self._direct: tuple[ExecutionPlan | None, DirectRun | None] = (None, None)
        self._warm_up(time.process_time() - started)

    # ---- planning
    def plan(self, key: str, shapes: dict[int, tuple[int, ...]]) -> ExecutionPlan:
        """A plan of signature `key` for the given input shapes, bound to `variables`.

        A size the model cannot take is a ShapeError that names the inputs given, their
        declared shapes, and then the node that refused."""
        try:
            return plan(self.model, key, shapes, variables=self.variables, values=self._values)
        except ShapeError as exc:
            resized = {i: s for i, s in shapes.items() if DYNAMIC in self.model.tensors[i].shape}
            if not resized:
                raise
            given = ", ".join(
                f"input {self.model.tensors[i].name!r} of shape {list(s)} (declared "
                f"{shape_text(self.model.tensors[i])})"
                for i, s in resized.items()
            )
            raise ShapeError(f"the model cannot run with {given}: {exc}") from None

    def _first_plan(self) -> ExecutionPlan | None:
        """The plan at the default sizes; None when it needs the values of shape-like
        inputs (then the first invoke plans, once they are set)."""
        try:
            return self.plan(self.signature.key, self._shapes)
        except ValueNeededError:
            candidates = value_input_candidates(self.model, self.signature.graph)
            if not candidates:
                raise
            self._value_inputs = frozenset(candidates)
            return None

    def _plan_for_values(self) -> None:
        """Re-plan when the pending shape-like inputs' values or any input shape changed,
        then copy the pending inputs into the plan."""
        pending = self._pending
        names = {i: n for n, i in self._input_names.items()}
        missing = sorted(names[i] for i in self._value_inputs if i not in pending)
        if missing:
            raise InputError(f"set the inputs {missing} before invoke: the plan depends on them")
        values = {i: pending[i] for i in self._value_inputs}
        shapes = {i: tuple(int(d) for d in v.shape) for i, v in pending.items()}
        planned = self._plan
        if (
            planned is None
            or any(planned.specs[i].shape != s for i, s in shapes.items())
            or any(not np.array_equal(self._values[i], v) for i, v in values.items())
        ):
            self._values = values
            self._shapes.update(shapes)
            self._plan = self.plan(self.signature.key, self._shapes)
        for i, value in pending.items():
            self._check_value(names[i], i, value)
            np.copyto(self._plan.arrays[i], value)

    def allocate_tensors(self) -> None:
        """(Re)plan the graph for the current input shapes, and warm the plan up."""
        started = time.process_time()
        self._plan = self.plan(self.signature.key, self._shapes)
        self._warm_up(time.process_time() - started)

    def _warm_up(self, load_seconds: float) -> None:
        """Pay the first run's one-time costs now, within a budget of a share of the
        `load_seconds` of CPU the load took (lite/warmup.py).

        Skipped for a plan that waits for the values of shape-like inputs and for a model
        with state its graphs write: a run on zeros must change nothing a caller sees."""
        planned = self._plan
        if planned is None or self._value_inputs or writes_state(self.model):
            return
        specs = {name: planned.specs[i] for name, i in self._input_names.items()}
        zeros = {
            name: np.full(s.shape, "", s.dtype) if s.dtype == STRING else np.zeros(s.shape, s.dtype)
            for name, s in specs.items()
        }
        with BLAS.limit(self.num_threads):
            warm_up(planned, lambda: self.run(zeros), budget_for(load_seconds))

    def get_signature_runner(self, signature_key: str | None = None) -> SignatureRunner:
        """A callable running one signature: `runner(x=...)` -> {output name: array}.

        As TFLite's: without a key, the model must have exactly one signature. Runners of
        one interpreter share its variables (see the class docstring).
        """
        keys = sorted(self.model.signatures) or ["infer"]
        if signature_key is None:
            if len(keys) != 1:
                raise InputError(f"the model has several signatures {keys}; name one")
            signature_key = keys[0]
        runner = self._runners.get(signature_key)
        if runner is None:
            self.model.signature(signature_key)  # raises SignatureError listing the keys
            runner = self._runners[signature_key] = SignatureRunner(self, signature_key)
        return runner

    def reset_all_variables(self) -> None:
        """Give every variable its value stored in the model again (the streaming state a
        converted TFLite model keeps between invokes, weights a train graph learned), as a
        new Interpreter would have it."""
        for i, array in self.variables.items():
            np.copyto(array, self.model.tensors[i].data)  # type: ignore[arg-type]

    def resize_tensor_input(self, input_index: int, tensor_size: Any) -> None:
        """Change an input's shape (only its dynamic dimensions may change); re-plans."""
        self._resize(input_index, tensor_size)
        self._plan = self.plan(self.signature.key, self._shapes)

    def _resize(self, input_index: int, tensor_size: Any) -> None:
        """Check and record an input's new shape (planned by the next allocate_tensors)."""
        self._check_input_index(input_index)
        declared = self.model.tensors[input_index].shape
        shape = tuple(int(d) for d in tensor_size)
        if len(shape) != len(declared) or any(
            d != DYNAMIC and d != s for d, s in zip(declared, shape, strict=True)
        ):
            raise InputError(
                f"input {self.model.tensors[input_index].name!r}: cannot resize to {list(shape)}; "
                f"its shape signature is {list(declared)} (only -1 dims may change)"
            )
        if any(s < 0 for s in shape):
            raise InputError(f"input shape {list(shape)} has a negative dimension")
        self._shapes[input_index] = shape

    # ---- details
    def _details(self, names: dict[str, int]) -> list[dict[str, Any]]:
        details = []
        for name, i in names.items():
            t = self.model.tensors[i]
            q = t.quantization
            details.append(
                {
                    "name": name,
                    "index": i,
                    "shape": np.array(
                        self._plan.specs[i].shape if self._plan is not None else t.shape, np.int32
                    ),
                    "shape_signature": np.array(t.shape, np.int32),
                    "dtype": t.dtype.type,
                    "quantization": (float(q.scale[0]), int(q.zero_point[0]))
                    if q is not None and q.scale.size == 1 and q.zero_point.size == 1
                    else (0.0, 0),
                    # TFLite's full form, per-axis parameters included.
                    "quantization_parameters": {
                        "scales": np.array(q.scale if q is not None else [], np.float32),
                        "zero_points": np.array(q.zero_point if q is not None else [], np.int32),
                        "quantized_dimension": int(q.axis) if q is not None else 0,
                    },
                }
            )
        return details

    def get_input_details(self) -> list[dict[str, Any]]:
        return self._details(self._input_names)

    def get_output_details(self) -> list[dict[str, Any]]:
        return self._details(self._output_names)

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {
            k: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
            for k, s in self.model.signatures.items()
        }

    # ---- tensors
    def _resize_all(self, shapes: dict[int, tuple[int, ...]]) -> None:
        """Resize several inputs and re-plan once (the planner checks them together)."""
        for index, shape in shapes.items():
            self._check_input_index(index)
            declared = self.model.tensors[index].shape
            if any(d != DYNAMIC and d != s for d, s in zip(declared, shape, strict=True)) or any(
                s < 0 for s in shape
            ):
                raise InputError(
                    f"input {self.model.tensors[index].name!r}: cannot resize to {list(shape)}; "
                    f"its shape signature is {list(declared)} (only -1 dims may change)"
                )
        self._shapes.update(shapes)
        self._plan = self.plan(self.signature.key, self._shapes)

    def _check_input_index(self, index: int) -> None:
        if index not in self._input_names.values():
            raise InputError(
                f"tensor {index} is not an input; inputs are {dict(self._input_names)}"
            )

    def _as_input(self, index: int, value: Any) -> np.ndarray:
        """`value` as an array; text (unicode, bytes) fed to a STRING input becomes the
        IR's object array of str."""
        value = np.asarray(value)
        dtype = self.model.tensors[index].dtype
        if dtype == STRING and is_string(value.dtype):
            return as_strings(value)
        if lowp.is_lowp(dtype):
            # The same type from another library (ml_dtypes' bfloat16, int4, ...): a view.
            same = lowp.as_lowp(value, dtype)
            return value if same is None else same
        return value

    def _check_value(self, name: str, index: int, value: np.ndarray) -> None:
        spec = self._plan.specs[index]
        if value.dtype != spec.dtype:
            raise InputError(f"input {name!r}: expected dtype {spec.dtype}, got {value.dtype}")
        if value.shape != spec.shape:
            raise InputError(
                f"input {name!r}: expected shape {list(spec.shape)}, got {list(value.shape)}"
                + (
                    " (call resize_tensor_input first)"
                    if -1 in self.model.tensors[index].shape
                    else ""
                )
            )

    def set_tensor(self, tensor_index: int, value: Any) -> None:
        """Copy `value` into an input tensor (dtype and shape must match exactly)."""
        planned = self._plan
        if (
            type(value) is np.ndarray
            and tensor_index in self._input_indices
            and planned is not None
            and not self._value_inputs
        ):
            # An array of the input's exact dtype and shape (a streaming model's every
            # call): nothing to convert or check, one copy.
            target = planned.arrays[tensor_index]
            if (
                value.dtype == target.dtype
                and value.shape == target.shape
                and not value.dtype.hasobject
            ):
                raw.copyto(target, value)
                return
        self._check_input_index(tensor_index)
        value = self._as_input(tensor_index, value)
        if self._value_inputs:
            self._pending[tensor_index] = np.array(value)  # copied in by invoke
            return
        name = self.model.tensors[tensor_index].name
        self._check_value(name, tensor_index, value)
        np.copyto(self._plan.arrays[tensor_index], value)

    def get_tensor(self, tensor_index: int) -> np.ndarray:
        """A copy of a tensor's current value (inputs, outputs, constants)."""
        if self._plan is None or tensor_index not in self._plan.arrays:
            raise InputError(f"tensor {tensor_index} is not materialized by this plan")
        return np.array(self._plan.arrays[tensor_index])

    # ---- running
    def invoke(self) -> None:
        """Run the planned graph on the inputs set with set_tensor."""
        if self._value_inputs:
            self._plan_for_values()
        self.execute(self._plan)

    def execute(self, planned: ExecutionPlan) -> None:
        """Run a plan of this interpreter's with the BLAS pool bounded to num_threads."""
        BLAS.call(self.num_threads, planned.run)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Set inputs by signature name, invoke, and return outputs by name (copies).

        An input whose dynamic dimensions differ from the current plan re-plans first.
        """
        planned, direct = self._direct
        if planned is not self._plan:
            planned = self._plan
            names = self._input_names, self._output_names
            direct = None if self._value_inputs else DirectRun.of(planned, *names)
            self._direct = (planned, direct)
        if direct is not None and direct.feed(feeds):
            self.execute(direct.plan)
            return direct.results()
        return self._checked_run(feeds)

    def _checked_run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`run` for any feeds: converted, checked, re-planned for new shapes."""
        unknown = sorted(set(feeds) - set(self._input_names))
        missing = sorted(set(self._input_names) - set(feeds))
        if unknown or missing:
            raise InputError(
                f"inputs expected {sorted(self._input_names)}; unknown {unknown}, missing {missing}"
            )
        values = {
            name: self._as_input(self._input_names[name], value) for name, value in feeds.items()
        }
        if self._value_inputs:
            self._pending = {self._input_names[name]: v for name, v in values.items()}
            self.invoke()
            arrays = self._plan.arrays
            return {name: np.array(arrays[i]) for name, i in self._output_names.items()}
        # Resize first (all inputs at once: a train graph's labels must match its batch),
        # copy after: a re-plan replaces every input array.
        resized = {}
        for name, value in values.items():
            index = self._input_names[name]
            if value.shape != self._plan.specs[index].shape and value.ndim == len(
                self.model.tensors[index].shape
            ):
                resized[index] = tuple(int(d) for d in value.shape)
        if resized:
            self._resize_all(resized)
        for name, value in values.items():
            index = self._input_names[name]
            self._check_value(name, index, value)
            np.copyto(self._plan.arrays[index], value)
        self.invoke()
        arrays = self._plan.arrays
        return {name: np.array(arrays[i]) for name, i in self._output_names.items()}
