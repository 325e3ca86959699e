"""A fake adb server and fake phones for the adb tests (only the phone is fake)."""

from .env import serving
from .phone import BatteryModel, FakePhone, fake_module
from .phones import HUAWEI_BATTERY, LINUX_ABI_BATTERY, QUALCOMM_BATTERY, oneplus8, pixel_mali
from .server import FakeAdbServer

__all__ = [
    "HUAWEI_BATTERY",
    "LINUX_ABI_BATTERY",
    "QUALCOMM_BATTERY",
    "BatteryModel",
    "FakeAdbServer",
    "FakePhone",
    "fake_module",
    "oneplus8",
    "pixel_mali",
    "serving",
]
