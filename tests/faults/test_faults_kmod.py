"""Faults on the kernel-module backend: the FIFO fake of /dev/turboinfer from
test_kmod_device.py (ioctls implemented in Python), injected mid-run."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from fault_harness import run
from test_kmod_device import FakeTurboinfer, _err

from turboinfer_llama.devices import kmod

SETTERS = (kmod.TI_SET_FREQ, kmod.TI_SET_RANGE)


class FaultyModule(FakeTurboinfer):
    """The fake module with faults: ``fail_setters`` fails the next clock-setting
    ioctls with an errno (``fail_count`` times); ``t_offset_ns`` turns its clock back;
    ``applied`` logs every clock applied. An fd that is not the device's (a number
    reused by another file) gets ENOTTY, as a real file would."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_setters: int | None = None
        self.fail_count = 0
        self.t_offset_ns = 0
        self.applied: list[tuple[int, int]] = []  # (applied max Hz, cap Hz at the time)

    def _stats(self, st: kmod.TiStats) -> None:
        super()._stats(st)
        st.t_ns -= self.t_offset_ns

    def ioctl(self, fd: int, request: int, arg: object, mutate: bool = True) -> int:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise _err(errno.ENOTTY)
        if request in SETTERS and self.fail_setters is not None and self.fail_count > 0:
            self.fail_count -= 1
            os.fstat(fd)
            raise _err(self.fail_setters)
        rc = super().ioctl(fd, request, arg, mutate)
        if request in SETTERS and self.pin is not None:
            self.applied.append((self.pin[1], self.cap_hz))
        return rc


@pytest.fixture
def module(tmp_path: Path) -> tuple[Any, FaultyModule]:
    fifo = tmp_path / "turboinfer"
    os.mkfifo(fifo)
    fake = FaultyModule()
    return kmod.KmodDevice(str(fifo), ioctl=fake.ioctl), fake


def _finish(dev: Any, fake: FaultyModule, fault, outcome: str) -> None:
    assert all(hz <= cap for hz, cap in fake.applied), "a clock above the cap was applied"
    dev.close()
    assert dev.closed
    fault.outcome = outcome


WRITE_ERRORS = {
    "EIO on a write": (errno.EIO, "DeviceGone"),
    "EBUSY on a write": (errno.EBUSY, "DeviceError"),
    "EACCES on a write": (errno.EACCES, "PermissionDenied"),
    "ENOENT on a write": (errno.ENOENT, "DeviceNotFound"),
}


@pytest.mark.parametrize("name", list(WRITE_ERRORS))
def test_write_error(module, fault, name) -> None:
    dev, fake = module
    code, kind = WRITE_ERRORS[name]
    fault.backend, fault.fault = "kmod", name

    def inject() -> None:
        fault.inject()
        fake.fail_setters, fake.fail_count = code, 1

    gov = run(dev, inject)
    h = gov.health()
    assert not h["ok"] and h["error"].startswith(kind + ":")
    assert h["fallback"].startswith("restored default governor")
    assert fake.pin is None  # our requests released: devfreq's governor rules again
    _finish(dev, fake, fault, f"{kind}; requests released, governor rules")


def test_module_unloaded(module, fault) -> None:
    dev, fake = module
    fault.backend, fault.fault = "kmod", "device vanishes (module unloaded)"

    def inject() -> None:
        fault.inject()
        fake.fail_with = errno.ENODEV

    gov = run(dev, inject)
    h = gov.health()
    assert not h["ok"] and h["error"].startswith("DeviceGone:")
    _finish(dev, fake, fault, "DeviceGone; closing the fd ends our requests")


@pytest.mark.parametrize(
    "name", ["counters negative", "counters wrapped", "counters zero total", "clock goes backwards"]
)
def test_counter_garbage(module, fault, name) -> None:
    dev, fake = module
    fault.backend, fault.fault = "kmod", name

    def inject() -> None:
        fault.inject()
        if name == "counters negative":
            fake.busy_ns = 0  # below the reading at open: a reset
        elif name == "counters wrapped":
            fake.busy_ns = 2**64 - 1
        elif name == "counters zero total":
            fake.total_ns = 0
        else:
            fake.t_offset_ns = 10**9  # the module's clock jumps back by 1 s

    gov = run(dev, inject)
    h = gov.health()
    assert not h["ok"] and h["error"].startswith("BadCounters:")
    assert fake.pin is None
    assert all(0 <= c.busy_ns <= c.total_ns for c in gov.controller.counters)
    _finish(dev, fake, fault, "BadCounters; requests released, governor rules")


def test_thermal_cap_lowered(module, fault) -> None:
    dev, fake = module
    fault.backend, fault.fault = "kmod", "thermal cap lowered mid-run"

    def inject() -> None:
        fault.inject()
        fake.cooling_state = 3  # our cooling device: 490 MHz and below

    gov = run(dev, inject)
    assert gov.health()["ok"]
    assert fake.applied[-2] == (490_000_000, 490_000_000)  # the compute clock, capped
    _finish(dev, fake, fault, "honoured by the module: applied clock at the cap")


def test_fd_closed_under_us(module, fault, tmp_path) -> None:
    dev, fake = module
    fault.backend, fault.fault = "kmod", "module fd closed under us"
    stranger: list[int] = []

    def inject() -> None:
        fault.inject()
        os.close(dev._fd)  # other code in the process closes our fd ...
        stranger.append(os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT))  # ... reused

    gov = run(dev, inject)
    h = gov.health()
    assert not h["ok"] and "closed under us" in h["error"]
    _finish(dev, fake, fault, "DeviceGone; the kernel dropped our requests with the fd")
    os.fstat(stranger[0])  # we did not close the stranger's file
    os.close(stranger[0])
