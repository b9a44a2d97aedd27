"""The fleet simulator: virtual devices against a real sporenet-server (`sporenet-fleet`).

See simulator.py for the code path both backends share, devices.py for what a virtual
device is, profile.py for how devices differ.
"""

from sporenet.android_demo.fleet.profile import FleetProfile
from sporenet.android_demo.fleet.simulator import FleetReport, simulate

__all__ = ["FleetProfile", "FleetReport", "simulate"]
