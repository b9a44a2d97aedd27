"""Planning a graph once: kernels resolved, shapes inferred, constants folded, buffers reused.

The result, an ExecutionPlan, holds one zero-argument closure per node that still has work
to do; running the plan is a loop over them with no validation and no allocation.
Intermediate buffers are assigned by tensor lifetime: a buffer whose tensor is dead is
handed to the next tensor that fits (first fit), so peak memory follows the widest cut of
the graph rather than the sum of all activations.
"""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from sporenet.lite import pages, shared_weights
from sporenet.lite.dims import SMALLEST_FIRST, default_shapes
from sporenet.lite.eager import fold, prepare_kernel
from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.float_links import link_floats
from sporenet.lite.graph import DYNAMIC, Model, Node
from sporenet.lite.kernels import KERNELS, QUANTIZED_KERNELS, kernel_class, supported_ops
from sporenet.lite.kernels.base import Kernel, TensorSpec
from sporenet.lite.kernels.quantized.base import is_quantized
from sporenet.lite.kernels.quantized.convert import dequantize_array
from sporenet.lite.kernels.raw import copyto
from sporenet.lite.kernels.state import ReadVariable
from sporenet.lite.kernels.transform import Transpose, contiguous_slice
from sporenet.lite.kernels.workspace import Workspace, active
from sporenet.lite.layout_choice import channels_last_tensors, tensor_readers
from sporenet.lite.lookup_chains import compose_lookups
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_set
from sporenet.lite.stream_windows import StepOrder, frames_in_windows, plan_windows
from sporenet.lite.variables import WRITTEN_INPUTS

Compute = Callable[[], None]


@dataclass
class ExecutionPlan:
    """A planned graph: arrays for every live tensor and the compute steps in order."""

    arrays: dict[int, np.ndarray]
    steps: list[Compute]
    specs: dict[int, TensorSpec]
    inputs: list[int]
    outputs: list[int]
    kernels: list[Kernel] = field(default_factory=list)
    step_kernels: list[Kernel] = field(default_factory=list)  # the kernel of each step
    arena_bytes: int = 0  # tensors and the steps' temporaries (lite/kernels/workspace.py)

    def run(self) -> None:
        for step in self.steps:
            step()


class DirectRun:
    """A plan's input and output arrays by signature name, for the run path of feeds that
    already have the planned dtypes and shapes (a streaming model's every call): nothing
    to look up, convert or check, one copy in and one out per tensor.

    `feed` refuses anything else (another shape or dtype, a Python number, a list, a
    missing name), so the caller's checked path handles it and raises its errors. A plan with
    string (object) inputs gets none: their values need converting."""

    __slots__ = ("inputs", "outputs", "plan")

    def __init__(self, planned: ExecutionPlan, inputs: dict[str, int], outputs: dict[str, int]):
        self.plan = planned
        self.inputs = [(name, planned.arrays[i]) for name, i in inputs.items()]
        self.outputs = [(name, planned.arrays[i]) for name, i in outputs.items()]

    @classmethod
    def of(
        cls, planned: ExecutionPlan | None, inputs: dict[str, int], outputs: dict[str, int]
    ) -> DirectRun | None:
        """The direct path of `planned`; None when it has none (no plan, string inputs)."""
        if planned is None or any(planned.specs[i].dtype.hasobject for i in inputs.values()):
            return None
        return cls(planned, inputs, outputs)

    def feed(self, feeds: dict[str, np.ndarray]) -> bool:
        """Copy `feeds` into the plan's inputs if each is an ndarray (or a NumPy scalar) of
        the planned dtype and shape and no other name is given; False (nothing copied)
        otherwise."""
        inputs = self.inputs
        if len(feeds) != len(inputs):
            return False
        for name, target in inputs:
            value = feeds.get(name)
            if (
                (type(value) is not np.ndarray and not isinstance(value, np.generic))
                or value.shape != target.shape
                or (value.dtype is not target.dtype and value.dtype != target.dtype)
            ):
                return False
        for name, target in inputs:
            copyto(target, feeds[name])
        return True

    def results(self) -> dict[str, np.ndarray]:
        """Copies of the outputs (a caller's changes must not reach the next run)."""
        return {name: array.copy() for name, array in self.outputs}


def check_supported(model: Model, graph_index: int) -> None:
    """Raise UnsupportedOpError listing every op of the graph that has no kernel."""
    missing = Counter(
        n.op.name
        for n in model.graphs[graph_index].nodes
        if n.op not in KERNELS and n.op not in QUANTIZED_KERNELS
    )
    if missing:
        listed = ", ".join(f"{name} (x{count})" for name, count in sorted(missing.items()))
        raise UnsupportedOpError(
            f"no kernel for {listed}; supported ops: {', '.join(supported_ops())}"
        )


def _input_spec(
    model: Model, index: int, shape: tuple[int, ...], value: np.ndarray | None
) -> TensorSpec:
    tensor = model.tensors[index]
    if value is not None:
        value = np.array(value, dtype=tensor.dtype).reshape(shape)
        value.flags.writeable = False
    spec = TensorSpec(shape, tensor.dtype, value, tensor.quantization)
    _check_size(spec, f"input {tensor.name!r}")
    return spec


MAX_TENSOR_BYTES = 1 << 33
"""Largest single tensor a plan allocates (8 GiB); larger shapes are refused up front."""


def _check_size(spec: TensorSpec, what: str) -> None:
    nbytes = spec.size * spec.dtype.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(
            f"{what}: shape {list(spec.shape)} x {spec.dtype} needs {nbytes:,} bytes, more than "
            f"the {MAX_TENSOR_BYTES:,}-byte limit per tensor"
        )


# Ops that read float16 or quantized constants as they are (no weight-only dequantize).
_TAKES_RAW_CONSTANTS = derived_set(lambda d: d.raw_constants)
_SUBGRAPH_OPS = derived_set(lambda d: bool(d.subgraphs))


def _weight_only(
    op: OpCode,
    in_specs: list[TensorSpec | None],
    cache: dict[int, np.ndarray],
    inputs: list[int],
    raw: Collection[int] = (),
) -> dict[int, np.ndarray]:
    """Dequantize, once, the constants a float kernel cannot read: quantized int8/uint8
    weights (dynamic-range mode) and float16 weights beside float32 operands (fp16 mode).
    Positions in `raw` (a kernel's `quantized_weights`: it dequantizes them itself, into
    its packed form) stay as they are. Returns {input position: float32 value};
    `in_specs` is updated in place."""
    if op in _TAKES_RAW_CONSTANTS:
        return {}
    has_f32 = any(s is not None and s.dtype == np.float32 for s in in_specs)
    swapped: dict[int, np.ndarray] = {}
    for k, (i, spec) in enumerate(zip(inputs, in_specs, strict=True)):
        if spec is None or spec.value is None or (k in raw and is_quantized(spec)):
            continue
        if not (is_quantized(spec) or (spec.dtype == np.float16 and has_f32)):
            continue
        value = cache.get(i)
        if value is None:
            value = _dequantized(spec)
            pages.release(spec.value)  # the plan reads `value`: keep only it in memory
            cache[i] = value
        in_specs[k] = TensorSpec(spec.shape, value.dtype, value)
        swapped[k] = value
    return swapped


def _dequantized(spec: TensorSpec) -> np.ndarray:
    """The float32 value of a quantized or float16 constant, read-only, shared with the
    other live plans of the model (a re-plan makes no second copy: lite/shared_weights)."""
    source = cast(np.ndarray, spec.value)
    quant = spec.quant if is_quantized(spec) else None
    return shared_weights.shared(
        source, ("dequantized", quant is None), lambda: dequantize_array(source, quant)
    )


Inferred = tuple[dict[int, TensorSpec], list[Kernel | None], dict[int, np.ndarray]]


def infer_any_size(
    model: Model,
    graph_index: int,
    shapes: dict[int, tuple[int, ...]] | None = None,
    variables: Collection[int] = (),
    values: dict[int, np.ndarray] | None = None,
) -> Inferred:
    """`infer` where dynamic dimensions not given in `shapes` take the sizes of the
    smallest probe family under which the graph plans (lite/dims.py); the first family's
    error if none does."""
    shapes = shapes or {}
    graph = model.graphs[graph_index]
    open_dims = any(i not in shapes and DYNAMIC in model.tensors[i].shape for i in graph.inputs)
    errors: list[ShapeError] = []
    for family in SMALLEST_FIRST if open_dims else (0,):
        try:
            return infer(model, graph_index, shapes, variables, family=family, values=values)
        except ShapeError as exc:
            errors.append(exc)
    raise errors[0]


def infer(
    model: Model,
    graph_index: int,
    shapes: dict[int, tuple[int, ...]] | None = None,
    variables: Collection[int] = (),
    *,
    family: int = 0,
    values: dict[int, np.ndarray] | None = None,
    shapes_only: bool = False,
    fold_limit: int | None = None,
) -> Inferred:
    """Prepare every kernel of a graph: specs of all tensors, kernels (None if folded), and
    the values of tensors folded to constants.

    `shapes_only` (shape inference, which keeps no kernel and no folded value): every
    kernel is dropped once prepared, and a folded or dequantized value once the last node
    that reads it is, so a model whose weights only load-time folding computes (a weight
    stored int8 and dequantized by a Cast and a Mul) never holds them all in float32.
    `fold_limit` (with `shapes_only`): a node whose outputs take more bytes is not folded,
    its outputs' specs left without values (a kernel that needs them raises ShapeError).

    A float kernel reading a float16 or quantized constant gets its float32 value,
    dequantized here once (the kernel's `constant_inputs` records the swap for `plan`).

    `variables` lists constant tensors whose values change between runs (trainable weights,
    optimizer slots): their specs carry no value, so nothing that reads them is folded and
    no kernel pre-packs them.
    """
    check_supported(model, graph_index)
    graph = model.graphs[graph_index]
    specs = _initial_specs(model, graph_index, shapes or {}, frozenset(variables), family, values)
    kernels: list[Kernel | None] = []
    folded: dict[int, np.ndarray] = {}
    dequantized: dict[int, np.ndarray] = {}
    # Readers of each stored constant not folded yet: one that only folded nodes read
    # (a float16 weight widened by a CAST) has its file pages dropped once they are done.
    readers = Counter(i for n in graph.nodes for i in n.inputs if model.tensors[i].data is not None)
    readers.update(i for i in graph.outputs if model.tensors[i].data is not None)
    pending = Counter(i for n in graph.nodes for i in n.inputs) if shapes_only else None
    for j, node in enumerate(graph.nodes):
        kernel, swapped = _prepare_node(
            model, node, f"node {j} {node.name!r} ({node.op.name})", specs, dequantized
        )
        if pending is not None:
            _release_read(model, node, pending, specs, dequantized)
        # Folded as well: a node whose kernel knows its outputs from the input shapes alone
        # (Shape), so shape arithmetic on dynamic dimensions runs here, once per plan.
        outs = None if _over(kernel, fold_limit) else fold(kernel)
        if outs is not None:
            for i, value, spec in zip(node.outputs, outs, kernel.output_specs, strict=False):
                value.flags.writeable = False
                if pending is None:
                    folded[i] = value
                kept = value if pending is None or pending[i] else None
                specs[i] = TensorSpec(value.shape, value.dtype, kept, spec.quant)
            for i in node.inputs:
                if i in readers:
                    readers[i] -= 1
                    data = model.tensors[i].data
                    if readers[i] == 0 and data is not None:
                        pages.release(data)
            kernels.append(None)
            continue
        for i, spec in zip(node.outputs, kernel.output_specs, strict=False):
            specs[i] = TensorSpec(spec.shape, spec.dtype, quant=spec.quant)
        kernel.constant_inputs = swapped
        kernels.append(kernel if pending is None else None)
    return specs, kernels, folded


def _over(kernel: Kernel, limit: int | None) -> bool:
    """Whether the kernel's outputs take more than `limit` bytes (None: no limit)."""
    if limit is None:
        return False
    return sum(s.size * s.dtype.itemsize for s in kernel.output_specs) > limit


def _release_read(
    model: Model,
    node: Node,
    pending: Counter[int],
    specs: dict[int, TensorSpec],
    dequantized: dict[int, np.ndarray],
) -> None:
    """For `infer(shapes_only=True)`: count `node`'s reads, and drop the computed value of
    every input no later node reads (its spec keeps shape, dtype and quantization)."""
    for i in node.inputs:
        if i == -1:
            continue
        pending[i] -= 1
        if pending[i]:
            continue
        dequantized.pop(i, None)
        spec = specs.get(i)
        if spec is not None and spec.value is not None and model.tensors[i].data is None:
            specs[i] = TensorSpec(spec.shape, spec.dtype, quant=spec.quant)


def _initial_specs(
    model: Model,
    graph_index: int,
    shapes: dict[int, tuple[int, ...]],
    variables: frozenset[int],
    family: int,
    values: dict[int, np.ndarray] | None,
) -> dict[int, TensorSpec]:
    """Specs of the stored constants (without a value for `variables`) and graph inputs."""
    specs: dict[int, TensorSpec] = {}
    for i, t in enumerate(model.tensors):
        if t.data is not None:
            specs[i] = TensorSpec(
                tuple(t.shape), t.dtype, None if i in variables else t.data, t.quantization
            )
    # Dynamic dimensions left unresolved take their probe sizes (a leading batch 1, as
    # TFLite's default; lite/dims.py).
    defaults = default_shapes(model, graph_index, family)
    fed = values or {}
    for i in model.graphs[graph_index].inputs:
        specs[i] = _input_spec(model, i, shapes.get(i, defaults[i]), fed.get(i))
    return specs


def _prepare_node(
    model: Model,
    node: Node,
    where: str,
    specs: dict[int, TensorSpec],
    dequantized: dict[int, np.ndarray],
) -> tuple[Kernel, dict[int, np.ndarray]]:
    """The node's kernel prepared on its input specs, and the inputs dequantized for it."""
    in_specs = [specs[i] if i != -1 else None for i in node.inputs]
    cls = kernel_class(node.op, in_specs[0] if in_specs else None, where)
    swapped = (
        {}
        if cls is QUANTIZED_KERNELS.get(node.op)
        else _weight_only(node.op, in_specs, dequantized, node.inputs, cls.quantized_weights)
    )
    kernel = prepare_kernel(
        node.op,
        node.attrs,
        in_specs,
        len(node.outputs),
        where=where,
        output_quant=[model.tensors[i].quantization for i in node.outputs],
        output_dtypes=[model.tensors[i].dtype for i in node.outputs],
        model=model,
    )
    for spec in kernel.output_specs:
        _check_size(spec, where)
    return kernel, swapped


class _Arena:
    """First-fit allocator of byte spans handed out and returned by lifetime (tensors and
    the steps' temporaries alike), in one region reserved up front.

    A request takes the lowest free span that holds it and leaves the rest of that span
    free. Packing toward the bottom keeps the largest holes near the top, where a large
    tensor after many small ones still fits (smallest-fit scattered small spans through
    them, and a vision net's widest cut then landed above its holes). A returned span
    merges with its free neighbours; a request that no free span holds extends the
    region's used top (absorbing a free span that ends there). The region is reserved,
    not touched: pages past the highest span ever handed out are never written, so they
    cost address space, not memory. The sizes of the temporaries are known only as the
    kernels are bound, which is why the region cannot be sized exactly before; a request
    past the reservation gets a chunk of its own.
    """

    ALIGN = 64  # bytes: every span starts on a cache line (and any dtype's alignment)

    def __init__(self, reserve: int) -> None:
        self.chunks: list[np.ndarray] = [_region(max(reserve, self.ALIGN))]
        self.free: list[tuple[int, int, int]] = []  # (chunk, start, size), unordered
        self.taken: dict[int, tuple[np.ndarray, int, int, int]] = {}  # id -> (span, ...)
        self.top = 0  # end of the highest span handed out in chunk 0
        self.extra = 0  # bytes of the chunks past the reservation

    @property
    def total(self) -> int:
        """Bytes the arena has handed out at its widest (its memory once touched)."""
        return self.top + self.extra

    def take(self, nbytes: int) -> np.ndarray:
        size = -(-max(nbytes, 1) // self.ALIGN) * self.ALIGN
        fits = [k for k, span in enumerate(self.free) if span[2] >= size]
        if fits:
            chunk, start, have = self.free.pop(min(fits, key=lambda k: self.free[k][:2]))
            if have > size:
                self.free.append((chunk, start + size, have - size))
        else:
            chunk, start = 0, self.top
            tail = [k for k, (c, s, n) in enumerate(self.free) if c == 0 and s + n == self.top]
            if tail:
                start = self.free[tail[0]][1]
            if start + size <= self.chunks[0].nbytes:
                if tail:
                    del self.free[tail[0]]
                self.top = start + size
            else:
                chunk, start = len(self.chunks), 0
                self.chunks.append(np.empty(size, np.uint8))
                self.extra += size
        span = self.chunks[chunk][start : start + size]
        self.taken[id(span)] = (span, chunk, start, size)
        return span

    def prefault(self) -> None:
        """Write the bytes handed out, once: the first run would otherwise pay every page
        fault of the arena (the same pages; only when they are touched changes)."""
        self.chunks[0][: self.top].fill(0)

    def give(self, block: np.ndarray) -> None:
        _, chunk, start, size = self.taken.pop(id(block))
        for k in range(len(self.free) - 1, -1, -1):
            c, s, n = self.free[k]
            if c == chunk and (s + n == start or start + size == s):
                del self.free[k]
                start, size = min(s, start), size + n
        self.free.append((chunk, start, size))


def _region(nbytes: int) -> np.ndarray:
    """`nbytes` of zeroed address space, as uint8, on an anonymous mapping of its own.

    NumPy advises huge pages on its large allocations, and where Linux honours that
    (transparent huge pages in `madvise` mode), the first write into a 2 MiB region faults
    the whole region in: an arena whose used top is 2.5 MiB then holds 4 MiB. A mapping
    advised against huge pages is backed by base pages (in `always` mode too), so the
    arena holds what it hands out."""
    region = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(region, np.uint8)


def _reserve(specs: dict[int, TensorSpec]) -> int:
    """Bytes to reserve for a plan's arena: every intermediate tensor at once, plus room
    for temporaries several times the largest (an im2col matrix is kh*kw times its input)."""
    sizes = [
        s.size * s.dtype.itemsize
        for s in specs.values()
        if s.value is None and not s.dtype.hasobject
    ]
    return 2 * sum(sizes) + 16 * max(sizes, default=0) + (1 << 20)


def _typed(block: np.ndarray, spec: TensorSpec, *, channels_last: bool = False) -> np.ndarray:
    """`block` as an array of `spec`; channels-last: an (N, C, H, W) view of (N, H, W, C)
    memory."""
    nbytes = spec.size * spec.dtype.itemsize
    typed = block[:nbytes].view(spec.dtype)
    if channels_last:
        n, c, h, w = spec.shape
        return typed.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return typed.reshape(spec.shape)


def plan(
    model: Model,
    signature: str = "infer",
    shapes: dict[int, tuple[int, ...]] | None = None,
    variables: dict[int, np.ndarray] | None = None,
    values: dict[int, np.ndarray] | None = None,
) -> ExecutionPlan:
    """Plan the graph behind `signature` for the given input shapes (dynamic dims not
    given take their probe sizes, lite/dims.py).

    `variables` maps constant tensors to writable arrays the plan reads (and update ops
    write) in place instead of the model's data; the caller owns them, so several plans
    (a train and an infer graph) can share them across runs. `values` gives the values of
    shape-like inputs (a target shape, sizes, a Range bound fed as graph inputs): the plan
    treats them as constants, so it is valid only for those values.
    """
    try:
        return plan_graph(model, model.signature(signature).graph, shapes, variables, values)
    except MemoryError:
        # Shapes a file declares are not bounded by its size; say so instead of crashing.
        raise ShapeError(
            f"the tensors of signature {signature!r} need more memory than is available"
        ) from None


class _ComputedWeights:
    """Weights the plan computed (a float16 weight's widening, folded at load) that every
    step reading them packs into a form of its own: each is forgotten as soon as its last
    reader is bound, so the plan never holds both copies (nor the peak of memory both).

    That holds while nothing else refers to them: `plan_graph` keeps the folded values in
    `specs` only (not infer's dict of them), and notes only the file views kernels give up
    (a computed weight noted there would live beside its packed form to the end)."""

    def __init__(
        self,
        model: Model,
        nodes: list[Node],
        kernels: list[Kernel | None],
        arrays: dict[int, np.ndarray],
        specs: dict[int, TensorSpec],
        keep: Collection[int],
    ) -> None:
        self.arrays, self.specs = arrays, specs
        computed = {
            i
            for i, spec in specs.items()
            if spec.value is not None and model.tensors[i].data is None and i not in keep
        }
        self.left: Counter[int] = Counter(
            i
            for node, kernel in zip(nodes, kernels, strict=True)
            if kernel is not None
            for i in node.inputs
            if i in computed
        )
        for i in computed - set(self.left):  # only folded nodes read it
            self._forget(i)
        self.kept: set[int] = set()
        self.readers: dict[int, list[tuple[Kernel, int]]] = {}

    def bound(self, node: Node, kernel: Kernel, ins: list, noted: list[np.ndarray]) -> None:
        """After `kernel` was bound on `ins`: `noted` are the arrays it gave up."""
        given_up = {id(a) for a in noted}
        for k, (i, a) in enumerate(zip(node.inputs, ins, strict=True)):
            if i not in self.left:
                continue
            self.readers.setdefault(i, []).append((kernel, k))
            if kernel.is_view or id(a) not in given_up:
                self.kept.add(i)
            self.left[i] -= 1
            if self.left[i] == 0 and i not in self.kept:
                self._forget(i)
                for reader, position in self.readers.pop(i):
                    spec = reader.inputs[position]
                    if spec is not None:
                        reader.inputs[position] = TensorSpec(
                            spec.shape, spec.dtype, None, spec.quant
                        )

    def _forget(self, i: int) -> None:
        self.arrays.pop(i, None)
        spec = self.specs[i]
        self.specs[i] = TensorSpec(spec.shape, spec.dtype, None, spec.quant)


def _last_uses(
    nodes: list[Node], kernels: list[Kernel | None], outputs: Collection[int]
) -> dict[int, int]:
    """Storage root -> position of the last node that reads it (len(nodes) for graph
    outputs). A view's output lives in its input's storage, so both share one root."""
    root: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
        if kernel is None:
            continue
        for i in node.inputs:
            if i != -1:
                last_use[root.get(i, i)] = j
        for k, i in enumerate(node.outputs):
            root[i] = root.get(node.inputs[0], node.inputs[0]) if kernel.is_view and k == 0 else i
    for i in outputs:
        last_use[root.get(i, i)] = len(nodes)
    return last_use


def _strided_transposes(
    nodes: list[Node],
    kernels: list[Kernel | None],
    inputs: Collection[int],
    outputs: Collection[int],
) -> None:
    """Make each transpose whose every reader takes any strides (Kernel.reads_strided) a
    transposing view of its input: the reader's own gather then does the one copy. Only
    for an input stored in a graph input or in what a step of this graph computed
    (directly or through views; not a variable's read or a constant), so no write in
    place reaches it while the view is read (a graph input is written between runs
    only); the view's storage root lives until its last reader (_last_uses)."""
    readers = tensor_readers(nodes, kernels)
    computed: set[int] = set(inputs)
    for node, kernel in zip(nodes, kernels, strict=True):
        if kernel is None:
            continue
        if isinstance(kernel, Transpose):
            kernel.view_strided(False)  # a kernel planned before may have been made one
        if isinstance(kernel, ReadVariable):
            continue
        if not kernel.is_view or node.inputs[0] in computed:
            computed.update(node.outputs)
    for node, kernel in zip(nodes, kernels, strict=True):
        if not isinstance(kernel, Transpose) or kernel.is_view:
            continue
        out = node.outputs[0]
        if node.inputs[0] not in computed or out in outputs or out not in readers:
            continue
        if all(reader.reads_strided(k) for reader, k in readers[out]):
            kernel.view_strided(True)


def _read_views(nodes: list[Node], kernels: list[Kernel | None], outputs: Collection[int]) -> None:
    """Turn each READ_VARIABLE whose value nobody can overwrite while it is read into a
    view of the variable: no node that writes the variable's storage in place
    (WRITTEN_INPUTS, or a control flow node, whose subgraphs may) runs after the read and
    up to its last reader. Graph outputs stay copies (they are read after the run)."""
    reads = [(j, k) for j, k in enumerate(kernels) if isinstance(k, ReadVariable)]
    for _, read in reads:  # a kernel planned before may have been made a view
        read.read_in_place(False)
    last_use = _last_uses(nodes, kernels, outputs)
    root: dict[int, int] = {}
    writers: list[tuple[int, set[int] | None]] = []  # (position, roots written; None: any)
    for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
        if kernel is None:
            continue
        if node.op in _SUBGRAPH_OPS:
            writers.append((j, None))
        elif node.op in WRITTEN_INPUTS:
            ins = node.inputs
            written = {root.get(ins[k], ins[k]) for k in WRITTEN_INPUTS[node.op] if k < len(ins)}
            writers.append((j, written))
        for k, i in enumerate(node.outputs):
            root[i] = root.get(node.inputs[0], node.inputs[0]) if kernel.is_view and k == 0 else i
    for j, kernel in reads:
        node = nodes[j]
        if node.outputs[0] in outputs:
            continue
        var = root.get(node.inputs[0], node.inputs[0])
        end = last_use.get(node.outputs[0], j)
        if not any(j < p <= end and (written is None or var in written) for p, written in writers):
            kernel.read_in_place(True)


class _InPlace:
    """Tensors computed straight into their region of a later node's output (a
    concatenation's slice: Kernel.output_region), so that node copies nothing for them.

    A tensor qualifies when a step of this plan computes it (not a graph input, a
    constant or a variable read as a view; views of it, a reshape or a transpose of
    1-long axes, are found in place as well), the node with the region is the last
    reader of its storage, it fills the region's bytes exactly, and the region is one
    contiguous block of an output stored C-contiguous. That output's storage is then
    taken when the first such tensor's producer is bound, and lives until the output's
    own last use.
    """

    def __init__(
        self,
        nodes: list[Node],
        kernels: list[Kernel | None],
        specs: dict[int, TensorSpec],
        last_use: dict[int, int],
        kept: Collection[int],
        channels_last: set[int],
    ) -> None:
        self.specs, self.channels_last = specs, channels_last
        self.target: dict[int, tuple[int, tuple[slice, ...]]] = {}  # tensor: output, region
        self.arrays: dict[int, np.ndarray] = {}  # storage handed out ahead of its node
        root: dict[int, int] = {}
        computed: set[int] = set()
        for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
            if kernel is None:
                continue
            for k, i in enumerate(node.inputs):
                r = root.get(i, i)
                if r in computed and r not in kept and last_use.get(r) == j:
                    self._consider(r, node, kernel, k)
            for k, i in enumerate(node.outputs):
                if kernel.is_view and k == 0:
                    root[i] = root.get(node.inputs[0], node.inputs[0])
                elif not kernel.is_view:
                    computed.add(i)

    def _consider(self, r: int, node: Node, kernel: Kernel, k: int) -> None:
        """Target tensor `r` at the region of `node`'s output 0 for input `k`, if it fits."""
        region = kernel.output_region(k)
        if kernel.is_view or region is None or r in self.target or not node.outputs:
            return
        out = node.outputs[0]
        if out in self.channels_last:
            return
        host, spec = self.specs[out], self.specs[r]
        lengths = [len(range(*s.indices(n))) for s, n in zip(region, host.shape, strict=False)]
        lengths += host.shape[len(region) :]
        steps = [s.step or 1 for s in region] + [1] * (host.rank - len(region))
        if (
            spec.dtype != host.dtype
            or spec.dtype.hasobject
            or spec.size != int(np.prod(lengths))
            or not contiguous_slice(host.shape, lengths, steps)
        ):
            return
        self.target[r] = (out, region)

    def array(self, i: int, allocate: Callable[[int], np.ndarray]) -> np.ndarray | None:
        """The storage of tensor `i` when it was planned here: its region of the output it
        is computed into (whose storage `allocate` takes now, for the first of them), or
        that output's storage taken ahead; None for any other tensor."""
        array = self.arrays.get(i)
        if array is None and i in self.target:
            out, region = self.target[i]
            host = self.array(out, allocate)
            if host is None:
                host = self.arrays[out] = allocate(out)
            flat = host[region].reshape(-1).view(np.uint8)  # contiguous: views
            array = self.arrays[i] = _typed(
                flat, self.specs[i], channels_last=i in self.channels_last
            )
        return array


def _output_arrays(
    node: Node,
    kernel: Kernel,
    allocate: Callable[[int, TensorSpec], np.ndarray],
    in_place: _InPlace,
) -> list[np.ndarray]:
    """Arrays for a kernel's outputs: their place in a later output (_InPlace), else what
    `allocate` gives (_Storage); an unused extra output gets storage of its own."""
    outs = []
    for k, spec in enumerate(kernel.output_specs):
        i = node.outputs[k] if k < len(node.outputs) else -1
        placed = None if i == -1 else in_place.array(i, lambda o: allocate(o, in_place.specs[o]))
        if placed is not None:
            outs.append(placed)
        elif i == -1:
            outs.append(np.empty(spec.shape, spec.dtype))
        else:
            outs.append(allocate(i, spec))
    return outs


class _Storage:
    """Storage of the tensors steps compute: blocks of the arena, recorded in `blocks`
    (returned when the tensor dies), or arrays of their own for the tensors in `own`
    (graph outputs, never read) and strings (object references cannot live in a byte
    arena)."""

    def __init__(
        self,
        arena: _Arena,
        own: set[int],
        channels_last: set[int],
        fixed: dict[int, np.ndarray] | None = None,
    ) -> None:
        self.arena, self.own, self.channels_last = arena, own, channels_last
        self.fixed = fixed or {}  # tensors stored in a buffer given (a streaming state's)
        self.blocks: dict[int, np.ndarray] = {}

    def __call__(self, i: int, spec: TensorSpec) -> np.ndarray:
        fixed = self.fixed.get(i)
        if fixed is not None:
            return fixed
        if i in self.own or spec.dtype.hasobject:
            return np.empty(spec.shape, spec.dtype)
        block = self.blocks[i] = self.arena.take(spec.size * spec.dtype.itemsize)
        return _typed(block, spec, channels_last=i in self.channels_last)


def _fused(nodes: list[Node], kernels: list[Kernel | None], outputs: set[int]) -> list[Node]:
    """The nodes a plan binds, after the fusions decided on prepared kernels: chains of
    lookups composed (lite/lookup_chains.py), folded layers linked by float64 columns
    (lite/float_links.py)."""
    nodes = compose_lookups(nodes, kernels, outputs)
    link_floats(nodes, kernels, outputs)
    return nodes


def _node_inputs(
    arrays: dict[int, np.ndarray],
    node: Node,
    kernel: Kernel,
    shift: tuple[np.ndarray, np.ndarray] | None,
) -> list[np.ndarray | None]:
    """The arrays a node's kernel binds on: its constants' forms it reads (dequantized
    weights), and for a streaming state's ASSIGN (`shift`), its buffer's head and tail."""
    ins: list[np.ndarray | None] = [arrays[i] if i != -1 else None for i in node.inputs]
    for k, value in kernel.constant_inputs.items():
        ins[k] = value
    if shift is not None:
        ins[0], ins[1] = shift
    return ins


def plan_graph(
    model: Model,
    graph_index: int,
    shapes: dict[int, tuple[int, ...]] | None = None,
    variables: dict[int, np.ndarray] | None = None,
    values: dict[int, np.ndarray] | None = None,
) -> ExecutionPlan:
    """Plan one graph of the model by index (an entry graph, or a subgraph that a control
    flow kernel runs); `shapes` and `variables` as for `plan`.

    Every view of the file that a folded node or a bound kernel gives up (pages.release)
    is released once more when the plan is built: reading a neighbouring constant later
    faults its pages back in around its own (fault-around)."""
    variables = variables or {}
    with pages.noting_unread() as noted:
        specs, kernels = infer_any_size(model, graph_index, shapes, variables.keys(), values)[:2]
        given_up = [a for a in noted if pages.is_mapped(a)]
        planned = _bind(model, graph_index, specs, kernels, variables, noted, given_up)
    for array in given_up:
        pages.release(array)
    return planned


def _bind(
    model: Model,
    graph_index: int,
    specs: dict[int, TensorSpec],
    kernels: list[Kernel | None],
    variables: dict[int, np.ndarray],
    noted: list[np.ndarray],
    given_up: list[np.ndarray],
) -> ExecutionPlan:
    """plan_graph's second half: the kernels bound in order on arena storage. `noted`
    collects what each kernel gives up; the file views among them go to `given_up`."""
    graph = model.graphs[graph_index]
    outputs = set(graph.outputs)
    nodes = _fused(graph.nodes, kernels, outputs)
    _strided_transposes(nodes, kernels, graph.inputs, outputs)
    _read_views(nodes, kernels, outputs)
    last_use = _last_uses(nodes, kernels, outputs)
    channels_last = channels_last_tensors(nodes, kernels, outputs)

    arrays = {i: spec.value for i, spec in specs.items() if spec.value is not None}
    arrays.update(variables)
    arrays.update((i, np.empty(specs[i].shape, specs[i].dtype)) for i in graph.inputs)
    arena = _Arena(_reserve(specs))
    workspace = Workspace(arena.take, late=True)  # the steps' temporaries, from the arena
    live_kernels: list[Kernel] = []
    dying: dict[int, list[int]] = {}
    for r, j in last_use.items():
        dying.setdefault(j, []).append(r)
    keep = outputs | set(variables) | set(graph.inputs)
    keep_own = outputs | ({*specs} - set(last_use))  # tensors that get storage of their own
    hosts, shifts, deferred = plan_windows(
        model, graph_index, kernels, specs, variables, last_use, channels_last | outputs
    )
    arrays.update(frames_in_windows(nodes, kernels, hosts, graph.inputs, specs))
    storage = _Storage(arena, keep_own, channels_last, hosts)
    in_place = _InPlace(nodes, kernels, specs, last_use, keep_own | set(hosts), channels_last)
    computed = _ComputedWeights(model, nodes, kernels, arrays, specs, keep)
    order = StepOrder(deferred)
    for j, (node, kernel) in enumerate(zip(nodes, kernels, strict=True)):
        if kernel is None:
            continue
        ins = _node_inputs(arrays, node, kernel, shifts.get(j))
        noted.clear()
        if kernel.is_view:
            views = kernel.view(ins)
            for i, v in zip(node.outputs, views, strict=False):
                arrays[i] = v
        else:
            outs = _output_arrays(node, kernel, storage, in_place)
            arrays.update((i, a) for i, a in zip(node.outputs, outs, strict=False) if i != -1)
            with active(workspace):
                step = kernel.bind(ins, outs)
            if step is not None:
                order.add(j, step, kernel)
        order.reached(j)
        computed.bound(node, kernel, ins, noted)
        given_up.extend(a for a in noted if pages.is_mapped(a))
        live_kernels.append(kernel)
        for block in workspace.release():
            arena.give(block)
        for block in workspace.place_late():
            arena.give(block)
        for r in dying.get(j, ()):
            if r in storage.blocks:
                arena.give(storage.blocks.pop(r))
    arena.prefault()
    return ExecutionPlan(
        arrays=arrays,
        steps=order.steps,
        specs=specs,
        inputs=list(graph.inputs),
        outputs=list(graph.outputs),
        kernels=live_kernels,
        step_kernels=order.kernels,
        arena_bytes=arena.total,
    )
