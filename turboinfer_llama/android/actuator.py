"""Host-side actuation of controller decisions on a phone, tolerant of a lost phone."""

from __future__ import annotations

import logging

from ..control.base import Decision
from ..devices.base import DeviceGone, GpuDevice

log = logging.getLogger(__name__)


class SafeActuator:
    """Applies ``Decision``s to ``device``. If the phone goes away mid-run (cable out,
    adb server killed) it stops actuating, keeps the error for the report and lets the
    run carry on uncontrolled, on whatever clock the phone's own governor picks."""

    def __init__(self, device: GpuDevice) -> None:
        self.device = device
        self.error: str | None = None
        self.applied = 0

    @property
    def active(self) -> bool:
        return self.error is None

    def apply(self, decision: Decision) -> int | None:
        """The level set, or None once control has fallen back."""
        if self.error is not None:
            return None
        try:
            hz = self.device.set_hz(decision.freq_hz)
        except DeviceGone as e:
            self.error = f"{e}; GPU control stopped, the run went on without it"
            log.error("%s", self.error)
            return None
        self.applied += 1
        return hz
