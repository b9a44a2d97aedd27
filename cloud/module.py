"""Module: the base of layers and models; finds parameters and sub-modules by assignment.

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.fc1 = Dense(64, 32)     # a sub-module, registered because it is a Module
            self.scale = Parameter(...)  # a parameter, registered because it is a Parameter

        def forward(self, x):
            return self.fc1(x) * x.tape.param(self.scale)

A module is called on a `Var` inside a forward pass, or on a NumPy array: the array is then
run eagerly and the result returned as an array (any layer or sub-model can be inspected).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from sporenet.cloud.errors import CheckpointError, ConfigError, TraceError
from sporenet.cloud.tape import Tape, Var


class Parameter:
    """A float32 array a module owns; `trainable` ones are updated by the optimizer."""

    __slots__ = ("trainable", "value")

    def __init__(self, value: Any, *, trainable: bool = True) -> None:
        self.value = np.ascontiguousarray(value, dtype=np.float32)
        self.trainable = trainable

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def __repr__(self) -> str:
        kind = "Parameter" if self.trainable else "Buffer"
        return f"{kind}(shape={self.shape})"


def Buffer(value: Any) -> Parameter:
    """Module state that is saved and exported but not trained (BatchNorm running stats)."""
    return Parameter(value, trainable=False)


class Module:
    """Base class of layers and models. Subclasses implement `forward(x: Var) -> Var`."""

    # Set by __init__ past __setattr__ (which keeps the registries): declared for readers.
    _param_names: list[str]  # attributes holding a Parameter, in assignment order
    _module_names: list[str]  # attributes holding a sub-Module, in assignment order
    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_param_names", [])
        object.__setattr__(self, "_module_names", [])
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_param_names" not in self.__dict__:
            raise ConfigError(
                f"{type(self).__name__}.__init__ must call super().__init__() before assigning "
                f"attribute {name!r}"
            )
        for registry in (self._param_names, self._module_names):
            if name in registry:
                registry.remove(name)
        if isinstance(value, Parameter):
            self._param_names.append(name)
        elif isinstance(value, Module):
            self._module_names.append(name)
        object.__setattr__(self, name, value)

    def forward(self, x: Var) -> Var:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, x: Any) -> Any:
        if isinstance(x, Var):
            bprop = getattr(self, "bprop", None)
            if bprop is not None:  # a custom backward, MindSpore's Cell.bprop(x, out, dout)
                from sporenet.cloud.custom_gradient import call_with_gradient

                return call_with_gradient(self.forward, bprop, (x,))
            return self.forward(x)
        return run_eager(self, x)

    # ---- structure
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and all sub-modules, depth first, each once."""
        seen: set[int] = set()

        def walk(module: Module, path: str) -> Iterator[tuple[str, Module]]:
            if id(module) in seen:
                return
            seen.add(id(module))
            yield path, module
            for name in module._module_names:
                yield from walk(getattr(module, name), f"{path}.{name}" if path else name)

        yield from walk(self, prefix)

    def children(self) -> list[Module]:
        return [getattr(self, n) for n in self._module_names]

    def named_state(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter and buffer with its dotted path, each object once."""
        seen: set[int] = set()
        for path, module in self.named_modules():
            for name in module._param_names:
                p = getattr(module, name)
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{path}.{name}" if path else name), p

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Trainable parameters only."""
        return ((n, p) for n, p in self.named_state() if p.trainable)

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def parameter_count(self) -> int:
        return int(sum(p.value.size for p in self.parameters()))

    def state_names(self) -> dict[int, str]:
        """Parameter object id -> dotted path (how tapes name tensors)."""
        return {id(p): n for n, p in self.named_state()}

    # ---- modes
    def train(self, mode: bool = True) -> Module:
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    # ---- state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer by dotted path."""
        return {n: p.value.copy() for n, p in self.named_state()}

    def load_state_dict(self, state: dict[str, np.ndarray], *, strict: bool = True) -> None:
        """Copy values in by name; shapes must match, and with `strict` the names too."""
        own = dict(self.named_state())
        if strict:
            missing = sorted(set(own) - set(state))
            unexpected = sorted(set(state) - set(own))
            if missing or unexpected:
                raise CheckpointError(
                    f"state does not match the model: missing {missing}, unexpected {unexpected}"
                )
        for name, value in state.items():
            if name not in own:
                continue
            value = np.asarray(value)
            if value.shape != own[name].shape:
                raise CheckpointError(
                    f"{name!r}: expected shape {list(own[name].shape)}, got {list(value.shape)}"
                )
            own[name].value = np.ascontiguousarray(value, dtype=np.float32).copy()

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = [
            f"  ({n}): " + repr(getattr(self, n)).replace("\n", "\n  ") for n in self._module_names
        ]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + (")" if not children else "\n" + "\n".join(children) + "\n)")


def run_eager(module: Module, x: Any) -> np.ndarray:
    """Run `module` on a NumPy batch now, on a fresh eager tape; returns the output array."""
    array = np.asarray(x)
    if array.dtype.kind not in "fiu":
        raise TraceError(f"{type(module).__name__}: expected a numeric array, got {array.dtype}")
    tape = Tape(eager=True, training=module.training, names=module.state_names())
    out = module.forward(tape.input("input", array.astype(np.float32, copy=False)))
    if not isinstance(out, Var):
        raise TraceError(f"{type(module).__name__}.forward must return a Var, got {type(out)}")
    return out.numpy()


@contextmanager
def training_mode(module: Module, training: bool) -> Iterator[Module]:
    """Within the block every submodule's train/eval flag is `training`; afterwards each
    gets back its own flag (a frozen submodule left in eval mode stays in eval mode)."""
    flags = {id(m): m.training for _, m in module.named_modules()}
    module.train(training)
    try:
        yield module
    finally:
        for _, m in module.named_modules():
            object.__setattr__(m, "training", flags[id(m)])


class Sequential(Module):
    """Layers applied in order; indexable like a list.

    A layer may be given as a (name, layer) pair: its parameters are then named after it
    (`Sequential(..., ("head", Dense(64, 10)))` has "head.weight"); others are named by
    position ("3.weight").
    """

    def __init__(self, *layers: Module | tuple[str, Module]) -> None:
        super().__init__()
        for k, item in enumerate(layers):
            named = isinstance(item, tuple) and len(item) == 2
            name, layer = item if isinstance(item, tuple) and named else (str(k), item)
            if not isinstance(layer, Module):
                raise ConfigError(f"Sequential: layer {k} must be a Module, got {type(layer)}")
            if named and (
                not isinstance(name, str) or not name.isidentifier() or hasattr(self, name)
            ):
                raise ConfigError(
                    f"Sequential: layer {k}'s name must be an identifier not used yet, got {name!r}"
                )
            setattr(self, name, layer)

    def forward(self, x: Var) -> Var:
        for layer in self.children():
            x = layer(x)
        return x

    def __getitem__(self, index: int) -> Module:
        return self.children()[index]

    def __len__(self) -> int:
        return len(self._module_names)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.children())
