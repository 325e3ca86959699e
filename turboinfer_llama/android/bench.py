"""``turboinfer android bench``: the phone's GPU as the device (host-side control over
adb) and its battery fuel gauge as the meter, handed to the project's benchmark runner.

This module only builds the two pieces and checks the conditions for an honest energy
figure (calibrated gauge, not charging); the workload loop is the runner's
(``turboinfer_llama.bench.runner.run_bench``), so phone and desktop runs share it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..devices.adb import AdbGpu, open_adb_gpu
from ..devices.adb_link import AdbLink
from ..devices.adb_settings import AdbSettings
from ..devices.base import DeviceError
from . import fuelgauge

RUNNER = "turboinfer_llama.bench.runner"


class RunnerMissing(RuntimeError):
    """The benchmark runner is not part of this build."""


@dataclass
class PhoneRig:
    """What a benchmark on a phone needs: the GPU (``GpuDevice``) and the meter
    (``begin_window``/``end_window`` -> Measurement)."""

    link: AdbLink
    device: AdbGpu
    meter: fuelgauge.BatteryEnergyMeter
    calibration: fuelgauge.CalibrationRecord


def find_runner() -> Callable[..., Any]:
    """``run_bench`` if this build has one that can take a phone (``device=`` and
    ``meter=`` keywords); otherwise ``RunnerMissing`` saying what is missing."""
    try:
        module = importlib.import_module(RUNNER)
    except ModuleNotFoundError as e:
        if e.name not in (RUNNER, "turboinfer_llama.bench"):
            raise
        module = None
    run_bench = getattr(module, "run_bench", None)
    ready = (
        " The phone device and battery meter are ready for it: "
        "turboinfer_llama.android.bench.phone_rig(); `turboinfer android probe` works."
    )
    if run_bench is None:
        raise RunnerMissing(
            f"the benchmark runner ({RUNNER}.run_bench) is not in this build, so "
            "`turboinfer android bench` cannot run a workload yet." + ready
        )
    params = inspect.signature(run_bench).parameters
    if not {"device", "meter"} <= params.keys():
        raise RunnerMissing(
            f"this build's {RUNNER}.run_bench{inspect.signature(run_bench)} replays on the "
            "simulated GPU and takes no phone device or battery meter (device=, meter=), "
            "so `turboinfer android bench` cannot run a workload on the phone yet." + ready
        )
    return run_bench  # type: ignore[no-any-return]


@contextmanager
def phone_rig(
    serial: str | None = None,
    *,
    settings: AdbSettings | None = None,
    force_charging: bool = False,
    recalibrate: bool = False,
) -> Iterator[PhoneRig]:
    """Open the phone's GPU and battery meter; always restore and stop sampling."""
    settings = settings or AdbSettings()
    link = AdbLink(serial, settings)
    record = None if recalibrate else fuelgauge.load_calibration(link.serial, settings)
    if record is None:
        record = fuelgauge.calibrate(link, settings=settings, force=force_charging)
    device = open_adb_gpu(link.serial, settings)
    try:
        meter = fuelgauge.BatteryEnergyMeter(link, record, force_charging=force_charging)
    except DeviceError:
        device.close()
        raise
    try:
        yield PhoneRig(link, device, meter, record)
    finally:
        meter.close()
        device.close()


def run(
    serial: str | None,
    options: dict[str, Any],
    *,
    force_charging: bool = False,
    settings: AdbSettings | None = None,
) -> Any:
    """Run the project's benchmark with the phone as device and meter."""
    run_bench = find_runner()
    with phone_rig(serial, settings=settings, force_charging=force_charging) as rig:
        return run_bench(device=rig.device, meter=rig.meter, **options)
