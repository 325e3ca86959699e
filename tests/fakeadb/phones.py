"""Ready-made fake phones on the fake sysfs trees of ``tests/fakesysfs.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakesysfs import make_exynos_mali, make_oneplus8_kgsl

from .phone import BatteryModel, FakePhone

QUALCOMM_BATTERY = {"sign": 1, "current_unit": "uA", "voltage_unit": "uV"}
LINUX_ABI_BATTERY = {"sign": -1, "current_unit": "uA", "voltage_unit": "uV"}
HUAWEI_BATTERY = {"sign": -1, "current_unit": "mA", "voltage_unit": "mV"}


def oneplus8(
    root: Path, serial: str = "8a3f1c2e", battery: dict[str, Any] | None = None, **kw: Any
) -> FakePhone:
    """OnePlus 8 (Snapdragon 865, Adreno 650, KGSL), Qualcomm fuel gauge by default."""
    make_oneplus8_kgsl(root)
    props = {
        "ro.product.manufacturer": "OnePlus",
        "ro.product.model": "IN2013",
        "ro.product.name": "OnePlus8_EEA",
        "ro.product.device": "OnePlus8",
        "ro.board.platform": "kona",
        "ro.soc.manufacturer": "QTI",
        "ro.soc.model": "SM8250",
        "ro.hardware": "qcom",
        "ro.build.version.release": "11",
    }
    kw.setdefault("kernel_release", "4.19.157-perf+")
    return FakePhone(
        serial,
        root,
        props=props,
        battery=BatteryModel(**(battery or QUALCOMM_BATTERY)),
        gpu_freq_path="/sys/class/kgsl/kgsl-3d0/gpuclk",
        **kw,
    )


def pixel_mali(
    root: Path, serial: str = "1A2B3C4D5E", battery: dict[str, Any] | None = None, **kw: Any
) -> FakePhone:
    """A Pixel whose GPU is a Mali behind devfreq. The tree is fakesysfs's Exynos
    Mali-G76 node (``18500000.mali``); a real Pixel 6's Mali-G78 has another table, so
    only the code path, not the figures, stands for a Pixel."""
    make_exynos_mali(root)
    props = {
        "ro.product.manufacturer": "Google",
        "ro.product.model": "Pixel 6",
        "ro.product.name": "oriole",
        "ro.product.device": "oriole",
        "ro.board.platform": "gs101",
        "ro.soc.manufacturer": "Google",
        "ro.soc.model": "GS101",
        "ro.hardware": "oriole",
        "ro.build.version.release": "13",
    }
    kw.setdefault("kernel_release", "5.10.157-android13-4-00001-g5c6f2f7b5c1e-ab9652817")
    return FakePhone(
        serial,
        root,
        props=props,
        battery=BatteryModel(**(battery or LINUX_ABI_BATTERY)),
        gpu_freq_path="/sys/class/devfreq/18500000.mali/cur_freq",
        **kw,
    )
