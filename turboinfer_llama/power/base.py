"""The meter contract: named windows over a cumulative energy counter.

``begin_window(name)`` / ``end_window(name)`` return a frozen ``Measurement``. Every
meter keeps one cumulative energy reading (a hardware counter, the simulator's
integral, or a sampled-power integral kept by a thread); a window is the difference
between its two ends.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass


class InvalidMeterSpec(ValueError):
    """The meter spec names no meter, or one that cannot measure the given device.
    A ``ValueError``, so callers that caught ``ValueError`` keep working."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """Energy over one window. ``simulated`` is True when no hardware was measured."""

    energy_j: float
    duration_s: float
    avg_power_w: float
    simulated: bool
    source: str


@dataclass(frozen=True, slots=True)
class Calibration:
    """How to turn a fuel gauge's raw readings into watts drawn from the battery.

    ``sign`` makes discharge positive; the scales turn raw units into A and V. The
    Linux ABI (µA, negative while discharging) is the default; Qualcomm gauges report
    positive µA while discharging, some Huawei devices mA (BRIEF.md)."""

    sign: int = -1
    current_unit_scale: float = 1e-6
    voltage_unit_scale: float = 1e-6

    def __post_init__(self) -> None:
        if self.sign not in (-1, 1):
            raise ValueError(f"calibration sign must be -1 or 1, got {self.sign}")
        if self.current_unit_scale <= 0 or self.voltage_unit_scale <= 0:
            raise ValueError("calibration unit scales must be positive")

    def power_w(self, current_raw: float, voltage_raw: float) -> float:
        amps = self.sign * current_raw * self.current_unit_scale
        return amps * voltage_raw * self.voltage_unit_scale


class Meter(ABC):
    """Base of every meter: window bookkeeping over ``_read()``."""

    simulated = False

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, float]] = {}
        self._window_lock = threading.Lock()

    @property
    @abstractmethod
    def source(self) -> str:
        """What is measured and how, for reports."""

    @abstractmethod
    def _read(self) -> tuple[int, float]:
        """(time ns on this meter's clock, cumulative energy J)."""

    def begin_window(self, name: str) -> None:
        with self._window_lock:
            if name in self._windows:
                raise ValueError(f"window {name!r} is already open on {type(self).__name__}")
            self._windows[name] = self._read()

    def end_window(self, name: str) -> Measurement:
        with self._window_lock:
            if name not in self._windows:
                raise ValueError(f"no open window {name!r} on {type(self).__name__}")
            t0, e0 = self._windows.pop(name)
        t1, e1 = self._read()
        duration_s = (t1 - t0) / 1e9
        energy_j = e1 - e0
        return Measurement(
            energy_j=energy_j,
            duration_s=duration_s,
            avg_power_w=energy_j / duration_s if duration_s > 0 else 0.0,
            simulated=self.simulated,
            source=self.source,
        )

    def open_windows(self) -> list[str]:
        with self._window_lock:
            return list(self._windows)

    def close(self) -> None:  # noqa: B027 - most meters hold nothing to release
        """Release what the meter holds (threads, handles). Idempotent."""
