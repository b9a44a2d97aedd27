"""The device policy: federated training runs only when the device can spare it.

A phone trains for the fleet only while charging, idle (no one using the app), on an
unmetered network and with the battery above a threshold. Under Termux the battery and
network come from termux-api (`termux-battery-status`, `termux-wifi-connectioninfo`);
elsewhere they are simulated (values given on the command line). Idleness is the app's
own: no user request for `idle_after` seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypedDict

from sporenet.android_demo.errors import AppError

TERMUX_TIMEOUT = 10.0
"""Seconds a termux-api command may take (the first call starts the API service)."""


class SimulatedState(TypedDict):
    """The readings a device without termux-api reports (settable while the app runs)."""

    charging: bool
    battery: float
    unmetered: bool


@dataclass(frozen=True)
class DeviceState:
    """What the policy looks at, read at one moment."""

    charging: bool
    battery: float  # percent, 0-100
    unmetered: bool
    idle: bool
    source: str  # "termux" or "simulated"


@dataclass(frozen=True)
class DevicePolicy:
    """When training may run; `allows` says why not."""

    require_charging: bool = True
    require_idle: bool = True
    require_unmetered: bool = True
    min_battery: float = 50.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_battery <= 100:
            raise AppError(f"min_battery must be a percentage in [0, 100], got {self.min_battery}")

    def blockers(self, state: DeviceState) -> list[str]:
        """Why the state does not allow training (empty: it does)."""
        out = []
        if self.require_charging and not state.charging:
            out.append("not charging")
        if self.require_idle and not state.idle:
            out.append("in use")
        if self.require_unmetered and not state.unmetered:
            out.append("metered network")
        if state.battery < self.min_battery:
            out.append(f"battery {state.battery:.0f}% < {self.min_battery:.0f}%")
        return out


def _termux_json(command: str) -> dict:
    out = subprocess.run(
        [command], capture_output=True, text=True, timeout=TERMUX_TIMEOUT, check=True
    )
    value = json.loads(out.stdout or "{}")
    if not isinstance(value, dict):
        raise AppError(f"{command} printed {out.stdout[:200]!r}, expected a JSON object")
    return value


class Sensors:
    """Reads the device state: termux-api when its commands exist, else simulated values."""

    def __init__(
        self,
        *,
        charging: bool = True,
        battery: float = 100.0,
        unmetered: bool = True,
        idle_after: float = 30.0,
        termux: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.simulated: SimulatedState = {
            "charging": charging,
            "battery": float(battery),
            "unmetered": unmetered,
        }
        self.idle_after, self.clock = idle_after, clock
        self.termux = (
            shutil.which("termux-battery-status") is not None if termux is None else termux
        )
        self.last_activity = clock() - idle_after  # idle from the start

    def touch(self) -> None:
        """The user did something: the device is in use for the next `idle_after` seconds."""
        self.last_activity = self.clock()

    def read(self) -> DeviceState:
        idle = self.clock() - self.last_activity >= self.idle_after
        if not self.termux:
            return DeviceState(idle=idle, source="simulated", **self.simulated)
        try:
            battery = _termux_json("termux-battery-status")
            wifi = _termux_json("termux-wifi-connectioninfo")
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError, AppError):
            # The API app is missing or refused: assume the worst, train nothing.
            return DeviceState(
                charging=False, battery=0.0, unmetered=False, idle=idle, source="termux"
            )
        plugged = str(battery.get("plugged", "UNPLUGGED")).upper()
        return DeviceState(
            charging=plugged != "UNPLUGGED"
            or str(battery.get("status", "")).upper() in ("CHARGING", "FULL"),
            battery=float(battery.get("percentage", 0)),
            unmetered=str(wifi.get("supplicant_state", "")).upper() == "COMPLETED",
            idle=idle,
            source="termux",
        )


def describe(policy: DevicePolicy, state: DeviceState) -> dict:
    """The state and the policy's verdict, for the status endpoint."""
    return {
        **asdict(state),
        "allowed": not policy.blockers(state),
        "blockers": policy.blockers(state),
    }
