"""The one switch between eager and graph execution.

    sporenet.cloud.set_mode("graph")   # fit/evaluate/predict trace once and run the plan
    sporenet.cloud.set_mode("eager")   # every op runs at once; intermediates inspectable

`fit`, `evaluate` and `predict` also take `mode=` to override it for one call. Calling a
module on a NumPy array always runs eagerly: that is the debugging interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sporenet.cloud._checks import choice

MODES = ("eager", "graph")
_state = {"mode": "graph"}


def set_mode(mode: str) -> None:
    """Select "eager" or "graph" execution for fit, evaluate and predict."""
    _state["mode"] = choice("mode", mode, MODES)


def get_mode() -> str:
    return _state["mode"]


def resolve_mode(mode: str | None) -> str:
    """`mode` if given (validated), else the global switch."""
    return get_mode() if mode is None else choice("mode", mode, MODES)


@contextmanager
def using_mode(mode: str) -> Iterator[None]:
    """Temporarily switch the mode: `with using_mode("eager"): ...`."""
    previous = get_mode()
    set_mode(mode)
    try:
        yield
    finally:
        _state["mode"] = previous
