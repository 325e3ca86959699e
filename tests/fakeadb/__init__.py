"""A fake adb server and fake phones for the adb tests (only the phone is fake)."""

from .phone import BatteryModel, FakePhone, fake_module
from .server import FakeAdbServer

__all__ = ["BatteryModel", "FakeAdbServer", "FakePhone", "fake_module"]
