"""Monsoon High Voltage Power Monitor (optional: PyPI ``monsoon``, module ``Monsoon``).

The monitor samples main-channel current (mA) and voltage (V) at 5 kHz; a thread
collects batches with the sample engine's periodic API and integrates them. A window's
ends are accurate to one batch (``batch`` samples, 0.1 s by default).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._clock import now_ns
from ..devices.base import DeviceNotFound, Unsupported
from .base import Meter

log = logging.getLogger(__name__)

SAMPLE_HZ = 5000  # HVPM sample rate (BRIEF.md)


def _open_engine(serial: int | None, vout: float) -> tuple[Any, Any]:
    try:
        import Monsoon.HVPM as HVPM  # type: ignore[import-not-found]
        import Monsoon.sampleEngine as sampleEngine  # type: ignore[import-not-found]
    except ImportError as e:
        raise Unsupported(
            "the Monsoon meter needs the optional package monsoon (`pip install monsoon`)"
        ) from e
    mon = HVPM.Monsoon()
    try:
        mon.setup_usb(serial)
    except Exception as e:  # the library raises bare exceptions when no monitor is plugged
        raise DeviceNotFound(f"no Monsoon power monitor found over USB ({e})") from e
    mon.setVout(vout)
    engine = sampleEngine.SampleEngine(mon)
    engine.disableCSVOutput()
    engine.ConsoleOutput(False)
    engine.enableChannel(sampleEngine.channels.MainCurrent)
    engine.enableChannel(sampleEngine.channels.MainVoltage)
    return engine, sampleEngine.channels


class MonsoonMeter(Meter):
    """``engine``/``channels`` can be injected (tests); otherwise the USB monitor with
    serial ``serial`` is opened and its output set to ``vout`` volts."""

    def __init__(
        self,
        serial: int | None = None,
        *,
        vout: float = 4.0,
        batch: int = 500,
        engine: Any = None,
        channels: Any = None,
    ) -> None:
        super().__init__()
        if engine is None:
            engine, channels = _open_engine(serial, vout)
        self.serial = serial
        self._engine, self._ch = engine, channels
        self.batch = batch
        self._lock = threading.Lock()
        self._energy_j = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._engine.periodicStartSampling()
        self._thread = threading.Thread(target=self._run, name="monsoon-meter", daemon=True)
        self._thread.start()

    @property
    def source(self) -> str:
        return f"Monsoon HVPM {self.serial or ''} main channel at {SAMPLE_HZ} Hz".replace("  ", " ")

    def _collect(self) -> None:
        data = self._engine.periodicCollectSamples(self.batch)
        currents_ma = data[self._ch.MainCurrent]
        volts = data[self._ch.MainVoltage]
        joules = sum(i * 1e-3 * v for i, v in zip(currents_ma, volts, strict=False)) / SAMPLE_HZ
        with self._lock:
            self._energy_j += joules
            self.samples += len(currents_ma)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._collect()
            except Exception as e:  # keep the window API alive; report once per failure
                log.warning("monsoon meter: %s", e)
                self._stop.wait(0.1)

    def _read(self) -> tuple[int, float]:
        with self._lock:
            return now_ns(), self._energy_j

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        self._engine.periodicStopSampling(closeConnection=True)
