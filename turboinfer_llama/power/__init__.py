"""Energy meters: named windows returning a frozen ``Measurement``.

``open_meter(spec)`` takes ``sim`` (the simulated GPU's integral), ``battery[:supply]``,
``rapl[:zone]``, ``nvml[:index]``, ``monsoon[:serial]`` or ``auto``. Backends are
imported lazily; NVML and Monsoon are optional extras.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ..devices.base import DeviceError
from .base import Calibration, InvalidMeterSpec, Measurement, Meter

log = logging.getLogger(__name__)

METERS: dict[str, tuple[str, str]] = {
    "sim": ("sim", "SimMeter"),
    "battery": ("battery", "BatteryMeter"),
    "rapl": ("rapl", "RaplMeter"),
    "nvml": ("nvml", "NvmlMeter"),
    "monsoon": ("monsoon", "MonsoonMeter"),
}
AUTO_ORDER: tuple[str, ...] = ("battery", "nvml", "rapl")
METER_CHOICES = "sim, battery[:supply], rapl[:zone], nvml[:index], monsoon[:serial], auto"


def _cls(name: str) -> Any:
    module, cls = METERS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def open_meter(spec: str, *, device: Any = None, root: str = "/") -> Meter:
    """A meter for ``spec``; ``device`` is the open GPU (the sim meter reads it)."""
    name, sep, arg = spec.strip().partition(":")
    name = name.lower()
    if name == "auto":
        if device is not None and getattr(device.capabilities, "simulated", False):
            return open_meter("sim", device=device)
        reasons = []
        for candidate in AUTO_ORDER:
            try:
                return open_meter(candidate, root=root)
            except DeviceError as e:
                reasons.append(f"{candidate}: {e}")
        raise DeviceError("no energy meter usable here (" + "; ".join(reasons) + ")")
    if name not in METERS:
        raise InvalidMeterSpec(f"unknown meter {spec!r}; valid choices: {METER_CHOICES}")
    arg = arg if sep and arg else ""
    if name == "sim":
        from ..devices.sim import SimGpu

        if not isinstance(device, SimGpu):
            raise InvalidMeterSpec(
                "the sim meter measures the simulated GPU: open device sim[:profile]"
            )
        return _cls("sim")(device)
    if name == "battery":
        return _cls("battery")(root=root, supply=arg or None)
    if name == "rapl":
        return _cls("rapl")(root=root, zone=arg or None)
    if name in ("nvml", "monsoon") and arg and not arg.isdigit():
        raise InvalidMeterSpec(f"meter {spec!r}: {name} takes a number after ':', got {arg!r}")
    if name == "nvml":
        return _cls("nvml")(int(arg or 0))
    return _cls("monsoon")(int(arg) if arg else None)


def probe_meters(*, root: str = "/") -> list[tuple[str, bool, str]]:
    """(meter, usable, why) for each real meter, opening and closing it once."""
    found = []
    for name in ("battery", "rapl", "nvml", "monsoon"):
        try:
            meter = open_meter(name, root=root)
        except DeviceError as e:
            found.append((name, False, str(e)))
            continue
        found.append((name, True, meter.source))
        meter.close()
    return found


__all__ = [
    "METERS",
    "Calibration",
    "InvalidMeterSpec",
    "Measurement",
    "Meter",
    "open_meter",
    "probe_meters",
]
