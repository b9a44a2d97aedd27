"""A fleet's profile: how devices differ (data, speed, network, availability, dropouts).

Read from a JSON file (`--profile FILE`); every field has a default, and unknown fields
are refused by name. Per-device values are drawn once from the profile with its seed:

    {
      "partition": "dirichlet",    "alpha": 0.1,        # or "iid", "natural"
      "speed_sigma": 0.7,          # compute-time multiplier, log-normal (see draw_traits)
      "bandwidth_mbps": 20.0,      "bandwidth_sigma": 0.5,   # per device, lognormal around it
      "latency_ms": 30.0,          # one way, per message exchange
      "online_fraction": 0.9,      # share of time a device is available
      "mean_online_s": 30.0,       # availability trace: on/off periods (exponential)
      "dropout_train": 0.05,       # chance a device vanishes while training a round
      "dropout_upload": 0.02,      # chance it vanishes before its update is sent
      "rejoin_after_s": 5.0,       # a dropped device is back after this (or its round's end)
      "simulate_time": true,       # sleep the simulated compute and network time
      "seed": 0
    }

With "simulate_time": false devices run as fast as the host allows (the benchmark's
setting), still dropping out and partitioned as the profile says.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet.partition import PARTITIONS

# The 95th percentile of a standard normal: speeds are log-normal relative to the fastest
# 5%, so speed_sigma = ln(10) / (2 * Z95) = 0.7 spreads the 5th-95th percentile tenfold.
Z95 = 1.6449


@dataclass(frozen=True)
class FleetProfile:
    """How the virtual devices differ; see the module docstring for the file format."""

    partition: str = "iid"
    alpha: float = 0.5
    speed_sigma: float = 0.0
    bandwidth_mbps: float = 0.0  # 0: unlimited
    bandwidth_sigma: float = 0.0
    latency_ms: float = 0.0
    online_fraction: float = 1.0
    mean_online_s: float = 30.0
    dropout_train: float = 0.0
    dropout_upload: float = 0.0
    rejoin_after_s: float = 5.0
    simulate_time: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.partition not in PARTITIONS:
            raise AppError(f"`partition` must be one of {list(PARTITIONS)}, got {self.partition!r}")
        checks = [
            ("alpha", self.alpha > 0, "> 0"),
            ("speed_sigma", self.speed_sigma >= 0, ">= 0"),
            ("bandwidth_mbps", self.bandwidth_mbps >= 0, ">= 0 (0: unlimited)"),
            ("bandwidth_sigma", self.bandwidth_sigma >= 0, ">= 0"),
            ("latency_ms", self.latency_ms >= 0, ">= 0"),
            ("online_fraction", 0 < self.online_fraction <= 1, "in (0, 1]"),
            ("mean_online_s", self.mean_online_s > 0, "> 0"),
            ("dropout_train", 0 <= self.dropout_train < 1, "in [0, 1)"),
            ("dropout_upload", 0 <= self.dropout_upload < 1, "in [0, 1)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise AppError(f"profile `{name}` must be {expected}, got {getattr(self, name)!r}")

    @classmethod
    def load(cls, path: str | Path) -> FleetProfile:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise AppError(f"could not read the fleet profile {str(path)!r}: {exc}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FleetProfile:
        if not isinstance(raw, dict):
            raise AppError(f"a fleet profile is a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise AppError(f"unknown profile fields {unknown}; known: {sorted(known)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceTraits:
    """One virtual device's draw from the profile."""

    speed: float  # compute-time multiplier (1: the host's speed)
    bandwidth_bps: float  # 0: unlimited
    latency_s: float
    online_fraction: float
    mean_online_s: float
    dropout_train: float
    dropout_upload: float
    rejoin_after_s: float


def draw_traits(profile: FleetProfile, devices: int) -> list[DeviceTraits]:
    """Per-device traits, reproducible from the profile's seed. A device's speed (its
    compute-time multiplier, >= 1 because the host's own time is the fastest there is) is
    log-normal, exp(sigma * (z + Z95)), with the fastest 5% at the host's speed: the
    median device is exp(Z95 * sigma) slower, the 95th percentile exp(2 * Z95 * sigma)."""
    rng = np.random.default_rng([profile.seed, 1])
    z = rng.normal(0.0, 1.0, devices)
    speed = np.exp(profile.speed_sigma * np.maximum(0.0, z + Z95))
    bw = (
        profile.bandwidth_mbps * 1e6 / 8 * np.exp(rng.normal(0.0, profile.bandwidth_sigma, devices))
    )
    return [
        DeviceTraits(
            float(speed[k]),
            float(bw[k]),
            profile.latency_ms / 1e3,
            profile.online_fraction,
            profile.mean_online_s,
            profile.dropout_train,
            profile.dropout_upload,
            profile.rejoin_after_s,
        )
        for k in range(devices)
    ]
