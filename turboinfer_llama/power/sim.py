"""Meter over the simulated GPU: energy and time are the simulator's virtual integral."""

from __future__ import annotations

from ..devices.sim import SimGpu
from .base import Meter


class SimMeter(Meter):
    """Windows on a ``SimGpu``'s virtual clock; every figure is simulated."""

    simulated = True

    def __init__(self, gpu: SimGpu) -> None:
        super().__init__()
        self.gpu = gpu

    @property
    def source(self) -> str:
        p = self.gpu.profile
        return f"simulated GPU {self.gpu.name} ({p.gpu}; profile parameters in devices/profiles)"

    def _read(self) -> tuple[int, float]:
        return self.gpu.now_ns(), self.gpu.energy_j
