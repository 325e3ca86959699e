"""Fake sysfs trees under a tmp dir, laid out like the real devices.

Plain functions so other tests (the adb fake phone) can reuse them. Each returns a dict
of the interesting paths (``pathlib.Path`` under ``root``). The files hold what the
real kernel prints; they do not emulate the kernel's reactions to writes.
"""

from __future__ import annotations

import os
from pathlib import Path

# OnePlus 8 (Adreno 650) table, kona-v2-gpu.dtsi via BRIEF.md; KGSL lists it fastest first.
ONEPLUS8_GPU_HZ = [670000000, 587000000, 525000000, 490000000, 441600000, 400000000, 305000000]
# Jetson AGX Orin ga10b devfreq table (JetPack 5).
ORIN_GPU_HZ = [
    306000000,
    408000000,
    510000000,
    612000000,
    714000000,
    816000000,
    918000000,
    1020000000,
    1122000000,
    1224000000,
    1300500000,
]
# Exynos 9820 Mali-G76 MP12: 702 MHz top, 12 levels (the lower ones are assumed).
EXYNOS_MALI_HZ = [
    100000000,
    156000000,
    200000000,
    260000000,
    325000000,
    377000000,
    433000000,
    488000000,
    546000000,
    598000000,
    650000000,
    702000000,
]


def write(path: Path, value: object) -> Path:
    """Create or overwrite one attribute file (sysfs files end with a newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")
    return path


def _tree(base: Path, files: dict[str, object]) -> None:
    for name, value in files.items():
        write(base / name, value)


def _devfreq_node(
    root: Path, name: str, levels_hz: list[int], governor: str, governors: str, cur_hz: int
) -> Path:
    node = root / "sys/class/devfreq" / name
    _tree(
        node,
        {
            "available_frequencies": " ".join(str(h) for h in levels_hz),
            "available_governors": governors,
            "cur_freq": cur_hz,
            "target_freq": cur_hz,
            "min_freq": min(levels_hz),
            "max_freq": max(levels_hz),
            "governor": governor,
            "polling_interval": 0,
            "trans_stat": "     From  :   To\n   total transitions: 0",
        },
    )
    return node


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def make_oneplus8_kgsl(root: Path | str) -> dict[str, Path]:
    """/sys/class/kgsl/kgsl-3d0 of a OnePlus 8 at its boot level (305 MHz), governor
    msm-adreno-tz, no thermal cap; its devfreq node is ``3d00000.qcom,kgsl-3d0``.
    Keys: root, kgsl, devfreq."""
    root = Path(root)
    kgsl = root / "sys/class/kgsl/kgsl-3d0"
    n = len(ONEPLUS8_GPU_HZ)
    _tree(
        kgsl,
        {
            "gpu_available_frequencies": " ".join(str(h) for h in ONEPLUS8_GPU_HZ),
            "gpuclk": 305000000,
            "max_gpuclk": ONEPLUS8_GPU_HZ[0],
            "gpubusy": f"{12500:7d} {50000:7d}",
            "gpu_busy_percentage": "25 %",
            "max_pwrlevel": 0,
            "min_pwrlevel": n - 1,
            "thermal_pwrlevel": 0,
            "default_pwrlevel": n - 1,
            "num_pwrlevels": n,
            "clock_mhz": 305,
            "freq_table_mhz": " ".join(str(h // 1_000_000) for h in ONEPLUS8_GPU_HZ),
            "pwrscale": 1,
            "idle_timer": 58,
            "gpu_model": "Adreno650v2",
        },
    )
    devfreq = _devfreq_node(
        root,
        "3d00000.qcom,kgsl-3d0",
        ONEPLUS8_GPU_HZ,
        "msm-adreno-tz",
        "msm-adreno-tz performance powersave userspace",
        305000000,
    )
    _link(kgsl / "devfreq", devfreq)
    return {"root": root, "kgsl": kgsl, "devfreq": devfreq}


def make_exynos_mali(root: Path | str) -> dict[str, Path]:
    """devfreq node of an Exynos 9820 Mali-G76 (``18500000.mali``) whose platform device
    exposes ``utilization`` (percent). Keys: root, devfreq, device, utilization."""
    root = Path(root)
    device = root / "sys/devices/platform/18500000.mali"
    write(device / "utilization", 40)
    devfreq = _devfreq_node(
        root,
        "18500000.mali",
        EXYNOS_MALI_HZ,
        "simple_ondemand",
        "simple_ondemand performance powersave userspace",
        260000000,
    )
    _link(devfreq / "device", device)
    return {
        "root": root,
        "devfreq": devfreq,
        "device": device,
        "utilization": device / "utilization",
    }


def make_jetson_orin(root: Path | str, *, governor: str = "nvhost_podgov") -> dict[str, Path]:
    """Jetson AGX Orin GPU devfreq node ``/sys/class/devfreq/17000000.ga10b`` with the
    per-mille ``load`` on its platform device. With ``governor="userspace"`` the
    ``userspace/set_freq`` file exists. Keys: root, devfreq, device, load."""
    root = Path(root)
    device = root / "sys/devices/platform/17000000.ga10b"
    write(device / "load", 350)
    devfreq = _devfreq_node(
        root,
        "17000000.ga10b",
        ORIN_GPU_HZ,
        governor,
        "wmark_active nvhost_podgov userspace performance simple_ondemand",
        ORIN_GPU_HZ[-1],
    )
    if governor == "userspace":
        write(devfreq / "userspace/set_freq", ORIN_GPU_HZ[-1])
    _link(devfreq / "device", device)
    return {"root": root, "devfreq": devfreq, "device": device, "load": device / "load"}


def make_battery(
    root: Path | str,
    *,
    current_now: int = -450000,
    voltage_now: int = 3850000,
    name: str = "battery",
    status: str = "Discharging",
) -> dict[str, Path]:
    """/sys/class/power_supply/<name>. Defaults follow the Linux ABI (uA and uV,
    negative current while discharging); pass other signs/units to mimic vendors.
    Keys: root, supply, current_now, voltage_now."""
    root = Path(root)
    supply = root / "sys/class/power_supply" / name
    _tree(
        supply,
        {
            "type": "Battery",
            "status": status,
            "present": 1,
            "capacity": 80,
            "current_now": current_now,
            "voltage_now": voltage_now,
        },
    )
    return {
        "root": root,
        "supply": supply,
        "current_now": supply / "current_now",
        "voltage_now": supply / "voltage_now",
    }


def make_rapl(
    root: Path | str, *, energy_uj: int = 1_000_000, max_uj: int = 262143328850
) -> dict[str, Path]:
    """/sys/class/powercap/intel-rapl:0 (package domain). Keys: root, zone, energy_uj."""
    root = Path(root)
    zone = root / "sys/class/powercap/intel-rapl:0"
    _tree(zone, {"name": "package-0", "energy_uj": energy_uj, "max_energy_range_uj": max_uj})
    return {"root": root, "zone": zone, "energy_uj": zone / "energy_uj"}
