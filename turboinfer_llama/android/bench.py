"""``turboinfer android bench``: the benchmark with the phone's GPU and battery.

Where the phone can (rooted, Termux with turboinfer and a GPU build of llama.cpp:
``turboinfer android install``), the whole benchmark runs **on the phone**, in Termux:
llama.cpp computes on the phone's GPU while the controllers steer it and the battery
fuel gauge measures, so the energy is that of inference. The report comes back over
adb, labelled ``inference: on the phone``.

Otherwise it falls back to a **control-only** run: the phone's GPU as the device
(host-side control over adb) and its fuel gauge as the meter, while llama.cpp runs on
the host. That measures an idle phone with a steered clock, so the report says
``control only: inference on the host, not measured energy of inference`` and why the
phone path was not taken. The workload loop is the runner's
(``turboinfer_llama.bench.runner.run_bench``) in both cases.
"""

from __future__ import annotations

import importlib
import inspect
import json
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices.adb import AdbGpu, open_adb_gpu
from ..devices.adb_link import AdbLink
from ..devices.adb_settings import AdbSettings
from ..devices.base import DeviceError
from . import fuelgauge, termux

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


ON_PHONE = "on the phone: Termux, llama.cpp GPU build; measured energy of inference"
CONTROL_ONLY = "control only: inference on the host, not measured energy of inference"
PHONE_TIMEOUT_S = 3 * 3600.0
PHONE_REPORT = f"{termux.PHONE_DIR}/bench-report.json"


def _phone_device(link: AdbLink) -> str:
    """The on-phone device spec: the kernel module if loaded, else KGSL, else devfreq."""
    if link.run("[ -e /dev/turboinfer ]").ok:
        return "kmod"
    if link.run("[ -e /sys/class/kgsl/kgsl-3d0/gpuclk ]").ok:
        return "kgsl"
    return "devfreq"


def run_on_phone(
    link: AdbLink, options: dict[str, Any], *, force_charging: bool = False
) -> dict[str, Any]:
    """``turboinfer bench --device <phone GPU> --meter battery`` in Termux; its report."""
    status = link.run(f"cat {fuelgauge.BATTERY_DIR}/status").out.strip()
    if status in ("Charging", "Full") and not force_charging:
        raise fuelgauge.ChargingError(f"{link.serial}: {fuelgauge.CHARGING_ADVICE}")
    args = [
        f"{termux.TERMUX_PREFIX}/bin/turboinfer",
        "bench",
        "--device",
        _phone_device(link),
        "--meter",
        "battery",
        "--live-rounds",
        "0",
        "--json",
        PHONE_REPORT,
    ]
    model = options.get("model")
    if model:
        local = Path(model)
        if not local.is_file():
            raise DeviceError(f"model not found on the host: {model}")
        remote = f"{termux.PHONE_DIR}/{local.name}"
        link.run(f"mkdir -p {termux.PHONE_DIR}")
        if not link.run(f"[ -f {shlex.quote(remote)} ]").ok:
            link.push(local, remote)
        args += ["--model", remote]
    if options.get("controller"):
        args += ["--controllers", str(options["controller"])]
    for key, flag in (("n_ctx", "--n-ctx"), ("max_tokens", "--max-tokens")):
        if options.get(key):
            args += [flag, str(int(options[key]))]
    link.run(f"rm -f {PHONE_REPORT}")
    r = termux.run_in_termux(link, shlex.join(args), PHONE_TIMEOUT_S)
    if not r.ok:
        tail = "\n".join(r.out.strip().splitlines()[-15:])
        raise DeviceError(f"the benchmark in Termux on {link.serial} failed (exit {r.rc}):\n{tail}")
    text = link.run(f"cat {PHONE_REPORT}")
    try:
        report: dict[str, Any] = json.loads(text.out)
    except json.JSONDecodeError as e:
        raise DeviceError(f"no readable report at {link.serial}:{PHONE_REPORT} ({e})") from e
    report["inference"] = ON_PHONE
    report["control_only"] = False
    return report


@dataclass
class PhoneBench:
    """What ``run`` did: the report, and whether inference ran on the phone."""

    report: dict[str, Any]
    on_phone: bool
    why: str


def run(
    serial: str | None,
    options: dict[str, Any],
    *,
    force_charging: bool = False,
    settings: AdbSettings | None = None,
) -> PhoneBench:
    """The benchmark on the phone in Termux when it can; else control only (labelled)."""
    settings = settings or AdbSettings()
    link = AdbLink(serial, settings)
    status = termux.find_termux(link)
    if status.ready:
        report = run_on_phone(link, options, force_charging=force_charging)
        return PhoneBench(report, True, status.why)
    run_bench = find_runner()
    with phone_rig(link.serial, settings=settings, force_charging=force_charging) as rig:
        outcome = run_bench(device=rig.device, meter=rig.meter, **options)
    found = outcome if isinstance(outcome, dict) else getattr(outcome, "report", None)
    report = dict(found or {})
    report["inference"] = CONTROL_ONLY
    report["control_only"] = True
    report["why_control_only"] = status.why
    return PhoneBench(report, False, status.why)
