"""The GPU through our kernel module: ``/dev/turboinfer`` (``kmod[:/dev/turboinfer]``).

``kernel_module/turboinfer.ko`` pins PM QoS min/max requests on the GPU's devfreq
device; devfreq re-evaluates the clock inside the ioctl, so ``set_hz`` returns once
the new clock is in effect, and the module never goes above a thermal cap. The
kernel drops our requests when the fd closes, even if this process is SIGKILLed.

The struct layouts below mirror ``kernel_module/turboinfer_uapi.h``;
``tests/test_kmod_layout.py`` parses that header so the two cannot drift.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import select
import stat
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._clock import now_ns
from .base import (
    Capabilities,
    CounterCheck,
    Counters,
    DeviceError,
    DeviceGone,
    DeviceNotFound,
    DeviceState,
    InvalidFrequency,
    PermissionDenied,
    Unsupported,
)
from .lifecycle import GuardedBackend
from .native import KmodActuator
from .os_errors import translate
from .owner import Ownership, take

log = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/turboinfer"

# ---- ABI (turboinfer_uapi.h) ------------------------------------------------------

TI_ABI_VERSION = 1
TI_IOC_MAGIC = 0xB4
TI_MAX_FREQS = 32
TI_NAME_LEN = 64
TI_SAMPLE_PERIOD_MIN_NS = 100_000
TI_SAMPLE_PERIOD_MAX_NS = 1_000_000_000

TI_INFO_F_VIRTUAL = 0x1
TI_INFO_F_HAS_PMU = 0x2
TI_SET_FREQ_F_EXACT = 0x1
TI_STATS_F_PMU = 0x1
TI_STATS_F_BUSY_SIMULATED = 0x2
TI_STATS_F_BUSY_ESTIMATED = 0x4
TI_SAMPLE_F_LOST = 0x8
TI_SAMPLE_F_ENABLE = 0x1

_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64


class TiInfo(ctypes.Structure):
    _fields_ = [
        ("abi_version", _u32),
        ("num_freqs", _u32),
        ("flags", _u32),
        ("cooling_state", _u32),
        ("max_cooling_state", _u32),
        ("__pad0", _u32),
        ("cur_freq_hz", _u64),
        ("cooling_cap_hz", _u64),
        ("qos_max_hz", _u64),
        ("scaling_max_hz", _u64),
        ("freqs_hz", _u64 * TI_MAX_FREQS),
        ("name", ctypes.c_char * TI_NAME_LEN),
    ]


class TiSetFreq(ctypes.Structure):
    _fields_ = [
        ("freq_hz", _u64),
        ("flags", _u32),
        ("__pad0", _u32),
        ("target_hz", _u64),
        ("applied_hz", _u64),
        ("t_ns", _u64),
    ]


class TiRange(ctypes.Structure):
    _fields_ = [
        ("min_hz", _u64),
        ("max_hz", _u64),
        ("applied_min_hz", _u64),
        ("applied_max_hz", _u64),
        ("cur_freq_hz", _u64),
        ("t_ns", _u64),
    ]


class TiStats(ctypes.Structure):
    _fields_ = [
        ("t_ns", _u64),
        ("cur_freq_hz", _u64),
        ("busy_ns", _u64),
        ("total_ns", _u64),
        ("window_busy_ns", _u64),
        ("window_total_ns", _u64),
        ("transitions", _u64),
        ("last_transition_ns", _u64),
        ("instructions", _u64),
        ("flags", _u32),
        ("samples_lost", _u32),
    ]


class TiSampleConfig(ctypes.Structure):
    _fields_ = [
        ("period_ns", _u64),
        ("flags", _u32),
        ("__pad0", _u32),
    ]


class TiSample(ctypes.Structure):
    _fields_ = [
        ("t_ns", _u64),
        ("freq_hz", _u64),
        ("busy_ns", _u64),
        ("total_ns", _u64),
        ("instructions", _u64),
        ("seq", _u32),
        ("flags", _u32),
    ]


_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2


def _ioc(direction: int, nr: int, size: int) -> int:
    """Linux _IOC encoding (asm-generic: x86 and arm64 alike)."""
    return (direction << 30) | (size << 16) | (TI_IOC_MAGIC << 8) | nr


TI_GET_INFO = _ioc(_IOC_READ, 1, ctypes.sizeof(TiInfo))
TI_SET_FREQ = _ioc(_IOC_READ | _IOC_WRITE, 2, ctypes.sizeof(TiSetFreq))
TI_SET_RANGE = _ioc(_IOC_READ | _IOC_WRITE, 3, ctypes.sizeof(TiRange))
TI_RELEASE = _ioc(_IOC_NONE, 4, 0)
TI_GET_STATS = _ioc(_IOC_READ, 5, ctypes.sizeof(TiStats))
TI_SAMPLE_CONFIG = _ioc(_IOC_WRITE, 6, ctypes.sizeof(TiSampleConfig))

SAMPLE_SIZE = ctypes.sizeof(TiSample)

IoctlFn = Callable[..., Any]

_HOW_TO_GET_PERMISSION = (
    "run as root (sudo), or let your user open it: `sudo chmod 0666 {path}` (or a udev "
    'rule: KERNEL=="turboinfer", MODE="0666"); the device exists once the module is '
    "loaded: `sudo insmod turboinfer.ko target=<devfreq name>` (kernel_module/README.md)"
)
_HOW_TO_LOAD = (
    "load the turboinfer kernel module: `sudo insmod turboinfer.ko target=<devfreq name>` "
    "(build it with `make -C kernel_module`; see kernel_module/README.md)"
)
# Until a set_hz has been timed: TI_SET_FREQ returns after devfreq's QoS notifier has
# changed the clock, so the latency is the ioctl's own duration.
SWITCH_LATENCY_ASSUMED_NS = 100_000
SWITCH_LATENCY_NOTE = (
    "assumption until measured: TI_SET_FREQ returns once devfreq has changed the clock "
    "(synchronous PM QoS notifier); the driver's clock switch dominates"
)


def _translate(e: OSError, path: str, action: str) -> DeviceError:
    """OSError at the backend boundary -> our hierarchy (the shared errno table, with
    this device's own advice and its own meaning of EBADF and ENOTTY)."""
    permission = _HOW_TO_GET_PERMISSION  # a template: {path} is filled in by translate
    return translate(
        e,
        path,
        action,
        messages={
            PermissionDenied: "cannot {action} {path}: permission denied; " + permission,
            DeviceNotFound: "no {path}; " + _HOW_TO_LOAD,
        },
        overrides={
            errno.EBADF: (
                PermissionDenied,
                "cannot {action} {path}: the device was opened read-only; " + permission,
            ),
            errno.ENOTTY: (
                Unsupported,
                "cannot {action} {path}: not a turboinfer device, or its module speaks "
                f"another ABI than version {TI_ABI_VERSION}",
            ),
        },
    )


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampler record; busy/total are cumulative since the module loaded."""

    t_ns: int
    freq_hz: int
    busy_ns: int
    total_ns: int
    instructions: int | None
    seq: int
    lost_before: bool  # records were dropped (ring overflow) just before this one

    @classmethod
    def from_record(cls, rec: TiSample) -> Sample:
        return cls(
            t_ns=int(rec.t_ns),
            freq_hz=int(rec.freq_hz),
            busy_ns=int(rec.busy_ns),
            total_ns=int(rec.total_ns),
            instructions=int(rec.instructions) if rec.flags & TI_STATS_F_PMU else None,
            seq=int(rec.seq),
            lost_before=bool(rec.flags & TI_SAMPLE_F_LOST),
        )


def parse_samples(data: bytes) -> list[Sample]:
    """Whole records from a read() of the device."""
    if len(data) % SAMPLE_SIZE:
        raise DeviceError(f"read {len(data)} bytes, not a multiple of {SAMPLE_SIZE}")
    return [
        Sample.from_record(TiSample.from_buffer_copy(data, off))
        for off in range(0, len(data), SAMPLE_SIZE)
    ]


class KmodDevice(GuardedBackend):
    """A devfreq GPU driven through ``/dev/turboinfer``.

    ``ioctl`` is injectable (tests pass a fake implementing the ABI in Python); it is
    called as ``ioctl(fd, request, arg, True)`` like ``fcntl.ioctl``.
    """

    _LATENCY_WINDOW = 64

    def __init__(
        self, path: str = DEFAULT_PATH, *, ioctl: IoctlFn = fcntl.ioctl, own: bool = True
    ) -> None:
        """``own``: take the GPU's lock and state file and start the guardian (a
        second line: the kernel itself drops our requests when the fd closes)."""
        self.path = path
        self._ioctl_fn = ioctl
        self._fd = -1
        self.name = f"kmod:{path}"  # until the module names its GPU
        ownership = self._take_ownership() if own else None
        try:
            self._open_device()
        except BaseException:
            if ownership is not None:
                ownership.release(restored=True)
            raise
        if ownership is not None:
            ownership.name = self.name
            ownership.hold(self.snapshot())
        self._install_guard(self._close_now, ownership)

    def _take_ownership(self) -> Ownership | None:
        ownership = Ownership("kmod", self.name, os.path.realpath(self.path), {"path": self.path})
        # Nothing to put back for a dead owner: its requests died with its fd.
        return take(ownership, lambda _state: None)

    def _open_device(self) -> None:
        path = self.path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            st = os.fstat(self._fd)
        except OSError as e:
            raise _translate(e, path, "open") from e
        # What our fd is: if someone closes it under us, the number may come back as
        # another file, and its errors would be misread.
        self._fd_id = (st.st_dev, st.st_ino, st.st_rdev)
        self._counter_check = CounterCheck(f"kmod:{path}")
        try:
            info = self._info()
            if info.abi_version != TI_ABI_VERSION:
                raise Unsupported(
                    f"{path} speaks turboinfer ABI {info.abi_version}; this build "
                    f"needs {TI_ABI_VERSION}: rebuild and reload kernel_module/"
                )
            if not 0 < info.num_freqs <= TI_MAX_FREQS:
                raise DeviceError(f"{path} reports {info.num_freqs} frequency levels")
            self._levels = sorted(int(f) for f in info.freqs_hz[: info.num_freqs])
            self.name = "kmod:" + info.name.decode(errors="replace")
            self.virtual = bool(info.flags & TI_INFO_F_VIRTUAL)
            stats = self._stats()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self._busy0 = int(stats.busy_ns)
        self._total0 = int(stats.total_ns)
        self._pinned: tuple[int, int] | None = None
        self._sampling = False
        self._latencies_ns: list[int] = []
        notes = []
        if self.virtual:
            notes.append(
                "simulated: the virtual GPU hosted by turboinfer.ko (virtual=1); clock "
                "changes are real devfreq transitions, busy time is simulated"
            )
        if stats.flags & TI_STATS_F_BUSY_ESTIMATED:
            notes.append("busy = the governor's last-window busy ratio integrated over time")
        self.capabilities = Capabilities(
            can_set=True,
            has_pmu=bool(info.flags & TI_INFO_F_HAS_PMU),
            simulated=self.virtual,
            switch_latency_ns=SWITCH_LATENCY_ASSUMED_NS,
            switch_latency_source=SWITCH_LATENCY_NOTE,
            notes=tuple(notes),
        )

    # ---- ioctl plumbing ----------------------------------------------------------

    def _call(self, request: int, arg: ctypes.Structure | int, action: str) -> None:
        if self._fd < 0:
            raise DeviceGone(f"{self.path} is closed")
        try:
            self._ioctl_fn(self._fd, request, arg, True)
        except OSError as e:
            raise self._os_error(e, action) from e

    def _fd_lost(self) -> bool:
        """Was our fd closed under us (or now names another file)?"""
        try:
            st = os.fstat(self._fd)
        except OSError:
            return True
        return (st.st_dev, st.st_ino, st.st_rdev) != self._fd_id

    def _os_error(self, e: OSError, action: str) -> DeviceError:
        if self._fd >= 0 and self._fd_lost():
            return DeviceGone(
                f"cannot {action} {self.path}: our file descriptor {self._fd} was closed "
                "under us (by other code in this process); the kernel dropped our requests"
            )
        return _translate(e, self.path, action)

    def _info(self) -> TiInfo:
        info = TiInfo()
        self._call(TI_GET_INFO, info, "read the GPU info of")
        return info

    def _stats(self) -> TiStats:
        st = TiStats()
        self._call(TI_GET_STATS, st, "read the counters of")
        return st

    def _table(self) -> str:
        return "levels: " + ", ".join(f"{h / 1e6:g} MHz" for h in self._levels)

    def _invalid(self, e: OSError, what: str) -> InvalidFrequency:
        reason = "outside the table" if e.errno == errno.ERANGE else "rejected"
        return InvalidFrequency(f"{what}: {reason} by {self.path}; {self._table()}")

    # ---- GpuDevice ---------------------------------------------------------------

    def frequencies_hz(self) -> list[int]:
        return list(self._levels)

    def current_hz(self) -> int:
        return int(self._info().cur_freq_hz)

    def info(self) -> TiInfo:
        """Everything TI_GET_INFO says: caps, cooling state, current clock."""
        return self._info()

    def set_hz(self, hz: int) -> int:
        self._check_open()
        req = TiSetFreq(freq_hz=max(int(hz), 0))
        t0_ns = now_ns()
        try:
            self._ioctl_fn(self._fd, TI_SET_FREQ, req, True)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ERANGE):
                raise self._invalid(e, f"{hz} Hz") from e
            raise self._os_error(e, "set the clock of") from e
        self._note_latency(int(req.t_ns) - t0_ns)
        self._pinned = (int(req.target_hz), int(req.target_hz))
        return int(req.applied_hz)

    def set_range(self, min_hz: int, max_hz: int) -> None:
        self._check_open()
        if min_hz > max_hz:
            raise InvalidFrequency(f"range {min_hz}-{max_hz} Hz: min > max; {self._table()}")
        req = TiRange(min_hz=max(int(min_hz), 0), max_hz=max(int(max_hz), 0))
        try:
            self._ioctl_fn(self._fd, TI_SET_RANGE, req, True)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ERANGE):
                raise self._invalid(e, f"range {min_hz}-{max_hz} Hz") from e
            raise self._os_error(e, "set the range of") from e
        self._pinned = (int(req.applied_min_hz), int(req.applied_max_hz))

    def release(self) -> None:
        """Drop our requests: the governor and other parties' limits rule again."""
        self._check_open()
        self._call(TI_RELEASE, 0, "release")
        self._pinned = None

    def read_counters(self) -> Counters:
        self._check_open()
        st = self._stats()
        return self._counter_check.check(
            Counters(
                ts_ns=int(st.t_ns),
                busy_ns=int(st.busy_ns) - self._busy0,
                total_ns=int(st.total_ns) - self._total0,
                instructions=int(st.instructions) if st.flags & TI_STATS_F_PMU else None,
                freq_hz=int(st.cur_freq_hz),
            )
        )

    def stats(self) -> TiStats:
        """The raw TI_GET_STATS record (window since the previous call, transitions)."""
        self._check_open()
        return self._stats()

    def snapshot(self) -> DeviceState:
        """Our own requests: the module holds no other state of ours."""
        lo, hi = self._pinned or (self._levels[0], self._levels[-1])
        return DeviceState(
            governor=None, min_hz=lo, max_hz=hi, extra={"pinned": bool(self._pinned)}
        )

    def restore(self, state: DeviceState) -> None:
        if state.extra.get("pinned"):
            self.set_range(state.min_hz, state.max_hz)
        elif self._pinned is not None:
            self.release()

    # ---- sampler -----------------------------------------------------------------

    def start_sampler(self, period_ns: int) -> None:
        """Sample clock and busy every ``period_ns`` (100 µs .. 1 s) into the kernel ring."""
        self._check_open()
        if not TI_SAMPLE_PERIOD_MIN_NS <= period_ns <= TI_SAMPLE_PERIOD_MAX_NS:
            raise ValueError(
                f"sampler period {period_ns} ns: must be {TI_SAMPLE_PERIOD_MIN_NS} to "
                f"{TI_SAMPLE_PERIOD_MAX_NS} ns"
            )
        cfg = TiSampleConfig(period_ns=int(period_ns), flags=TI_SAMPLE_F_ENABLE)
        self._call(TI_SAMPLE_CONFIG, cfg, "start the sampler of")
        self._sampling = True

    def stop_sampler(self) -> None:
        self._check_open()
        self._call(TI_SAMPLE_CONFIG, TiSampleConfig(), "stop the sampler of")
        self._sampling = False

    def read_samples(self, max_records: int = 1024, timeout_s: float | None = 0.0) -> list[Sample]:
        """Drain up to ``max_records``. Waits up to ``timeout_s`` for the first one
        (None: until one comes or the sampler stops); [] when none came."""
        self._check_open()
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        try:
            if timeout_s is not None:
                ready, _, _ = select.select([self._fd], [], [], timeout_s)
                if not ready:
                    return []
            data = os.read(self._fd, max_records * SAMPLE_SIZE)
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return []
            raise self._os_error(e, "read samples from") from e
        return parse_samples(data)

    # ---- internals ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _closed_label(self) -> str:
        return self.path

    def health(self) -> dict[str, object]:
        """Lock, state file and guardian (for stats())."""
        return self.ownership_health()

    def _note_latency(self, dt_ns: int) -> None:
        """Keep capabilities.switch_latency_ns at the median of recent TI_SET_FREQ times
        (user call -> kernel stamp once the clock changed; one CLOCK_MONOTONIC)."""
        if dt_ns <= 0:
            return
        self._latencies_ns.append(dt_ns)
        del self._latencies_ns[: -self._LATENCY_WINDOW]
        self.capabilities = dataclasses.replace(
            self.capabilities,
            switch_latency_ns=int(statistics.median(self._latencies_ns)),
            switch_latency_source=(
                f"measured: median TI_SET_FREQ call-to-applied time over the last "
                f"{len(self._latencies_ns)} calls"
            ),
        )

    def _close_now(self) -> None:
        if self._fd < 0:
            return
        lost = self._fd_lost()
        try:
            if lost:
                # Closing the fd dropped our requests in the kernel: nothing to undo.
                log.warning(
                    "%s: fd closed under us; the kernel already dropped our requests", self.path
                )
            else:
                try:
                    if self._sampling:
                        self._call(TI_SAMPLE_CONFIG, TiSampleConfig(), "stop the sampler of")
                    self._call(TI_RELEASE, 0, "release")
                except DeviceGone as e:
                    # The module is gone or dying: closing the fd ends our requests.
                    log.warning("%s; closing the fd drops our requests", e)
        finally:
            if not lost:
                os.close(self._fd)
            self._fd = -1
            self._pinned = None
            self._sampling = False

    # ---- native plan executor ------------------------------------------------------

    def native_actuator(self) -> KmodActuator:
        """TI_SET_FREQ on this device from the native executor's own fd (its QoS
        request is dropped when the executor is destroyed). Don't pin from this object
        meanwhile: the kernel would combine both requests. Only the kernel's character
        device takes a native ioctl (not a user-space stand-in)."""
        try:
            mode = os.stat(self.path).st_mode
        except OSError as e:
            raise translate(e, self.path, "open") from e
        if not stat.S_ISCHR(mode):
            raise Unsupported(f"{self.path} is not the module's character device")
        return KmodActuator(self.path)


def _device_path(arg: str | None, root: str) -> str:
    return str(Path(root) / (arg or DEFAULT_PATH).lstrip("/"))


@functools.lru_cache(maxsize=32)
def available(arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    path = _device_path(arg, root)
    try:
        st = os.stat(path)
    except OSError:
        why = f"no {path}: the turboinfer kernel module is not loaded; {_HOW_TO_LOAD}"
        log.debug("kmod not available: %s", why)
        return False, why
    if not stat.S_ISCHR(st.st_mode):
        why = f"{path} is not a character device"
        log.debug("kmod not available: %s", why)
        return False, why
    if not os.access(path, os.R_OK | os.W_OK):
        why = f"{path} is not readable and writable; " + _HOW_TO_GET_PERMISSION.format(path=path)
        log.debug("kmod not available: %s", why)
        return False, why
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = TiInfo()
            fcntl.ioctl(fd, TI_GET_INFO, info, True)
        finally:
            os.close(fd)
    except OSError as e:
        why = str(_translate(e, path, "query"))
        log.debug("kmod not available: %s", why)
        return False, why
    if info.abi_version != TI_ABI_VERSION:
        why = f"{path} speaks ABI {info.abi_version}, need {TI_ABI_VERSION}"
        log.debug("kmod not available: %s", why)
        return False, why
    return True, f"turboinfer.ko at {path} driving {info.name.decode(errors='replace')}"


def open_backend(arg: str | None = None, *, root: str = "/") -> KmodDevice:
    return KmodDevice(_device_path(arg, root))
