"""What a phone exposes: model, SoC, GPU path and table, governor, thermal cap, root,
kernel, whether a module can load, and the battery with its sign/unit convention."""

from __future__ import annotations

import logging
from typing import Any

from ..devices.adb import open_adb_gpu, thermal_cap_hz
from ..devices.adb_link import AdbLink
from ..devices.adb_settings import AdbSettings
from ..devices.base import DeviceError
from . import fuelgauge

log = logging.getLogger(__name__)


def _props(link: AdbLink) -> dict[str, str]:
    names = (
        "ro.product.manufacturer",
        "ro.product.model",
        "ro.product.device",
        "ro.soc.manufacturer",
        "ro.soc.model",
        "ro.board.platform",
        "ro.hardware",
        "ro.build.version.release",
    )
    r = link.run("; ".join(f"getprop {n}" for n in names))
    values = r.out.split("\n")
    return {n: (values[i].strip() if i < len(values) else "") for i, n in enumerate(names)}


def module_support(link: AdbLink) -> tuple[bool, str]:
    """Can a kernel module be loaded here? (root, CONFIG_MODULES, modules_disabled)."""
    access = link.root_access()
    if not access.rooted:
        return False, f"no: {access.detail} (insmod needs root)"
    if not link.run("[ -e /proc/modules ]").ok:
        return False, "no: the kernel was built without module support (no /proc/modules)"
    if link.run("cat /proc/sys/kernel/modules_disabled").out.strip() == "1":
        return False, "no: /proc/sys/kernel/modules_disabled is 1 (until reboot)"
    selinux = link.run("getenforce").out.strip() or "unknown"
    note = "; SELinux may still deny module_load" if selinux == "Enforcing" else ""
    return True, f"yes: root and module support present (SELinux {selinux}{note})"


def battery(link: AdbLink, settings: AdbSettings, calibrate: bool) -> dict[str, Any]:
    try:
        files = fuelgauge.battery_files(link)
    except DeviceError as e:
        return {"error": str(e)}
    r = link.run("cat " + " ".join(files[n] for n in ("current_now", "voltage_now", "status")))
    current, voltage, status = [*r.out.split("\n"), "", "", ""][:3]
    out: dict[str, Any] = {
        "current_now": current.strip(),
        "voltage_now": voltage.strip(),
        "status": status.strip(),
    }
    record = fuelgauge.load_calibration(link.serial, settings)
    if record is not None:
        out["convention"] = record.describe() + " [saved]"
    elif calibrate:
        try:
            record = fuelgauge.calibrate(link, settings=settings)
            out["convention"] = record.describe() + " [calibrated now, saved]"
        except DeviceError as e:
            out["convention"] = f"not calibrated: {e}"
    else:
        out["convention"] = "not calibrated (run without --no-calibrate)"
    if status.strip() in fuelgauge.CHARGING_STATES:
        out["warning"] = fuelgauge.CHARGING_ADVICE
    return out


def probe(
    serial: str | None = None, *, settings: AdbSettings | None = None, calibrate: bool = True
) -> dict[str, Any]:
    settings = settings or AdbSettings()
    link = AdbLink(serial, settings)
    props = _props(link)
    access = link.root_access()
    info: dict[str, Any] = {
        "serial": link.serial,
        "model": f"{props['ro.product.manufacturer']} {props['ro.product.model']}".strip(),
        "soc": " ".join(v for v in (props["ro.soc.manufacturer"], props["ro.soc.model"]) if v)
        or props["ro.board.platform"]
        or props["ro.hardware"],
        "android": props["ro.build.version.release"],
        "kernel": link.run("uname -r").out.strip(),
        "root": access.detail,
    }
    can_load, why = module_support(link)
    info["module_loadable"] = can_load
    info["module"] = why
    info["turboinfer_loaded"] = link.run("[ -e /dev/turboinfer ]").ok
    try:
        gpu = open_adb_gpu(link.serial, settings)
    except DeviceError as e:
        info["gpu"] = {"error": str(e)}
    else:
        try:
            caps = gpu.capabilities
            info["gpu"] = {
                "path": "KGSL" if gpu.inner.name.startswith("kgsl") else "devfreq",
                "name": gpu.inner.name,
                "frequencies_hz": gpu.frequencies_hz(),
                "current_hz": gpu.current_hz(),
                "governor": gpu.governor,
                "thermal_cap_hz": thermal_cap_hz(gpu.inner),
                "can_set": caps.can_set,
                "actuation_round_trip_ms": caps.switch_latency_ns / 1e6,
                "actuation_source": caps.switch_latency_source,
            }
        finally:
            gpu.close()
        if gpu.errors:
            info["gpu"]["errors"] = gpu.errors
    info["battery"] = battery(link, settings, calibrate)
    return info


def format_probe(info: dict[str, Any]) -> str:
    lines = [
        f"phone {info['serial']}: {info['model']} (SoC {info['soc']}, Android {info['android']})",
        f"  kernel           {info['kernel']}",
        f"  root             {info['root']}",
        f"  kernel module    {info['module']}"
        + ("; /dev/turboinfer present" if info["turboinfer_loaded"] else ""),
    ]
    gpu = info["gpu"]
    if "error" in gpu:
        lines.append(f"  GPU              error: {gpu['error']}")
    else:
        mhz = ", ".join(f"{h / 1e6:g}" for h in gpu["frequencies_hz"])
        lines += [
            f"  GPU path         {gpu['path']} ({gpu['name']})",
            f"  frequencies      {mhz} MHz",
            f"  current          {gpu['current_hz'] / 1e6:g} MHz, governor {gpu['governor']}",
            f"  thermal cap      {gpu['thermal_cap_hz'] / 1e6:g} MHz",
            f"  can set clock    {'yes' if gpu['can_set'] else 'no (needs root)'}",
            f"  actuation        {gpu['actuation_round_trip_ms']:.2f} ms "
            f"({gpu['actuation_source']})",
        ]
    bat = info["battery"]
    if "error" in bat:
        lines.append(f"  battery          error: {bat['error']}")
    else:
        lines += [
            f"  battery          current_now={bat['current_now']} "
            f"voltage_now={bat['voltage_now']} status={bat['status']}",
            f"  convention       {bat['convention']}",
        ]
        if "warning" in bat:
            lines.append(f"  WARNING          {bat['warning']}")
    return "\n".join(lines)
