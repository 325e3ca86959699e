"""GPU devices: a registry of backends (imported lazily) and ``open_device(spec)``.

Specs: ``sim[:profile]``, ``devfreq[:name-or-path]``, ``kgsl``, ``kmod[:/dev/turboinfer]``,
``adb[:serial]`` and ``auto``. ``auto`` probes the real backends in ``AUTO_ORDER`` and
falls back to the simulator only with a logged line saying so; a named real device
never silently becomes the simulator.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from .base import (
    Capabilities,
    Counters,
    DeviceError,
    DeviceGone,
    DeviceNotFound,
    DeviceState,
    GpuDevice,
    InvalidFrequency,
    PermissionDenied,
    Unsupported,
)

log = logging.getLogger(__name__)

BACKENDS: dict[str, str] = {
    "sim": f"{__name__}.sim",
    "devfreq": f"{__name__}.devfreq",
    "kgsl": f"{__name__}.kgsl",
    "kmod": f"{__name__}.kmod",
    "adb": f"{__name__}.adb",
}
AUTO_ORDER: tuple[str, ...] = ("kmod", "kgsl", "devfreq")
SPEC_CHOICES = (
    "sim[:profile], devfreq[:name-or-path], kgsl, kmod[:/dev/turboinfer], adb[:serial], auto"
)


class InvalidDeviceSpec(DeviceError, ValueError):
    """The device spec names no backend; the message lists the valid ones."""


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"sim:adreno650"`` -> ``("sim", "adreno650")``; ``"kgsl"`` -> ``("kgsl", None)``."""
    name, sep, arg = spec.strip().partition(":")
    name = name.lower()
    if name != "auto" and name not in BACKENDS:
        raise InvalidDeviceSpec(f"unknown device {spec!r}; valid choices: {SPEC_CHOICES}")
    if name == "auto" and sep:
        raise InvalidDeviceSpec(f"'auto' takes no argument (got {spec!r}); valid: {SPEC_CHOICES}")
    return name, (arg if sep and arg else None)


def backend_module(name: str) -> ModuleType:
    """The backend's module; ``Unsupported`` if this build does not ship it yet."""
    path = BACKENDS[name]
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name == path:
            raise Unsupported(f"the {name} backend is not part of this build") from e
        raise


def probe(name: str, arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    """Is backend ``name`` usable here? (cached by the backend), with the reason."""
    try:
        module = backend_module(name)
    except Unsupported as e:
        return False, str(e)
    ok, why = module.available(arg, root=root)
    return bool(ok), str(why)


def open_device(spec: str, *, root: str = "/") -> GpuDevice:
    """Open the GPU named by ``spec``. ``root`` is the sysfs root (tests use fake trees)."""
    name, arg = parse_spec(spec)
    if name != "auto":
        device: GpuDevice = backend_module(name).open_backend(arg, root=root)
        return device
    reasons = []
    for candidate in AUTO_ORDER:
        ok, why = probe(candidate, root=root)
        if ok:
            log.info("device auto: using %s (%s)", candidate, why)
            found: GpuDevice = backend_module(candidate).open_backend(None, root=root)
            return found
        reasons.append(f"{candidate}: {why}")
    log.warning(
        "device auto: no real GPU backend usable (%s); falling back to the simulated GPU, "
        "all figures will be simulated",
        "; ".join(reasons),
    )
    sim: GpuDevice = backend_module("sim").open_backend(None, root=root)
    return sim


__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "Capabilities",
    "Counters",
    "DeviceError",
    "DeviceGone",
    "DeviceNotFound",
    "DeviceState",
    "GpuDevice",
    "InvalidDeviceSpec",
    "InvalidFrequency",
    "PermissionDenied",
    "Unsupported",
    "backend_module",
    "open_device",
    "parse_spec",
    "probe",
]
