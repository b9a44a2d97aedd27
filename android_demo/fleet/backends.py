"""Where the simulator's device groups run: one protocol, chosen by name from BACKENDS.

Every backend takes the same plain-data arguments of each group's DeviceGroup and returns
the groups' reports, so the driver (simulator.py) has one code path:

    local      every group on a thread of this process (its devices are coroutines on
               the process's one transport loop); the default
    processes  one child process per group (spawned), for more than one core's training
    ray        one Ray actor per group, on a local Ray or the cluster at `ray_address`
"""

from __future__ import annotations

import importlib
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet.devices import DeviceGroup, GroupReport

# Seconds a backend waits past the run's timeout for its groups to hand back their reports.
GRACE_S = 60.0


class Backend(Protocol):
    """Runs device groups against a server and returns their reports."""

    @property
    def default_groups(self) -> int:
        """Groups the devices are split into when the caller does not say."""
        ...

    def run(self, address: str, groups: list[dict[str, Any]], timeout: float) -> list[GroupReport]:
        """Each group's report, in the order of `groups` (their DeviceGroup arguments)."""
        ...


def run_group(kwargs: dict[str, Any], address: str, timeout: float) -> GroupReport:
    """One group from start to end (what every backend runs, wherever it runs it)."""
    return DeviceGroup(**kwargs).run(address, timeout=timeout)


@dataclass(frozen=True)
class LocalBackend:
    """Every group on a thread of this process."""

    default_groups: int = 1

    def run(self, address: str, groups: list[dict[str, Any]], timeout: float) -> list[GroupReport]:
        reports: list[GroupReport | None] = [None] * len(groups)

        def run(k: int) -> None:
            reports[k] = run_group(groups[k], address, timeout)

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(groups))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + GRACE_S)
        return [
            r if r is not None else GroupReport(errors=["group did not finish"]) for r in reports
        ]


@dataclass(frozen=True)
class ProcessBackend:
    """One spawned child process per group (a fresh interpreter: no forked threads)."""

    default_groups: int = 2

    def run(self, address: str, groups: list[dict[str, Any]], timeout: float) -> list[GroupReport]:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(groups), mp_context=context) as pool:
            futures = [pool.submit(run_group, g, address, timeout) for g in groups]
            reports = []
            for f in futures:
                try:
                    reports.append(f.result(timeout + GRACE_S))
                except Exception as exc:  # the group's process died or timed out
                    reports.append(GroupReport(errors=[f"group failed: {exc!r}"]))
            return reports


class _GroupActor:
    """A Ray actor holding one group (the same code the other backends run)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs

    def run(self, address: str, timeout: float) -> GroupReport:
        return run_group(self.kwargs, address, timeout)


@dataclass(frozen=True)
class RayBackend:
    """One Ray actor per group; starts a local Ray on loopback unless given a cluster."""

    ray_address: str | None = None
    default_groups: int = 2

    def run(self, address: str, groups: list[dict[str, Any]], timeout: float) -> list[GroupReport]:
        try:
            ray: Any = importlib.import_module("ray")  # untyped: its stubs fight **kwargs
        except ImportError:
            raise AppError("the ray backend needs Ray: pip install 'sporenet[fleet-ray]'") from None
        started = False
        if not ray.is_initialized():
            local = {} if self.ray_address else {"_node_ip_address": "127.0.0.1"}
            ray.init(
                address=self.ray_address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **local,
            )
            started = True
        try:
            actor = ray.remote(num_cpus=0)(_GroupActor)
            actors = [actor.remote(g) for g in groups]
            runs = [a.run.remote(address, timeout) for a in actors]
            return list(ray.get(runs, timeout=timeout + 2 * GRACE_S))
        finally:
            if started:
                ray.shutdown()


BACKENDS: dict[str, Callable[..., Backend]] = {
    "local": lambda ray_address=None: LocalBackend(),
    "processes": lambda ray_address=None: ProcessBackend(),
    "ray": lambda ray_address=None: RayBackend(ray_address),
}
"""Backend name -> its constructor (keyword `ray_address`, which only Ray reads)."""


def make_backend(name: str, *, ray_address: str | None = None) -> Backend:
    """The backend called `name`."""
    make = BACKENDS.get(name)
    if make is None:
        raise AppError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    if ray_address is not None and name != "ray":
        raise AppError(f"--ray-address applies to the ray backend, not {name!r}")
    return make(ray_address=ray_address)
