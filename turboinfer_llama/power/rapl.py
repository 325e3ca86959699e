"""Intel/AMD RAPL through powercap sysfs: a cumulative ``energy_uj`` counter per zone.

It measures the host package (CPU), not a phone GPU: useful to see what the engine
itself costs on a laptop or server. The counter wraps at ``max_energy_range_uj``.
"""

from __future__ import annotations

import threading

from .._clock import now_ns
from ..devices.base import DeviceNotFound
from ..devices.sysfs_io import LocalSysfs, SysfsIO
from .base import Meter

POWERCAP = "/sys/class/powercap"


def find_zones(io: SysfsIO) -> list[str]:
    """Top-level RAPL zones (``intel-rapl:0``, ...), without their subzones."""
    if not io.exists(POWERCAP):
        return []
    return [
        n
        for n in io.listdir(POWERCAP)
        if n.count(":") == 1 and n.split(":")[0] in ("intel-rapl", "amd-rapl")
    ]


class RaplMeter(Meter):
    def __init__(self, io: SysfsIO | None = None, *, root: str = "/", zone: str | None = None):
        super().__init__()
        self.io = io or LocalSysfs(root)
        zones = find_zones(self.io)
        if zone is None:
            if not zones:
                raise DeviceNotFound(f"no RAPL zone under {POWERCAP} ({self.io.describe()})")
            zone = zones[0]
        self.path = f"{POWERCAP}/{zone}"
        if not self.io.exists(f"{self.path}/energy_uj"):
            raise DeviceNotFound(f"no RAPL counter {self.path}/energy_uj ({self.io.describe()})")
        name = f"{self.path}/name"
        self.zone_name = self.io.read(name) if self.io.exists(name) else zone
        range_file = f"{self.path}/max_energy_range_uj"
        self._range_uj = int(self.io.read(range_file)) if self.io.exists(range_file) else 2**32
        self._lock = threading.Lock()
        self._last_uj = self._raw()  # PermissionDenied here says how to get access
        self._total_uj = 0

    @property
    def source(self) -> str:
        return f"RAPL {self.zone_name} ({self.path}/energy_uj): host package energy, not a GPU"

    def _raw(self) -> int:
        return int(self.io.read(f"{self.path}/energy_uj"))

    def _read(self) -> tuple[int, float]:
        with self._lock:
            raw = self._raw()
            t = now_ns()
            delta = raw - self._last_uj
            if delta < 0:  # wrapped
                delta += self._range_uj
            self._total_uj += delta
            self._last_uj = raw
            return t, self._total_uj / 1e6
