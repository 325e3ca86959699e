"""A phone's GPU driven from the host over adb (``adb[:serial]``).

The KGSL and devfreq backends run unchanged on the host; their sysfs reads and writes
travel through ``AdbShellSysfs``, one persistent shell on the phone (as root when ``su``
or ``adb root`` allows), one round-trip per access and no process per write. At open we
time our own actuation round-trip and report it as the switch latency: host-driven
control over USB is coarse (milliseconds), fit for token-level decisions, not for
per-kernel ones. ``root`` (the sysfs root of local backends) does not apply to a phone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shlex
import statistics
from pathlib import Path

from .._clock import now_ns
from .adb_link import NO_ROOT_ADVICE, AdbLink, RootAccess, ShellSession
from .adb_settings import AdbSettings
from .base import (
    Counters,
    DeviceError,
    DeviceNotFound,
    DeviceState,
    GpuDevice,
    InvalidFrequency,
    PermissionDenied,
)
from .devfreq import DevfreqGpu, resolve
from .kgsl import KGSL_DIR, KgslGpu
from .lifecycle import Closeable
from .os_errors import ERRNO_CLASSES
from .owner import Ownership
from .state import read_record

log = logging.getLogger(__name__)

LATENCY_SOURCE = "measured over adb"


class AdbShellSysfs:
    """``SysfsIO`` over one ``ShellSession`` on the phone."""

    def __init__(self, session: ShellSession, access: RootAccess) -> None:
        self.session = session
        self.access = access
        # Sysfs attributes do not come and go while their driver is bound: remembering
        # exists() saves a USB round-trip on every capped set_hz.
        self._exists: dict[str, bool] = {}

    def _fail(self, path: str, action: str, text: str) -> DeviceError:
        where = f"{action} {path} on {self.session.serial}"
        if "Permission denied" in text or "Operation not permitted" in text:
            if self.access.rooted:
                return PermissionDenied(
                    f"cannot {where}: permission denied even as root (SELinux may forbid "
                    "it; check `adb shell getenforce` and the kernel log)"
                )
            return PermissionDenied(
                f"cannot {where}: permission denied ({self.access.detail}). {NO_ROOT_ADVICE}"
            )
        if "No such file" in text or "not found" in text:
            return DeviceNotFound(f"cannot {where}: no such file")
        if "Invalid argument" in text:
            return InvalidFrequency(f"cannot {where}: the kernel rejected the value ({text})")
        # Other errno texts from the phone's shell: the same table as local sysfs.
        for code, cls in ERRNO_CLASSES.items():
            if os.strerror(code) in text:
                return cls(f"cannot {where}: {text}")
        return DeviceError(f"cannot {where}: {text or 'failed'}")

    def read(self, path: str) -> str:
        r = self.session.run(f"cat {shlex.quote(path)}")
        if not r.ok:
            raise self._fail(path, "read", r.out.strip())
        return r.out.strip()

    def write(self, path: str, value: str) -> None:
        r = self.session.run(f"echo {shlex.quote(value)} > {shlex.quote(path)}")
        if not r.ok:
            raise self._fail(path, "write", r.out.strip())

    def exists(self, path: str) -> bool:
        if path not in self._exists:
            self._exists[path] = self.session.run(f"[ -e {shlex.quote(path)} ]").ok
        return self._exists[path]

    def listdir(self, path: str) -> list[str]:
        r = self.session.run(f"ls {shlex.quote(path)}")
        if not r.ok:
            raise self._fail(path, "list", r.out.strip())
        return sorted(r.out.split())

    def writable(self, path: str) -> bool:
        return self.session.run(f"[ -w {shlex.quote(path)} ]").ok

    def describe(self) -> str:
        return f"phone {self.session.serial} over adb ({self.access.detail})"


def open_gpu(io: AdbShellSysfs) -> KgslGpu | DevfreqGpu:
    """KGSL when the phone has it (Adreno), else its GPU devfreq node (Mali and others)."""
    if io.exists(f"{KGSL_DIR}/gpu_available_frequencies"):
        return KgslGpu(io, KGSL_DIR)
    return DevfreqGpu(io, resolve(io, None))


def thermal_cap_hz(gpu: KgslGpu | DevfreqGpu) -> int:
    cap = gpu.thermal_cap_hz
    return int(cap() if callable(cap) else cap)


def measure_round_trip_ns(gpu: KgslGpu | DevfreqGpu, samples: int) -> list[int]:
    """Time ``samples`` actuations that change nothing: ``set_range`` to the range the
    phone already has (the same reads and writes as a real switch). Without write
    access, time reads of the clock instead."""
    times = []
    state = gpu.snapshot()
    for _ in range(samples):
        t0 = now_ns()
        if gpu.capabilities.can_set:
            gpu.set_range(state.min_hz, state.max_hz)
        else:
            gpu.current_hz()
        times.append(now_ns() - t0)
    return times


class AdbGpu(Closeable):
    """``GpuDevice`` for a phone: the inner KGSL/devfreq backend over adb.

    It has no ``native_actuator``: a round trip is milliseconds, so it stays
    token-level, driven from Python, never from the native plan executor."""

    def __init__(
        self,
        link: AdbLink,
        session: ShellSession,
        inner: KgslGpu | DevfreqGpu,
        settings: AdbSettings,
    ) -> None:
        self.link = link
        self.serial = link.serial
        self.session = session
        self.inner = inner
        self.errors: list[str] = []
        self.name = f"adb:{self.serial}/{inner.name}"
        self._closed = False
        self._state_file = settings.state_dir / f"{_safe(self.serial)}.gpu-state.json"
        # One owner per phone (a lock on this host), and its state file in the common
        # format; no guardian: a dead host leaves the phone to `turboinfer restore`.
        self._ownership = Ownership(
            "adb",
            self.name,
            f"adb-{self.serial}",
            {"serial": self.serial},
            record_path=self._state_file,
            guardian=False,
        )
        self._ownership.acquire(self._put_back_leftover)
        try:
            self._ownership.hold(inner.snapshot())
        except BaseException:
            self._ownership.release(restored=True)
            raise
        n0 = session.commands
        rtts = measure_round_trip_ns(inner, settings.rtt_samples)
        per_call = (session.commands - n0) / len(rtts)
        self.round_trips_ns = rtts
        median = int(statistics.median(rtts))
        what = (
            f"no-op set_range calls ({per_call:.1f} shell round-trips each)"
            if inner.capabilities.can_set
            else "clock reads (no write access)"
        )
        access = link.root_access()
        notes = [
            *inner.capabilities.notes,
            f"host-driven over adb: each change takes a few USB round-trips (median "
            f"{median / 1e6:.2f} ms per change), so control is coarse and token-level, "
            "not per kernel",
            "no PMU over adb: KGSL perfcounter ioctls cannot travel over adb",
            f"root: {access.detail}",
        ]
        if not inner.capabilities.can_set:
            notes.append(f"read-only: {NO_ROOT_ADVICE}")
        self.capabilities = dataclasses.replace(
            inner.capabilities,
            has_pmu=False,
            switch_latency_ns=median,
            switch_latency_source=(
                f"{LATENCY_SOURCE}: median of {len(rtts)} {what} "
                f"(min {min(rtts) / 1e6:.2f} ms, max {max(rtts) / 1e6:.2f} ms)"
            ),
            notes=tuple(notes),
        )

    # ---- GpuDevice -----------------------------------------------------------------
    def frequencies_hz(self) -> list[int]:
        return self.inner.frequencies_hz()

    def current_hz(self) -> int:
        return self.inner.current_hz()

    def set_hz(self, hz: int) -> int:
        if not self.inner.capabilities.can_set:
            raise PermissionDenied(
                f"cannot set the GPU clock of {self.serial}: {self.link.root_access().detail}. "
                + NO_ROOT_ADVICE
            )
        return self.inner.set_hz(hz)

    def set_range(self, min_hz: int, max_hz: int) -> None:
        if not self.inner.capabilities.can_set:
            raise PermissionDenied(
                f"cannot set the GPU range of {self.serial}: "
                f"{self.link.root_access().detail}. " + NO_ROOT_ADVICE
            )
        self.inner.set_range(min_hz, max_hz)

    def read_counters(self) -> Counters:
        return self.inner.read_counters()

    def snapshot(self) -> DeviceState:
        return self.inner.snapshot()

    def restore(self, state: DeviceState) -> None:
        self.inner.restore(state)

    @property
    def governor(self) -> str | None:
        return self.inner.governor

    def thermal_cap_hz(self) -> int:
        return thermal_cap_hz(self.inner)

    def close(self) -> None:
        """Restore the phone's GPU state and end the shell. A lost connection is
        reported (``errors`` and the log), never a hang: every wait has a timeout."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.inner.close()
            except PermissionDenied:
                if self.inner.capabilities.can_set:
                    raise
                # Read-only session: we changed nothing, so there is nothing to put back.
            self._ownership.release(restored=True)
        except DeviceError as e:
            self._ownership.release(restored=False)
            msg = (
                f"could not restore the GPU of {self.serial}: {e}. Its clocks may stay "
                f"pinned until reboot; reconnect and run `turboinfer android restore "
                f"--serial {self.serial}` (state kept in {self._state_file})"
            )
            self.errors.append(msg)
            log.error("%s", msg)
        finally:
            self.session.close()

    def _put_back_leftover(self, state: DeviceState) -> None:
        """A previous run lost this phone without restoring it: put its saved state
        back before we take our own snapshot."""
        if not self.inner.capabilities.can_set:
            log.warning(
                "%s: a previous run left the GPU pinned, but this session cannot write; "
                "run `turboinfer restore` with root",
                self.serial,
            )
            return
        self.inner.restore(state)
        self.inner.rebase()

    def health(self) -> dict[str, object]:
        """Lock and state file of this phone (for stats())."""
        return {"errors": list(self.errors), **self._ownership.health()}


def _safe(serial: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in serial)


def saved_state(serial: str, settings: AdbSettings | None = None) -> tuple[Path, DeviceState]:
    """The GPU state saved when ``serial`` was opened and not restored since."""
    settings = settings or AdbSettings()
    path = settings.state_dir / f"{_safe(serial)}.gpu-state.json"
    if not path.exists():
        raise DeviceNotFound(f"no unrestored GPU state for {serial} in {settings.state_dir}")
    return path, read_record(path).state


def restore_phone(serial: str, state: DeviceState, settings: AdbSettings | None = None) -> str:
    """Put ``state`` back on the phone's GPU over a fresh root shell."""
    settings = settings or AdbSettings()
    link = AdbLink(serial, settings)
    session = link.open_session(as_root=True)
    try:
        gpu = open_gpu(AdbShellSysfs(session, link.root_access()))
        gpu.close()  # releases its guard first: it would put back today's pinned state
        gpu.restore(state)
    finally:
        session.close()
    return (
        f"{link.serial}: GPU restored to governor {state.governor}, "
        f"{state.min_hz / 1e6:g}-{state.max_hz / 1e6:g} MHz"
    )


def open_adb_gpu(serial: str | None = None, settings: AdbSettings | None = None) -> AdbGpu:
    settings = settings or AdbSettings()
    link = AdbLink(serial, settings)
    session = link.open_session(as_root=True)
    try:
        inner = open_gpu(AdbShellSysfs(session, link.root_access()))
    except BaseException:
        session.close()
        raise
    try:
        return AdbGpu(link, session, inner, settings)
    except BaseException:
        with contextlib.suppress(DeviceError):
            inner.close()
        session.close()
        raise


@functools.lru_cache(maxsize=32)
def _available(arg: str | None, server: tuple[str, int]) -> tuple[bool, str]:
    try:
        import adbutils  # noqa: F401
    except ImportError:
        return False, "adbutils is not installed (pip install adbutils)"
    try:
        link = AdbLink(arg, AdbSettings(server=f"{server[0]}:{server[1]}"))
        access = link.root_access()
    except DeviceError as e:
        log.debug("adb not available: %s", e)
        return False, str(e)
    model = link.getprop("ro.product.model") or "unknown model"
    return (
        True,
        f"phone {link.serial} ({model}) over adb at {server[0]}:{server[1]}; {access.detail}",
    )


def available(arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    """Is there a phone (``arg`` = serial) on the adb server? Cached per server."""
    try:
        server = AdbSettings().server_address()
    except ValueError as e:
        return False, str(e)
    return _available(arg, server)


def open_backend(arg: str | None = None, *, root: str = "/") -> GpuDevice:
    return open_adb_gpu(arg)
