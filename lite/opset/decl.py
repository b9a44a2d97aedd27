"""What an op is, in one value: `OpDecl`, and the read-only views derived from all of them.

Each op family declares its ops in one module of this package (`declare(OpCode.X, ...)`);
the tables the planner, the autodiff engine, the passes and the quantizer read
(`KERNELS`, `GRADIENT_RULES`, `SAME_PARAMS`, ...) are views computed from those
declarations, so an op's traits are written once, side by side.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sporenet.lite.ops import OpCode

if TYPE_CHECKING:
    from sporenet.lite.autodiff.context import GradContext, GradRule
    from sporenet.lite.graph import Node
    from sporenet.lite.kernels.base import Kernel


class Activation(StrEnum):
    """The activations a node's `activation` attribute and ACTIVATION_GRAD name.

    The values are the attribute strings a file stores, so a member equals its string.
    """

    NONE = "none"
    RELU = "relu"
    RELU6 = "relu6"
    CLIP = "clip"
    LEAKY_RELU = "leaky_relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    HARD_SWISH = "hard_swish"
    SILU = "silu"
    GELU = "gelu"
    ELU = "elu"
    SOFTPLUS = "softplus"
    HARD_SIGMOID = "hard_sigmoid"
    ABS = "abs"  # not fusable: ABS's gradient is an ACTIVATION_GRAD of this name


A = Activation
CLAMPS: frozenset[Activation] = frozenset({A.NONE, A.RELU, A.RELU6, A.CLIP})
"""Fused activations an int8 kernel applies as a clamp of its output range."""
FROM_OUTPUT: frozenset[Activation] = frozenset(
    {A.NONE, A.RELU, A.RELU6, A.CLIP, A.LEAKY_RELU, A.SIGMOID, A.TANH}
)
"""Activations whose derivative the output alone determines (a fused node keeps only it)."""
FUSABLE: frozenset[Activation] = frozenset(
    {A.RELU, A.RELU6, A.CLIP, A.LEAKY_RELU, A.SIGMOID, A.TANH, A.HARD_SWISH, A.SILU}
)
"""What the float kernels of Conv2D, FullyConnected and the binary ops apply in place."""


class Channels(Enum):
    """How an op maps channels (axis 1), for structured pruning."""

    MIXED = "mixed"  # an output channel may read any input channel
    PASS = "pass"  # output channel c reads input channel c alone
    ELEMENTWISE = "elementwise"  # a binary op combining channel c of each operand


@dataclass(frozen=True)
class Quant:
    """How the static quantizer treats an op's inputs and outputs."""

    weight: tuple[int, int] | None = None  # (weight input, its output-channel axis)
    bias: int | None = None  # the int32 bias input
    keeps_params: bool = False  # values are moved, not computed: the output keeps the input's
    fixed_output: tuple[float, int] | None = None  # (scale, int8 zero point) of a known range


@dataclass(frozen=True)
class OpDecl:
    """Everything the runtime, the autodiff engine, the passes and the quantizer know of
    one op. The forward kernel's `__init__` is the op's shape rule (it checks the inputs
    and computes `output_specs`)."""

    op: OpCode
    kernel: type[Kernel] | None = None  # the float (or dtype-generic) forward
    int8: type[Kernel] | None = None  # the kernel for quantized int8/uint8 inputs
    int8_file_only: bool = False  # the int8 kernel needs a TFLite file's own parameters
    int16: type[Kernel] | None = None  # the kernel for quantized int16 (int16x8) inputs
    grad: GradRule | None = None  # emits the backward nodes (lite/autodiff/rules/)
    grad_differentiable: bool = False  # every node `grad` emits has a rule: grad(grad(f))
    fuses: frozenset[Activation] = frozenset()  # fused activations the fusion pass may add
    activation: Activation | None = None  # the fused activation this op computes alone
    weights: tuple[int, ...] = ()  # inputs that hold trainable weights
    channels: Channels = Channels.MIXED
    quant: Quant = Quant()
    writes: tuple[int, ...] = ()  # inputs written in place (variables, optimizer state)
    subgraphs: tuple[str, ...] = ()  # attributes naming subgraphs of the same model
    float16_widened: bool = False  # BLAS-bound: float16 nodes run through float32
    batch_dependent: bool = False  # its result depends on the whole batch (statistics, masks)
    raw_constants: bool = False  # reads constant inputs as stored (no dequantized copy)


class LazyRule:
    """A gradient rule named by its module under lite/autodiff/rules/ and its function,
    imported on first call: declaring an op's rule does not load the autodiff package, so
    running a model never does."""

    __slots__ = ("_rule", "module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name
        self._rule: GradRule | None = None

    def __call__(
        self, ctx: GradContext, node: Node, out_grads: list[int | None]
    ) -> Sequence[int | None]:
        if self._rule is None:
            package = importlib.import_module(f"sporenet.lite.autodiff.rules.{self.module}")
            self._rule = getattr(package, self.name)
        return self._rule(ctx, node, out_grads)

    def __repr__(self) -> str:
        return f"rule({self.module!r}, {self.name!r})"


def rule(module: str, name: str) -> GradRule:
    """The gradient rule `name` of lite/autodiff/rules/<module>.py, loaded when first used."""
    return LazyRule(module, name)


def declare(op: OpCode, **traits: Any) -> OpDecl:
    """One op's declaration (keyword arguments are OpDecl's fields)."""
    return OpDecl(op, **traits)


K = TypeVar("K")
V = TypeVar("V")


class _Lazy(Generic[K]):
    """A collection computed when first read.

    Lazily, because the declaration modules import kernels and gradient rules, whose
    packages expose these views themselves."""

    def __init__(self, build: Callable[[], Collection[K]]) -> None:
        self._build = build
        self._value: Collection[K] | None = None

    def _get(self) -> Any:
        if self._value is None:
            self._value = self._build()
        return self._value

    def __contains__(self, key: object) -> bool:
        return key in self._get()

    def __iter__(self) -> Iterator[K]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._get()!r})"


class DerivedMap(_Lazy[K], Mapping[K, V]):
    """A read-only table computed from the declarations when first read."""

    def __init__(self, build: Callable[[], dict[K, V]]) -> None:
        super().__init__(build)

    def __getitem__(self, key: K) -> V:
        return self._get()[key]

    def get(self, key: K, default: Any = None) -> Any:
        return self._get().get(key, default)


class DerivedSet(_Lazy[K], Set[K]):
    """A read-only set computed from the declarations when first read."""

    def __init__(self, build: Callable[[], set[K]]) -> None:
        super().__init__(lambda: frozenset(build()))

    @classmethod
    def _from_iterable(cls, it: Any) -> frozenset[Any]:
        # Set algebra (`|`, `-`, `&`) on a view gives a plain frozenset.
        return frozenset(it)


def derived_map(pick: Callable[[OpDecl], V | None]) -> DerivedMap[OpCode, V]:
    """{op: pick(declaration)} over the declarations where pick gives a value."""

    def build() -> dict[OpCode, V]:
        from sporenet.lite.opset import DECLARATIONS

        return {op: v for op, d in DECLARATIONS.items() if (v := pick(d)) is not None}

    return DerivedMap(build)


def derived_set(keep: Callable[[OpDecl], bool]) -> DerivedSet[OpCode]:
    """The ops whose declaration `keep` accepts."""

    def build() -> set[OpCode]:
        from sporenet.lite.opset import DECLARATIONS

        return {op for op, d in DECLARATIONS.items() if keep(d)}

    return DerivedSet(build)
