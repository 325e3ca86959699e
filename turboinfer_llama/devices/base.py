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


class BadCounters(DeviceError):
    """The device's counters returned values that cannot be right (negative, busy
    above total, going backwards, a busy fraction outside 0..1). A controller fed
    with them would steer blind, so callers hand the GPU back to its governor."""


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
    says which). ``submit_batch_nodes``: where known, the kernels the engine's GPU
    backend records per submission, the GPU idle while it records the next batch (the
    simulator's phone host model, where it is applied: ``SimGpu(host_model=True)``);
    None where unknown: every real device today (ggml-vulkan submits about every 100
    nodes, or sooner by matrix bytes, a rule not modelled here)."""

    can_set: bool
    has_pmu: bool
    simulated: bool
    switch_latency_ns: int
    switch_latency_source: str = ""
    notes: tuple[str, ...] = ()
    submit_batch_nodes: int | None = None


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


class CounterCheck:
    """Checks each ``Counters`` reading against the previous one (``check``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: Counters | None = None

    def check(self, c: Counters) -> Counters:
        """``c``, or ``BadCounters`` saying what is wrong with it."""
        why = None
        prev = self.last
        if prev is not None and c.ts_ns < prev.ts_ns:
            why = f"time went backwards ({prev.ts_ns} -> {c.ts_ns} ns)"
        elif c.busy_ns < 0 or c.total_ns < 0:
            why = f"negative busy/total ({c.busy_ns}/{c.total_ns} ns)"
        elif c.busy_ns > c.total_ns:
            why = f"busy {c.busy_ns} ns above total {c.total_ns} ns (wrapped?)"
        elif prev is not None and (c.busy_ns < prev.busy_ns or c.total_ns < prev.total_ns):
            why = (
                f"cumulative counters went backwards (busy {prev.busy_ns} -> "
                f"{c.busy_ns}, total {prev.total_ns} -> {c.total_ns} ns; wrapped or reset)"
            )
        if why is not None:
            raise BadCounters(f"{self.name}: bad counter reading: {why}")
        self.last = c
        return c


def snap_hz(levels_hz: list[int], hz: int) -> int:
    """The level nearest to ``hz`` (ties go to the higher level)."""
    if not levels_hz:
        raise Unsupported("device reports no frequency levels")
    return min(levels_hz, key=lambda lv: (abs(lv - hz), -lv))
