"""The kernel contract: prepare once (check, infer shapes, pre-pack weights), compute many times.

A kernel object is built once per node by the planner with the static description of its
inputs (TensorSpec: shape, dtype and, for constants, the value). The constructor checks
attributes, shapes and dtypes and sets `output_specs`. `bind` receives the concrete arrays
the planner allocated and returns a zero-argument closure that only computes into them.

Everything the planner, constant folding (`fold` in lite/eager.py) and the warm-up read
from a kernel is declared on `Kernel` below with its default: a kernel sets what differs.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sporenet.lite.errors import ShapeError, ValueNeededError
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode

if TYPE_CHECKING:
    from sporenet.lite.planner import ExecutionPlan

Compute = Callable[[], None]
ScratchLayout = list[tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a kernel knows about a tensor before running: shape, dtype, constant value and,
    for int8/uint8/int32 tensors of quantized graphs, the affine quantization parameters."""

    shape: tuple[int, ...]
    dtype: np.dtype
    value: np.ndarray | None = None
    quant: Quantization | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def required(arrays: Sequence[np.ndarray | None], index: int) -> np.ndarray:
    """Array `index` of the list `bind` receives, for an input the kernel's constructor
    checked is present (the planner binds an array to every present input)."""
    array = arrays[index]
    if array is None:
        raise ShapeError(f"input {index} is required but no array was bound to it")
    return array


class Attrs:
    """Typed access to a node's attributes; a wrong type or missing value is a ShapeError."""

    # One per planned node, kept by its kernel: no instance dict.
    __slots__ = ("model", "num_outputs", "op", "output_dtypes", "output_quant", "values")

    def __init__(
        self,
        op: str,
        values: dict[str, Any],
        num_outputs: int = 1,
        output_quant: Sequence[Quantization | None] = (),
        output_dtypes: Sequence[np.dtype] = (),
        *,
        model: Any = None,
    ) -> None:
        self.op = op
        # The whole model, for control-flow kernels that plan their subgraphs (else None).
        self.model = model
        self.values = values
        self.num_outputs = num_outputs  # how many outputs the node lists (Split needs it)
        # The quantization the file declares on each output (quantized kernels follow it).
        self.output_quant = list(output_quant)
        self.output_dtypes = list(output_dtypes)  # as the file declares them

    def _get(self, name: str, default: Any, types: tuple[type, ...], kind: str) -> Any:
        if name not in self.values:
            if default is _REQUIRED:
                raise ShapeError(f"{self.op}: attribute {name!r} ({kind}) is required")
            return default
        value = self.values[name]
        if not isinstance(value, types) or (isinstance(value, bool) and int not in types):
            raise ShapeError(f"{self.op}: attribute {name!r} must be {kind}, got {value!r}")
        return value

    # The getters are named after the types they return, so their annotations spell the
    # builtins out. A missing attribute gives `default` (None unless given).
    def int(self, name: builtins.str, default: Any = None) -> builtins.int:
        return self._get(name, default, (int, np.integer), "an int")

    def float(self, name: builtins.str, default: Any = None) -> builtins.float:
        value = self._get(name, default, (float, int, np.floating, np.integer), "a float")
        return None if value is None else float(value)

    def str(self, name: builtins.str, default: Any = None) -> builtins.str:
        return self._get(name, default, (str,), "a string")

    def ints(self, name: builtins.str, default: Any = None) -> list[builtins.int]:
        value = self._get(name, default, (list, tuple), "a list of ints")
        if value is not None and not all(isinstance(v, int | np.integer) for v in value):
            raise ShapeError(f"{self.op}: attribute {name!r} must be a list of ints, got {value!r}")
        return None if value is None else [int(v) for v in value]

    def floats(self, name: builtins.str, default: Any = None) -> list[builtins.float]:
        value = self._get(name, default, (list, tuple), "a list of floats")
        return None if value is None else [float(v) for v in value]


_REQUIRED = object()
REQUIRED: Any = _REQUIRED
"""Pass as the default of an Attrs getter to make the attribute mandatory."""


class ChannelsLast(IntEnum):
    """A kernel's stance on a 4-D tensor stored channels-last. The planner stores a tensor
    so when its producer and every reader accept it and one of them prefers it."""

    REFUSED = 0  # the kernel needs contiguous NCHW
    ACCEPTED = 1  # correct and about as fast either way
    PREFERRED = 2  # faster channels-last (it saves a transposing copy)


class Kernel:
    """Base class of every kernel. Subclasses set `op`, implement __init__ checks and bind;
    the other attributes below are hooks with defaults that fit most kernels."""

    op: ClassVar[OpCode]
    version: ClassVar[int] = 1
    num_inputs: ClassVar[tuple[int, int]] = (1, 1)
    """(min, max) count of inputs, absent (-1) ones included."""
    is_view: bool = False
    """Whether the outputs alias the first input (`view`; no copy, no step at run time);
    an instance may set it in __init__ (a slice that is one contiguous block)."""
    elementwise: ClassVar[bool] = False
    """Whether the output follows its input's layout even past a reader that leans NCHW
    (Kernel.leans_nchw): a pass over mixed layouts costs more than the lean."""

    # ---- constant folding and weights (lite/eager.py `fold`, lite/planner.py)
    foldable: bool = True
    """Whether a node whose inputs are all known may be computed once, when the graph is
    converted or planned, and replaced by its outputs. False for kernels that write state,
    draw random numbers or run subgraphs. Read from the kernel that runs (the int8 one for
    a quantized node); an instance may also clear it in __init__ (the graph passes ask
    the class first, so a class that is not foldable is never prepared for folding)."""
    quantized_weights: ClassVar[frozenset[int]] = frozenset()
    """Input positions this float kernel reads as stored when they are quantized integer
    constants (it dequantizes them into its own packed form); any other quantized or
    float16 constant input is dequantized by the planner first (weight-only models)."""
    constant_inputs: dict[int, np.ndarray]
    """Set by the planner: {input position: the float32 constant `bind` receives instead
    of the stored array} for the inputs it dequantized (see `quantized_weights`)."""

    # ---- memory
    scratch_layout: ScratchLayout
    """(shape, dtype) of the temporaries the step needs, set in __init__; `bind` takes
    them with `scratch_arrays`. A shorthand for `workspace.temporary`, the one way a step
    gets memory it uses only while it runs."""

    # ---- warm-up (lite/warmup.py)
    subplans: Sequence[ExecutionPlan] = ()
    """Plans of the subgraphs this kernel runs (control flow), warmed with the graph."""
    warm_steps: Sequence[Compute] = ()
    """Steps the warm-up runs besides `bind`'s: paths zero inputs do not take (the
    branches of an If), set by `bind`."""
    trip_count_planned: bool = True
    """False when the work of a step depends on input values (a Loop whose trip count is
    not a planned constant): the warm-up, on zeros, then runs only the subplans."""

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        self.attrs = attrs
        self.inputs = list(inputs)
        self.output_specs: list[TensorSpec] = []
        self.constant_inputs = {}
        self.scratch_layout = []

    # ---- helpers for subclasses' prepare step
    def fail(self, message: str) -> ShapeError:
        return ShapeError(f"{self.op.name}: {message}")

    def require_float(self, index: int = 0) -> TensorSpec:
        spec = self.input(index)
        if spec.dtype.kind != "f":
            raise self.fail(f"input {index} must be a float tensor, got {spec.dtype}")
        return spec

    def broadcast_shape(self, *specs: TensorSpec) -> tuple[int, ...]:
        """The NumPy broadcast of the inputs' shapes, or a ShapeError naming them all."""
        try:
            return tuple(np.broadcast_shapes(*(spec.shape for spec in specs)))
        except ValueError:
            shapes = [str(list(spec.shape)) for spec in specs]
            listed = f"{', '.join(shapes[:-1])} and {shapes[-1]}"
            raise self.fail(f"shapes {listed} do not broadcast") from None

    def input(self, index: int) -> TensorSpec:
        spec = self.inputs[index] if index < len(self.inputs) else None
        if spec is None:
            raise self.fail(f"input {index} is required")
        return spec

    def optional_input(self, index: int) -> TensorSpec | None:
        return self.inputs[index] if index < len(self.inputs) else None

    def constant(self, index: int, what: str) -> np.ndarray:
        spec = self.input(index)
        if spec.value is None:
            raise ValueNeededError(
                f"{self.op.name}: input {index} ({what}) must be a constant known when the "
                "graph is planned (stored, computed from input shapes, or a shape-like input)"
            )
        return spec.value

    # ---- storage layout of 4-D tensors
    def channels_last_input(self, index: int) -> ChannelsLast:
        """How `bind` takes input `index` as an (N, C, H, W) view of channels-last
        (N, H, W, C) memory (see ChannelsLast)."""
        return ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        """How `bind` writes output `index` into an (N, C, H, W) view of channels-last
        memory (see ChannelsLast)."""
        return ChannelsLast.REFUSED

    def channels_last_follows(self, index: int) -> int | None:
        """The input whose layout output `index` takes when its readers accept either
        (elementwise kernels: one layout on both sides saves a transposing pass), or None."""
        return None

    def leans_nchw(self, index: int) -> bool:
        """Whether input `index`, though accepted channels-last, is read faster NCHW: a
        tensor this kernel alone reads then does not follow its producer's input into
        channels-last (one that some kernel prefers channels-last is stored so all the
        same)."""
        return False

    def reads_strided(self, index: int) -> bool:
        """Whether `bind` takes input `index` with any strides (it reads it only through
        a copying gather): the planner may then hand it a transposing view instead of a
        transposed copy (planner._strided_transposes)."""
        return False

    def output_region(self, index: int) -> tuple[slice, ...] | None:
        """The part of output 0 that holds input `index` unchanged (a concatenation's
        slice), or None. The planner may then store that input there (planner._InPlace),
        and `bind` must find it in place: an input array that already is its region is
        not copied."""
        return None

    # ---- the two phases
    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute | None:
        """Return the closure that computes outputs from inputs, or None if nothing to do."""
        raise NotImplementedError

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """For view kernels: the outputs as views of the inputs."""
        raise NotImplementedError

    def scratch_arrays(self) -> list[np.ndarray]:
        """The temporaries `scratch_layout` lists, for `bind` (lite/kernels/workspace.py:
        from the plan's arena while a plan binds the node, else new arrays)."""
        return [temporary(shape, dtype) for shape, dtype in self.scratch_layout]
