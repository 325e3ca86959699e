"""The GpuDevice protocol, its value types and our error hierarchy.

Every hardware backend (one module each: sim, devfreq, kgsl, kmod, adb) implements
``GpuDevice``. OS errors are turned into ``DeviceError`` subclasses at the backend
boundary (``raise ... from e``) so callers handle one hierarchy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class DeviceError(Exception):
    """Base of every device-layer error."""


class PermissionDenied(DeviceError):
    """We may not touch the device. The message says how to get the permission."""


class DeviceNotFound(DeviceError):
    """The named device does not exist here."""


class InvalidFrequency(DeviceError, ValueError):
    """A frequency or range that the device cannot take; the message lists the table."""


class DeviceGone(DeviceError):
    """The device vanished mid-run (unplugged phone, removed module, closed fd)."""


class Unsupported(DeviceError):
    """The backend cannot do this operation on this device."""


@dataclass(frozen=True, slots=True)
class Counters:
    """One reading of the device's activity counters.

    ``busy_ns``/``total_ns`` are cumulative since the device was opened (monotonic);
    ``instructions`` is a cumulative PMU count, or None without a PMU.
    """

    ts_ns: int
    busy_ns: int
    total_ns: int
    instructions: int | None
    freq_hz: int


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do. ``switch_latency_ns`` is the time from ``set_hz`` until
    the new clock is in effect (measured or from the profile; ``switch_latency_source``
    says which)."""

    can_set: bool
    has_pmu: bool
    simulated: bool
    switch_latency_ns: int
    switch_latency_source: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceState:
    """What ``snapshot()`` captures and ``restore()`` puts back."""

    governor: str | None
    min_hz: int
    max_hz: int
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class GpuDevice(Protocol):
    """A GPU whose clock we can read and (maybe) set. All frequencies in Hz."""

    name: str
    capabilities: Capabilities

    def frequencies_hz(self) -> list[int]:
        """Available levels, ascending."""
        ...

    def current_hz(self) -> int: ...

    def set_hz(self, hz: int) -> int:
        """Pin the clock now; a value between levels snaps to the nearest. Returns the
        level applied (after any thermal cap)."""
        ...

    def set_range(self, min_hz: int, max_hz: int) -> None: ...

    def read_counters(self) -> Counters: ...

    def snapshot(self) -> DeviceState: ...

    def restore(self, state: DeviceState) -> None: ...

    def close(self) -> None:
        """Restore the state found at open and release the device. Idempotent."""
        ...


def snap_hz(levels_hz: list[int], hz: int) -> int:
    """The level nearest to ``hz`` (ties go to the higher level)."""
    if not levels_hz:
        raise Unsupported("device reports no frequency levels")
    return min(levels_hz, key=lambda lv: (abs(lv - hz), -lv))
