"""NVIDIA GPUs through NVML's total-energy counter (optional: ``pip install nvidia-ml-py``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from .._clock import now_ns
from ..devices.base import DeviceNotFound, Unsupported
from .base import Meter


def _nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as e:
        raise Unsupported(
            "the NVML meter needs the optional package nvidia-ml-py (`pip install nvidia-ml-py`)"
        ) from e
    return pynvml


class NvmlMeter(Meter):
    """``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta+)."""

    def __init__(self, index: int = 0) -> None:
        super().__init__()
        self._nv = _nvml()
        try:
            self._nv.nvmlInit()
            self._handle = self._nv.nvmlDeviceGetHandleByIndex(index)
            name = self._nv.nvmlDeviceGetName(self._handle)
            self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except self._nv.NVMLError as e:
            raise DeviceNotFound(f"NVML GPU {index}: {e}") from e
        self.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        self.index = index
        self._lock = threading.Lock()

    @property
    def source(self) -> str:
        return f"NVML total energy counter of GPU {self.index} ({self.gpu_name})"

    def _read(self) -> tuple[int, float]:
        with self._lock:
            mj = self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            return now_ns(), mj / 1e3

    def close(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()
