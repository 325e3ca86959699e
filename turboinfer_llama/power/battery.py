"""Battery fuel gauge: ``current_now`` x ``voltage_now``, sampled in a thread.

Power is integrated with the trapezoid rule between samples; a window's two ends take
a sample of their own, so short windows are covered. Sign and units differ between
devices; ``Calibration`` says how to read them (the adb backend persists one per phone).
The figure is the whole device's draw, not the GPU's alone.
"""

from __future__ import annotations

import logging
import threading

from .._clock import now_ns
from ..devices.base import DeviceError, DeviceNotFound
from ..devices.sysfs_io import LocalSysfs, SysfsIO
from .base import Calibration, Meter

log = logging.getLogger(__name__)

POWER_SUPPLY = "/sys/class/power_supply"
UA_THRESHOLD = 20_000
"""|raw current| above this cannot be mA on a phone (20 A), so it is µA."""


def guess_calibration(current_raw: int, voltage_raw: int, *, discharging: bool) -> Calibration:
    """A calibration from one reading taken in a known state (a hook for per-device
    calibration): the sign that makes discharge positive, and the units by magnitude."""
    if current_raw == 0:
        raise ValueError("cannot calibrate from a zero current reading")
    positive = current_raw > 0
    sign = 1 if positive == discharging else -1
    current_scale = 1e-6 if abs(current_raw) > UA_THRESHOLD else 1e-3
    voltage_scale = 1e-6 if abs(voltage_raw) > 100_000 else 1e-3
    return Calibration(sign, current_scale, voltage_scale)


def find_battery(io: SysfsIO) -> str:
    """The power_supply directory of the battery (type Battery with current_now)."""
    if io.exists(f"{POWER_SUPPLY}/battery/current_now"):
        return f"{POWER_SUPPLY}/battery"
    if io.exists(POWER_SUPPLY):
        for name in io.listdir(POWER_SUPPLY):
            path = f"{POWER_SUPPLY}/{name}"
            if (
                io.exists(f"{path}/type")
                and io.read(f"{path}/type") == "Battery"
                and io.exists(f"{path}/current_now")
            ):
                return path
    raise DeviceNotFound(f"no battery with current_now under {POWER_SUPPLY} ({io.describe()})")


class BatteryMeter(Meter):
    """Samples a power_supply node every ``period_s`` in a daemon thread."""

    def __init__(
        self,
        io: SysfsIO | None = None,
        *,
        root: str = "/",
        supply: str | None = None,
        calibration: Calibration | None = None,
        period_s: float = 0.05,
    ) -> None:
        super().__init__()
        self.io = io or LocalSysfs(root)
        self.path = f"{POWER_SUPPLY}/{supply}" if supply else find_battery(self.io)
        self.calibration = calibration or Calibration()
        self.period_s = period_s
        self._lock = threading.Lock()
        self._energy_j = 0.0
        self._last: tuple[int, float] | None = None
        self.samples = 0
        self.errors = 0
        self._sample()  # fails here, not in the thread, if the files are unreadable
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="battery-meter", daemon=True)
        self._thread.start()

    @property
    def source(self) -> str:
        c = self.calibration
        return (
            f"battery fuel gauge {self.path} (whole device), current_now x voltage_now every "
            f"{self.period_s:g} s; calibration sign {c.sign:+d}, current x{c.current_unit_scale:g}"
            f" A, voltage x{c.voltage_unit_scale:g} V"
        )

    def power_w(self) -> float:
        current = int(self.io.read(f"{self.path}/current_now"))
        voltage = int(self.io.read(f"{self.path}/voltage_now"))
        return self.calibration.power_w(current, voltage)

    def _sample(self) -> None:
        watts = self.power_w()
        t = now_ns()
        with self._lock:
            if self._last is not None:
                t0, w0 = self._last
                self._energy_j += (t - t0) / 1e9 * (w0 + watts) / 2
            self._last = (t, watts)
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._sample()
            except DeviceError as e:
                self.errors += 1
                log.warning("battery meter: %s", e)

    def _read(self) -> tuple[int, float]:
        self._sample()
        with self._lock:
            assert self._last is not None
            return self._last[0], self._energy_j

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.period_s + 1)
