"""Faults on the sysfs backends (devfreq on a fake Jetson Orin, KGSL on a fake OnePlus 8),
injected mid-run while a Governor steers them."""

from __future__ import annotations

import errno
import itertools
from pathlib import Path
from typing import Any

import pytest
from fakesysfs import make_jetson_orin, make_oneplus8_kgsl, write
from fault_harness import FaultySysfs, run

from turboinfer_llama.devices import devfreq as devfreq_mod
from turboinfer_llama.devices.devfreq import DevfreqGpu
from turboinfer_llama.devices.kgsl import KGSL_DIR, KgslGpu
from turboinfer_llama.engine.events import EventKind

ORIN = "/sys/class/devfreq/17000000.ga10b"
WRITE_ERRORS = {
    "EIO on a write": (errno.EIO, "DeviceGone"),
    "EBUSY on a write": (errno.EBUSY, "DeviceError"),
    "EACCES on a write": (errno.EACCES, "PermissionDenied"),
    "ENOENT on a write": (errno.ENOENT, "DeviceNotFound"),
}


class Rig:
    """One backend on a fake tree: the files to watch and how to inject each fault."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self.cap = [0]
        if backend == "devfreq":
            self.paths = make_jetson_orin(tmp_path)
            self.node = self.paths["devfreq"]
            self.cap[0] = 1300500000
            self.io = FaultySysfs(tmp_path, self._devfreq_cap_ok)
            self.gpu: Any = DevfreqGpu(self.io, ORIN)
            self.busy_file = self.paths["load"]
            self.watched = ("governor", "min_freq", "max_freq")
            self.write_match = "_freq"
        else:
            self.paths = make_oneplus8_kgsl(tmp_path)
            self.node = self.paths["kgsl"]
            self.io = FaultySysfs(tmp_path, self._kgsl_cap_ok)
            self.gpu = KgslGpu(self.io, KGSL_DIR)
            self.busy_file = self.node / "gpubusy"
            self.watched = ("max_pwrlevel", "min_pwrlevel", "devfreq/governor")
            self.write_match = "pwrlevel"
        self.initial = self.tree()

    def tree(self) -> tuple[str, ...]:
        return tuple((self.node / f).read_text().strip() for f in self.watched)

    def _devfreq_cap_ok(self, path: str, value: str) -> bool:
        return not path.endswith(("/min_freq", "/max_freq")) or int(value) <= self.cap[0]

    def _kgsl_cap_ok(self, path: str, value: str) -> bool:
        if not path.endswith(("/max_pwrlevel", "/min_pwrlevel")):
            return True
        thermal = int((self.node / "thermal_pwrlevel").read_text())
        return int(value) >= thermal  # level 0 is the fastest

    def lower_thermal_cap(self) -> None:
        if self.backend == "devfreq":
            self.cap[0] = 612000000
            write(self.node / "max_freq", self.cap[0])  # the thermal daemon's ceiling
        else:
            write(self.node / "thermal_pwrlevel", 3)  # 490 MHz and below

    def vanish(self) -> Path:
        gone = self.node.with_name(self.node.name + ".unbound")
        self.node.rename(gone)
        return gone

    def health(self, gov: Any) -> dict[str, Any]:
        h = gov.health()
        assert h["device_health"] is not None
        return h


BACKENDS = ("devfreq", "kgsl")


@pytest.fixture(params=BACKENDS)
def rig(request, tmp_path) -> Rig:
    return Rig(request.param, tmp_path)


def _finish(rig: Rig, fault, outcome: str) -> None:
    assert not rig.io.over_cap, f"writes above the thermal cap: {rig.io.over_cap}"
    rig.gpu.close()
    assert rig.tree() == rig.initial
    assert (
        not rig.gpu.ownership_health().get("state_file")
        or not Path(rig.gpu.ownership_health()["state_file"]).exists()
    )
    fault.outcome = outcome


@pytest.mark.parametrize("name", list(WRITE_ERRORS))
def test_write_error(rig, fault, name) -> None:
    code, kind = WRITE_ERRORS[name]
    fault.backend, fault.fault = rig.backend, name

    def inject() -> None:
        fault.inject()
        rig.io.fail_errno, rig.io.fail_match = code, rig.write_match
        # one failing write, then the file works again (a transient fault)
        original = rig.io.write

        def once(path: str, value: str) -> None:
            try:
                original(path, value)
            finally:
                if rig.io.failures:
                    rig.io.fail_errno = None

        rig.io.write = once  # type: ignore[method-assign]

    gov = run(rig.gpu, inject)
    h = rig.health(gov)
    assert not h["ok"] and h["error"].startswith(kind + ":")
    assert h["fallback"].startswith("restored default governor")
    assert rig.tree() == rig.initial  # handed back at once
    _finish(rig, fault, f"{kind}; handed back to the default governor")


def test_persistent_write_error(rig, fault) -> None:
    """The write keeps failing: the hand-back fails too, the state file stays, and
    the close after the fault clears puts the GPU back."""
    fault.backend, fault.fault = rig.backend, "EIO on every write (persistent)"

    def inject() -> None:
        fault.inject()
        rig.io.fail_errno, rig.io.fail_match = errno.EIO, rig.write_match

    gov = run(rig.gpu, inject)
    h = rig.health(gov)
    assert not h["ok"] and h["fallback"].startswith("restore failed")
    assert Path(h["device_health"]["state_file"]).exists()  # for `turboinfer restore`
    rig.io.fail_errno = None
    _finish(rig, fault, "DeviceGone; restored on close once writes work again")


def test_device_vanishes(rig, fault) -> None:
    fault.backend, fault.fault = rig.backend, "device vanishes (driver unbound)"
    moved: list[Path] = []

    def inject() -> None:
        fault.inject()
        moved.append(rig.vanish())

    gov = run(rig.gpu, inject)
    h = rig.health(gov)
    assert not h["ok"] and "DeviceNotFound" in h["error"]
    assert h["fallback"].startswith("restore failed")
    moved[0].rename(rig.node)  # it comes back (rebind)
    _finish(rig, fault, "DeviceNotFound; restored on close when it came back")


GARBAGE = {
    "devfreq": {
        "counters negative": "-50",
        "counters wrapped": "4294967295",
        "counters unreadable": "n/a",
    },
    "kgsl": {
        "counters negative": "   -100   50000",
        "counters wrapped": "4294967295   50000",
        "counters unreadable": "n/a",
    },
}


@pytest.mark.parametrize("name", ["counters negative", "counters wrapped", "counters unreadable"])
def test_counter_garbage(rig, fault, name) -> None:
    fault.backend, fault.fault = rig.backend, name

    def inject() -> None:
        fault.inject()
        write(rig.busy_file, GARBAGE[rig.backend][name])

    gov = run(rig.gpu, inject)
    h = rig.health(gov)
    assert not h["ok"] and h["error"].startswith("BadCounters:")
    assert h["fallback"].startswith("restored default governor")
    assert rig.tree() == rig.initial
    assert all(0 <= c.busy_ns <= c.total_ns for c in gov.controller.counters)
    _finish(rig, fault, "BadCounters; handed back to the default governor")


def test_kgsl_zero_total_is_an_idle_window(tmp_path, fault) -> None:
    """KGSL prints "0 0" for a window with no samples (the GPU slept): not an error."""
    rig = Rig("kgsl", tmp_path)
    fault.backend, fault.fault = "kgsl", "counters zero total"

    def inject() -> None:
        fault.inject()
        write(rig.busy_file, "      0       0")

    gov = run(rig.gpu, inject)
    assert gov.health()["ok"]
    after = gov.controller.counters[-3:]
    assert after[-1].busy_ns == after[0].busy_ns  # idle: no busy time credited
    _finish(rig, fault, "read as an idle window (no error); steering went on")


def test_clock_goes_backwards(rig, fault, monkeypatch) -> None:
    fault.backend, fault.fault = rig.backend, "clock goes backwards"

    def inject() -> None:
        fault.inject()
        back = itertools.count(devfreq_mod.now_ns() - 5_000_000, -1_000_000)
        monkeypatch.setattr(devfreq_mod, "now_ns", lambda: next(back))

    gov = run(rig.gpu, inject)
    h = rig.health(gov)
    assert not h["ok"] and "time went backwards" in h["error"]
    assert rig.tree() == rig.initial
    _finish(rig, fault, "BadCounters (time went backwards); handed back")


def test_thermal_cap_lowered(rig, fault) -> None:
    fault.backend, fault.fault = rig.backend, "thermal cap lowered mid-run"

    def inject() -> None:
        fault.inject()
        rig.lower_thermal_cap()

    # while the graph runs at the top clock: the daemon's ceiling is below our pin
    gov = run(rig.gpu, inject, at=EventKind.NODE_ASK)
    h = rig.health(gov)
    assert h["ok"]  # not an error: we keep steering below the new cap
    if rig.backend == "devfreq":  # the daemon wrote max_freq: seen as a foreign write
        assert h["device_health"]["foreign_writes"] >= 1
    assert not rig.io.over_cap
    ceilings = [int(v) for p, v in rig.io.writes if p.endswith(("max_freq", "max_pwrlevel"))]
    # the last compute clock asked for (top of the table) came out as the cap itself
    assert ceilings[-2] == (612000000 if rig.backend == "devfreq" else 3)
    _finish(rig, fault, "honoured: every later write at or below the cap")
