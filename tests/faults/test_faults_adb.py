"""Faults on a phone over adb: the fake adb server and fake OnePlus 8 (tests/fakeadb),
injected mid-run while a Governor on the host steers the phone's GPU."""

from __future__ import annotations

import errno
import itertools
from pathlib import Path
from typing import Any

import pytest
from fakeadb import FakePhone, oneplus8, serving
from fakeadb.phone import FakeOSError
from fakesysfs import write
from fault_harness import run

from turboinfer_llama.devices import devfreq as devfreq_mod
from turboinfer_llama.devices import open_device

KGSL = "sys/class/kgsl/kgsl-3d0"
WATCHED = ("max_pwrlevel", "min_pwrlevel")


def levels(phone: FakePhone) -> tuple[str, ...]:
    return tuple((phone.root / KGSL / f).read_text().strip() for f in WATCHED)


class Watch:
    """Logs every value the host writes to the phone's pwrlevels, with the thermal
    level in force then; ``fail`` makes the next such write fail with an errno."""

    def __init__(self, phone: FakePhone) -> None:
        self.phone = phone
        self.over_cap: list[tuple[str, bytes]] = []
        self.ceilings: list[int] = []
        self.fail: int | None = None
        check, put = phone.check_writable, phone.write

        def check_writable(path: str, uid: int) -> None:
            if self.fail is not None and "pwrlevel" in path:
                code, self.fail = self.fail, None
                raise FakeOSError(code)
            check(path, uid)

        def write_(path: str, data: bytes, uid: int, append: bool = False) -> None:
            if path.endswith(("/max_pwrlevel", "/min_pwrlevel")):
                thermal = int((phone.root / KGSL / "thermal_pwrlevel").read_text())
                if int(data) < thermal:
                    self.over_cap.append((path, data))
                if path.endswith("/max_pwrlevel"):
                    self.ceilings.append(int(data))
            put(path, data, uid, append)

        phone.check_writable = check_writable  # type: ignore[method-assign]
        phone.write = write_  # type: ignore[method-assign]


@pytest.fixture
def phone(tmp_path: Path) -> FakePhone:
    return oneplus8(tmp_path / "phone")


def _finish(gpu: Any, watch: Watch, phone: FakePhone, fault, outcome: str) -> None:
    assert not watch.over_cap, f"writes above the thermal cap: {watch.over_cap}"
    gpu.close()
    assert not gpu.errors
    assert levels(phone) == ("0", "6")
    fault.outcome = outcome


WRITE_ERRORS = {
    "EIO on a write": (errno.EIO, "DeviceGone"),
    "EBUSY on a write": (errno.EBUSY, "DeviceError"),
    "EACCES on a write": (errno.EACCES, "PermissionDenied"),
    "ENOENT on a write": (errno.ENOENT, "DeviceNotFound"),
}


@pytest.mark.parametrize("name", list(WRITE_ERRORS))
def test_write_error(tmp_path, monkeypatch, phone, fault, name) -> None:
    code, kind = WRITE_ERRORS[name]
    fault.backend, fault.fault = "adb", name
    watch = Watch(phone)
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            watch.fail = code

        gov = run(gpu, inject)
        h = gov.health()
        assert not h["ok"] and h["error"].startswith(kind + ":")
        assert h["fallback"].startswith("restored default governor")
        assert levels(phone) == ("0", "6")
        _finish(gpu, watch, phone, fault, f"{kind}; handed back to the default governor")


def test_adb_server_killed(tmp_path, monkeypatch, phone, fault) -> None:
    from turboinfer_llama.commands.restore import restore_leftovers

    fault.backend, fault.fault = "adb", "adb server killed"
    watch = Watch(phone)
    with serving(monkeypatch, tmp_path / "state", phone) as srv:
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            srv.stop()

        gov = run(gpu, inject)
        h = gov.health()
        assert not h["ok"] and h["error"].startswith("DeviceGone:")
        assert h["fallback"].startswith("restore failed")
        gpu.close()
        assert gpu.errors and "restore" in gpu.errors[0]
    assert not watch.over_cap
    assert levels(phone) != ("0", "6")  # left pinned, state file kept
    with serving(monkeypatch, tmp_path / "state", phone):
        (result,) = restore_leftovers("adb")
    assert result["ok"], result
    assert levels(phone) == ("0", "6")
    fault.outcome = "DeviceGone; put back by `turboinfer restore` once adb is back"


def test_phone_gpu_vanishes(tmp_path, monkeypatch, phone, fault) -> None:
    fault.backend, fault.fault = "adb", "device vanishes (driver unbound)"
    watch = Watch(phone)
    node = phone.root / KGSL
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            node.rename(node.with_name("kgsl-3d0.unbound"))

        gov = run(gpu, inject)
        h = gov.health()
        assert not h["ok"] and h["error"].startswith("DeviceNotFound:")
        node.with_name("kgsl-3d0.unbound").rename(node)
        _finish(gpu, watch, phone, fault, "DeviceNotFound; restored on close when it came back")


GARBAGE = {
    "counters negative": "   -100   50000",
    "counters wrapped": "4294967295   50000",
    "counters unreadable": "n/a",
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_counter_garbage(tmp_path, monkeypatch, phone, fault, name) -> None:
    fault.backend, fault.fault = "adb", name
    watch = Watch(phone)
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            write(phone.root / KGSL / "gpubusy", GARBAGE[name])

        gov = run(gpu, inject)
        h = gov.health()
        assert not h["ok"] and h["error"].startswith("BadCounters:")
        assert levels(phone) == ("0", "6")
        _finish(gpu, watch, phone, fault, "BadCounters; handed back to the default governor")


def test_clock_goes_backwards(tmp_path, monkeypatch, phone, fault) -> None:
    fault.backend, fault.fault = "adb", "clock goes backwards"
    watch = Watch(phone)
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            back = itertools.count(devfreq_mod.now_ns() - 5_000_000, -1_000_000)
            monkeypatch.setattr(devfreq_mod, "now_ns", lambda: next(back))

        gov = run(gpu, inject)
        h = gov.health()
        assert not h["ok"] and "time went backwards" in h["error"]
        _finish(gpu, watch, phone, fault, "BadCounters (time went backwards); handed back")


def test_thermal_cap_lowered(tmp_path, monkeypatch, phone, fault) -> None:
    fault.backend, fault.fault = "adb", "thermal cap lowered mid-run"
    watch = Watch(phone)
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")

        def inject() -> None:
            fault.inject()
            write(phone.root / KGSL / "thermal_pwrlevel", 3)

        gov = run(gpu, inject)
        assert gov.health()["ok"]
        assert watch.ceilings[-2] == 3  # the compute clock asked for came out capped
        _finish(gpu, watch, phone, fault, "honoured: every later write at or below the cap")
