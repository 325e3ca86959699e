"""Adreno through KGSL: ``/sys/class/kgsl/kgsl-3d0`` plus the perfcounter ioctls.

The clock is pinned with ``max_pwrlevel``/``min_pwrlevel`` (level 0 is the fastest),
which holds under msm-adreno-tz. We never pick a level faster than the thermal caps
others set: ``thermal_pwrlevel`` and ``max_gpuclk``. Busy time comes from ``gpubusy``;
instructions from the SP perfcounter through ``/dev/kgsl-3d0`` (local devices only: an
ioctl cannot travel over adb). Sysfs goes through ``SysfsIO`` so adb reuses this class.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import logging
import os
from pathlib import Path

from .base import (
    Capabilities,
    CounterCheck,
    Counters,
    DeviceError,
    DeviceNotFound,
    DeviceState,
    InvalidFrequency,
    Unsupported,
    snap_hz,
)
from .devfreq import BusyIntegrator, kgsl_gpubusy_fraction, parse_busy
from .lifecycle import GuardedBackend
from .native import NativeActuator, SysfsPairActuator, level_index
from .owner import Ownership, local_ownership, take
from .sysfs_io import LocalSysfs, SysfsIO, translate_os_error

log = logging.getLogger(__name__)

KGSL_DIR = "/sys/class/kgsl/kgsl-3d0"
KGSL_DEV = "/dev/kgsl-3d0"
SWITCH_LATENCY_ASSUMED_NS = 500_000
SWITCH_LATENCY_NOTE = (
    "assumption: a pwrlevel write makes KGSL change level in its own context (GMU DCVS "
    "vote and PLL relock), sub-millisecond; not measured"
)

# ---- perfcounter ioctls (uapi msm_kgsl.h) ----------------------------------------

KGSL_IOC_TYPE = 0x09
KGSL_PERFCOUNTER_GROUP_SP = 0x0A
KGSL_PERFCOUNTER_GROUP_ALWAYSON = 0x1B
# A6xx SP countable 40: full-precision ALU instructions in the fragment stage. Whether
# OpenCL compute work counts there has not been verified (BRIEF.md).
A6XX_SP_ALU_FULL_INSTRUCTIONS = 40
ALWAYSON_COUNTABLE = 0

_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, size: int) -> int:
    """Linux _IOC encoding (asm-generic: arm64 and x86 alike)."""
    return (direction << 30) | (size << 16) | (KGSL_IOC_TYPE << 8) | nr


class PerfcounterGet(ctypes.Structure):
    _fields_ = [
        ("groupid", ctypes.c_uint32),
        ("countable", ctypes.c_uint32),
        ("offset", ctypes.c_uint32),
        ("offset_hi", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class PerfcounterPut(ctypes.Structure):
    _fields_ = [
        ("groupid", ctypes.c_uint32),
        ("countable", ctypes.c_uint32),
        ("pad", ctypes.c_uint32 * 2),
    ]


class PerfcounterQuery(ctypes.Structure):
    _fields_ = [
        ("groupid", ctypes.c_uint32),
        ("countables", ctypes.c_uint64),  # unsigned int __user *
        ("count", ctypes.c_uint32),
        ("max_counters", ctypes.c_uint32),
        ("pad", ctypes.c_uint32 * 2),
    ]


class PerfcounterReadGroup(ctypes.Structure):
    _fields_ = [
        ("groupid", ctypes.c_uint32),
        ("countable", ctypes.c_uint32),
        ("value", ctypes.c_uint64),
    ]


class PerfcounterRead(ctypes.Structure):
    _fields_ = [
        ("reads", ctypes.c_uint64),  # struct kgsl_perfcounter_read_group __user *
        ("count", ctypes.c_uint32),
        ("pad", ctypes.c_uint32 * 2),
    ]


IOCTL_PERFCOUNTER_GET = _ioc(_IOC_READ | _IOC_WRITE, 0x38, ctypes.sizeof(PerfcounterGet))
IOCTL_PERFCOUNTER_PUT = _ioc(_IOC_WRITE, 0x39, ctypes.sizeof(PerfcounterPut))
IOCTL_PERFCOUNTER_QUERY = _ioc(_IOC_READ | _IOC_WRITE, 0x3A, ctypes.sizeof(PerfcounterQuery))
IOCTL_PERFCOUNTER_READ = _ioc(_IOC_READ | _IOC_WRITE, 0x3B, ctypes.sizeof(PerfcounterRead))


class PerfCounters:
    """Reserves SP ALU-instruction and always-on counters on ``/dev/kgsl-3d0`` and reads
    them. ``close()`` gives them back."""

    COUNTERS = (
        (KGSL_PERFCOUNTER_GROUP_SP, A6XX_SP_ALU_FULL_INSTRUCTIONS),
        (KGSL_PERFCOUNTER_GROUP_ALWAYSON, ALWAYSON_COUNTABLE),
    )

    def __init__(self, dev_path: str) -> None:
        self.dev_path = dev_path
        try:
            self._fd = os.open(dev_path, os.O_RDWR)
        except OSError as e:
            raise translate_os_error(e, dev_path, "open") from e
        self._held: list[tuple[int, int]] = []
        try:
            for group, countable in self.COUNTERS:
                req = PerfcounterGet(groupid=group, countable=countable)
                self._ioctl(IOCTL_PERFCOUNTER_GET, req, "reserve a perfcounter")
                self._held.append((group, countable))
        except DeviceError:
            self.close()
            raise

    def _ioctl(self, request: int, arg: ctypes.Structure, action: str) -> None:
        try:
            fcntl.ioctl(self._fd, request, arg, True)
        except OSError as e:
            raise translate_os_error(e, self.dev_path, action) from e

    def read(self) -> tuple[int, int]:
        """(SP ALU instructions, always-on cycles), both cumulative."""
        groups = (PerfcounterReadGroup * len(self.COUNTERS))(
            *(PerfcounterReadGroup(groupid=g, countable=c) for g, c in self.COUNTERS)
        )
        req = PerfcounterRead(reads=ctypes.addressof(groups), count=len(self.COUNTERS))
        self._ioctl(IOCTL_PERFCOUNTER_READ, req, "read perfcounters")
        return int(groups[0].value), int(groups[1].value)

    def close(self) -> None:
        if self._fd < 0:
            return
        for group, countable in self._held:
            try:
                self._ioctl(IOCTL_PERFCOUNTER_PUT, PerfcounterPut(group, countable), "release")
            except DeviceError as e:
                log.debug("perfcounter release failed: %s", e)
        self._held.clear()
        os.close(self._fd)
        self._fd = -1


# ---- the backend -----------------------------------------------------------------


class KgslGpu(GuardedBackend):
    """Adreno GPU via KGSL sysfs (``base``) and, when given, the perfcounter device."""

    def __init__(
        self,
        io: SysfsIO,
        base: str = KGSL_DIR,
        perf: PerfCounters | None = None,
        *,
        own: bool | None = None,
    ) -> None:
        """``own``: take the GPU (lock, state file, guardian; default: on a local
        tree). False reads and restores without owning (``probe``, ``restore``)."""
        self.io = io
        self.base = base.rstrip("/")
        if not io.exists(self._f("gpu_available_frequencies")):
            raise DeviceNotFound(f"no KGSL GPU at {self.base} ({io.describe()})")
        self.name = "kgsl:" + Path(self.base).name
        levels = sorted({int(t) for t in io.read(self._f("gpu_available_frequencies")).split()})
        if not levels:
            raise Unsupported(f"{self.base}/gpu_available_frequencies lists no frequencies")
        self._levels = levels
        # KGSL numbers power levels from the fastest: level 0 = highest clock.
        self._by_level = sorted(levels, reverse=True)
        self._perf = perf
        gpubusy = self._f("gpubusy")
        self._busy = (
            BusyIntegrator(lambda: parse_busy(gpubusy, io.read(gpubusy), kgsl_gpubusy_fraction))
            if io.exists(gpubusy)
            else None
        )
        self._counter_check = CounterCheck(self.name)
        # Read back around our writes to see foreign ones (local trees: cheap). Turn
        # off while something else of ours writes the same files (a native executor).
        self.read_back = isinstance(io, LocalSysfs)
        self._written: tuple[int, int] = (0, len(levels) - 1)
        ownership = self._take_ownership(own)
        try:
            self.rebase()
        except BaseException:
            if ownership is not None:
                ownership.release(restored=True)
            raise
        self.capabilities = Capabilities(
            can_set=io.writable(self._f("min_pwrlevel")) and io.writable(self._f("max_pwrlevel")),
            has_pmu=perf is not None,
            simulated=False,
            switch_latency_ns=SWITCH_LATENCY_ASSUMED_NS,
            switch_latency_source=SWITCH_LATENCY_NOTE,
        )
        if ownership is not None:
            ownership.hold(self._initial)
        self._install_guard(self._close_now, ownership)

    def _take_ownership(self, own: bool | None) -> Ownership | None:
        """Lock the GPU and put back what a dead owner left, before our snapshot.
        The lock is named after KGSL's devfreq node, so ``devfreq`` on the same GPU
        takes the same lock."""
        if own is False or not isinstance(self.io, LocalSysfs):
            return None
        if not (
            self.io.writable(self._f("min_pwrlevel")) and self.io.writable(self._f("max_pwrlevel"))
        ):
            return None  # read-only: we cannot pin it, so there is nothing to guard
        node = self._f("devfreq") if self.io.exists(self._f("devfreq")) else self.base
        ownership = local_ownership(
            "kgsl", self.name, str(self.io.root), self.base, self.io.real_path(node)
        )
        return take(ownership, self.restore)

    def rebase(self) -> None:
        """Take the state now as the one to put back on close (at open, and after the
        caller put back a state that a dead owner left)."""
        self._initial = self.snapshot()
        self._written = (
            self._initial.extra["max_pwrlevel"],
            self._initial.extra["min_pwrlevel"],
        )

    def health(self) -> dict[str, object]:
        """Foreign writes seen, lock, state file and guardian (for stats())."""
        return {**self.foreign_write_health(), **self.ownership_health()}

    def _f(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _read_int(self, path: str) -> int:
        text = self.io.read(path)
        try:
            return int(text.split()[0])
        except (ValueError, IndexError) as e:
            raise DeviceError(f"{path}: unexpected contents {text!r}") from e

    def _table(self) -> str:
        return "levels: " + ", ".join(f"{h / 1e6:g} MHz" for h in self._levels)

    def level_of(self, hz: int) -> int:
        return self._by_level.index(snap_hz(self._levels, hz))

    def hz_of(self, level: int) -> int:
        return self._by_level[min(max(level, 0), len(self._by_level) - 1)]

    # ---- GpuDevice ---------------------------------------------------------------

    def frequencies_hz(self) -> list[int]:
        return list(self._levels)

    def current_hz(self) -> int:
        return self._read_int(self._f("gpuclk"))

    @property
    def governor(self) -> str | None:
        path = self._f("devfreq/governor")
        return self.io.read(path) if self.io.exists(path) else None

    def thermal_cap_hz(self) -> int:
        """The fastest clock the thermal framework allows now."""
        cap = self._levels[-1]
        if self.io.exists(self._f("thermal_pwrlevel")):
            cap = min(cap, self.hz_of(self._read_int(self._f("thermal_pwrlevel"))))
        if self.io.exists(self._f("max_gpuclk")):
            max_gpuclk = self._read_int(self._f("max_gpuclk"))
            if max_gpuclk > 0:
                cap = min(cap, max_gpuclk)
        return cap

    def set_hz(self, hz: int) -> int:
        self._check_open()
        if hz <= 0:
            raise InvalidFrequency(f"{hz} Hz: frequencies must be positive; {self._table()}")
        level = self.level_of(self._capped(snap_hz(self._levels, int(hz))))
        self._write_levels(fast=level, slow=level)
        return self.hz_of(level)

    def set_range(self, min_hz: int, max_hz: int) -> None:
        self._check_open()
        if min_hz <= 0 or max_hz < min_hz:
            raise InvalidFrequency(
                f"range {min_hz}-{max_hz} Hz: need 0 < min <= max; {self._table()}"
            )
        slow = self.level_of(self._capped(snap_hz(self._levels, int(min_hz))))
        fast = self.level_of(self._capped(snap_hz(self._levels, int(max_hz))))
        self._write_levels(fast=fast, slow=slow)

    def read_counters(self) -> Counters:
        self._check_open()
        if self._busy is None:
            raise Unsupported(f"{self.base}/gpubusy is missing: no busy counter")
        ts, busy, total = self._busy.read()
        instructions = self._perf.read()[0] if self._perf is not None else None
        return self._counter_check.check(Counters(ts, busy, total, instructions, self.current_hz()))

    def snapshot(self) -> DeviceState:
        slow = self._read_int(self._f("min_pwrlevel"))
        fast = self._read_int(self._f("max_pwrlevel"))
        return DeviceState(
            governor=self.governor,
            min_hz=self.hz_of(slow),
            max_hz=self.hz_of(fast),
            extra={"min_pwrlevel": slow, "max_pwrlevel": fast},
        )

    def restore(self, state: DeviceState) -> None:
        path = self._f("devfreq/governor")
        if state.governor is not None and self.governor != state.governor:
            self.io.write(path, state.governor)
        slow = state.extra.get("min_pwrlevel", self.level_of(state.min_hz))
        fast = state.extra.get("max_pwrlevel", self.level_of(state.max_hz))
        self._written = (
            self._read_int(self._f("max_pwrlevel")),
            self._read_int(self._f("min_pwrlevel")),
        )
        if self._written != (int(fast), int(slow)):
            self._write_levels(fast=int(fast), slow=int(slow))

    # ---- internals ---------------------------------------------------------------

    def _close_now(self) -> None:
        try:
            self.restore(self._initial)
        finally:
            if self._perf is not None:
                self._perf.close()

    def _capped(self, hz: int) -> int:
        cap = self.thermal_cap_hz()
        if hz <= cap:
            return hz
        below = [lv for lv in self._levels if lv <= cap]
        return below[-1] if below else self._levels[0]

    def _write_levels(self, *, fast: int, slow: int) -> None:
        """Write max_pwrlevel (fastest allowed) and min_pwrlevel (slowest allowed) in an
        order that never has max_pwrlevel > min_pwrlevel on the way. We remember what we
        wrote instead of reading it back (one adb round-trip less per set_hz); on a
        local tree we read back before and after to see foreign writes (counted and
        logged, not fought)."""
        if self.read_back:
            now = self._levels_now()
            if now != self._written:
                self._note_foreign_write(
                    f"pwrlevels changed to max {now[0]}/min {now[1]} since we wrote "
                    f"max {self._written[0]}/min {self._written[1]}"
                )
                self._written = now
        if fast <= self._written[0]:
            self.io.write(self._f("max_pwrlevel"), str(fast))
            self.io.write(self._f("min_pwrlevel"), str(slow))
        else:
            self.io.write(self._f("min_pwrlevel"), str(slow))
            self.io.write(self._f("max_pwrlevel"), str(fast))
        self._written = (fast, slow)
        if self.read_back:
            back = self._levels_now()
            if back != (fast, slow):
                self._note_foreign_write(
                    f"wrote max {fast}/min {slow} pwrlevels, read back max {back[0]}/min {back[1]}"
                )
                self._written = back

    def _levels_now(self) -> tuple[int, int]:
        return (self._read_int(self._f("max_pwrlevel")), self._read_int(self._f("min_pwrlevel")))

    # ---- native plan executor ------------------------------------------------------

    def native_actuator(self) -> NativeActuator:
        """What ``set_hz`` writes for each level, for the native executor: the power
        level number (0 = fastest) into ``min_pwrlevel`` (floor) and ``max_pwrlevel``
        (ceiling). Capped at the thermal cap known now. Local trees only."""
        if type(self.io) is not LocalSysfs:  # a wrapped IO (faults, tests) sees every write
            raise Unsupported(f"{self.name}: the native executor writes local files only")
        root = self.io.root
        values = tuple(str(self.level_of(self._capped(h))) for h in self._levels)
        state = self.snapshot()
        return SysfsPairActuator(
            str(root / self._f("min_pwrlevel").lstrip("/")),
            str(root / self._f("max_pwrlevel").lstrip("/")),
            values,
            values,
            initial_floor=level_index(self._levels, state.min_hz),
            initial_ceiling=level_index(self._levels, state.max_hz),
        )


def _open_perf(root: str) -> PerfCounters | None:
    """Perfcounters on a real /dev/kgsl-3d0 (only at root "/": a fake tree has none)."""
    dev = str(Path(root) / KGSL_DEV.lstrip("/"))
    if root != "/" or not os.path.exists(dev):
        return None
    try:
        return PerfCounters(dev)
    except DeviceError as e:
        log.info("KGSL perfcounters unavailable (%s); no instruction counts", e)
        return None


@functools.lru_cache(maxsize=32)
def available(arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    io = LocalSysfs(root)
    base = arg or KGSL_DIR
    if not io.exists(f"{base}/gpu_available_frequencies"):
        why = f"no KGSL GPU at {base} ({io.describe()})"
        log.debug("kgsl not available: %s", why)
        return False, why
    if not (io.writable(f"{base}/min_pwrlevel") and io.writable(f"{base}/max_pwrlevel")):
        why = f"{base}/min_pwrlevel and max_pwrlevel are not writable (run as root or chmod them)"
        log.debug("kgsl not available: %s", why)
        return False, why
    return True, f"Adreno GPU via KGSL at {base}"


def open_backend(arg: str | None = None, *, root: str = "/") -> KgslGpu:
    return KgslGpu(LocalSysfs(root), arg or KGSL_DIR, perf=_open_perf(root))
