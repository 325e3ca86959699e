"""Any Linux devfreq GPU (Mali, Jetson, Adreno's devfreq node) through sysfs.

The clock is pinned by clamping ``min_freq``/``max_freq`` (works under any governor),
or through ``userspace/set_freq`` when the userspace governor is already active. Busy
time comes from small per-platform readers. We never go above the ``max_freq`` found
at open: a value below the table's top was set by someone else (thermal, the user).
Speaks only ``SysfsIO``, so the adb backend drives a phone with the same code.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Callable

from .._clock import now_ns
from .base import (
    BadCounters,
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
from .lifecycle import GuardedBackend
from .native import NativeActuator, SysfsOneActuator, SysfsPairActuator, level_index
from .owner import Ownership, local_ownership, take
from .sysfs_io import LocalSysfs, SysfsIO

log = logging.getLogger(__name__)

DEVFREQ_CLASS = "/sys/class/devfreq"
# Substrings of devfreq device names that are GPUs (Mali, Adreno/KGSL, Jetson gXXb,
# Exynos g3d, panfrost/lima/etnaviv).
GPU_NAME_HINTS = (
    "gpu",
    "mali",
    "kgsl",
    "adreno",
    "ga10b",
    "gv11b",
    "gp10b",
    "gm20b",
    "g3d",
    "panfrost",
    "lima",
    "etnaviv",
)
SWITCH_LATENCY_ASSUMED_NS = 200_000
SWITCH_LATENCY_NOTE = (
    "assumption: one sysfs write; devfreq re-evaluates the clock synchronously on a "
    "min/max change (QoS notifier), so the write time dominates. Not measured."
)

BusyReader = Callable[[], float]
"""Returns the busy fraction (0..1) of the platform's last measurement window."""


def _parse_levels(text: str) -> list[int]:
    return sorted({int(tok) for tok in text.replace(",", " ").split() if tok.isdigit()})


def _busy_readers(io: SysfsIO, path: str) -> list[tuple[str, BusyReader]]:
    """Per-platform busy sources, most specific first."""
    found: list[tuple[str, BusyReader]] = []

    def add(name: str, file: str, parse: Callable[[str], float]) -> None:
        if io.exists(file):
            found.append((f"{name} ({file})", lambda: parse_busy(file, io.read(file), parse)))

    # Jetson (nvgpu): per-mille load of the GPU platform device.
    add("jetson load", posixpath.join(path, "device", "load"), lambda s: int(s) / 1000.0)
    # Mali (kbase on MediaTek/Exynos and others): utilization in percent.
    add("mali utilization", posixpath.join(path, "device", "utilization"), lambda s: int(s) / 100.0)
    # Samsung Exynos GPU driver.
    add("exynos gpu_busy", "/sys/kernel/gpu/gpu_busy", lambda s: int(s.rstrip("%")) / 100.0)
    # Qualcomm KGSL behind its devfreq node: "busy total" of the last window.
    add("kgsl gpubusy", "/sys/class/kgsl/kgsl-3d0/gpubusy", kgsl_gpubusy_fraction)
    # Rockchip-style devfreq "load": "<percent>@<freq>Hz".
    add("devfreq load", posixpath.join(path, "load"), lambda s: int(s.split("@")[0]) / 100.0)
    return found


def parse_busy(file: str, text: str, parse: Callable[[str], float]) -> float:
    """A busy fraction in 0..1, or ``BadCounters`` for anything else."""
    try:
        fraction = parse(text)
    except (ValueError, IndexError, ZeroDivisionError) as e:
        raise BadCounters(f"{file}: unreadable busy value {text!r}") from e
    if not 0.0 <= fraction <= 1.0:
        raise BadCounters(f"{file}: busy value {text!r} is outside 0..100%")
    return fraction


def kgsl_gpubusy_fraction(text: str) -> float:
    """KGSL's ``gpubusy`` ("busy total" of the last window); "0 0" is an idle window."""
    busy, total = (int(x) for x in text.split()[:2])
    if busy < 0 or total < 0:
        raise ValueError("negative")
    return busy / total if total > 0 else 0.0


class BusyIntegrator:
    """Cumulative busy ns from a window-based busy fraction: each read credits the time
    since the previous read with the fraction just reported (an approximation that is
    exact when reads line up with the platform's window)."""

    def __init__(self, reader: BusyReader) -> None:
        self._reader = reader
        self._t0 = self._last = now_ns()
        self.busy_ns = 0

    def read(self) -> tuple[int, int, int]:
        """(ts_ns, busy_ns, total_ns) since creation."""
        t = now_ns()
        fraction = self._reader()
        self.busy_ns += round((t - self._last) * fraction)
        self._last = t
        return t, self.busy_ns, t - self._t0


class DevfreqGpu(GuardedBackend):
    """A devfreq GPU at ``path`` (e.g. ``/sys/class/devfreq/17000000.ga10b``)."""

    def __init__(self, io: SysfsIO, path: str, *, own: bool | None = None) -> None:
        """``own``: take the GPU (lock, state file, guardian; default: on a local
        tree). False reads and restores without owning (``probe``, ``restore``)."""
        self.io = io
        self.path = path.rstrip("/")
        if not io.exists(self._f("available_frequencies")):
            raise DeviceNotFound(f"{self.path} is not a devfreq device ({io.describe()})")
        self.name = f"devfreq:{posixpath.basename(self.path)}"
        self._levels = _parse_levels(io.read(self._f("available_frequencies")))
        if not self._levels:
            raise Unsupported(f"{self.path}/available_frequencies lists no frequencies")
        self._last_max_hz: int | None = None
        self._last_written: tuple[int, int] | None = None
        # Read back around our writes to see foreign ones (local trees: cheap). Turn
        # off while something else of ours writes the same files (a native executor).
        self.read_back = isinstance(io, LocalSysfs)
        ownership = self._take_ownership(own)
        try:
            self._setup()
        except BaseException:
            if ownership is not None:
                ownership.release(restored=True)
            raise
        if ownership is not None:
            ownership.hold(self._initial)
        self._install_guard(lambda: self.restore(self._initial), ownership)

    def _take_ownership(self, own: bool | None) -> Ownership | None:
        """Lock the GPU and put back what a dead owner left, before our snapshot."""
        if own is False or not isinstance(self.io, LocalSysfs):
            return None
        if not (self.io.writable(self._f("min_freq")) and self.io.writable(self._f("max_freq"))):
            return None  # read-only: we cannot pin it, so there is nothing to guard
        ownership = local_ownership(
            "devfreq", self.name, str(self.io.root), self.path, self.io.real_path(self.path)
        )
        self._userspace = False
        return take(ownership, self.restore)

    def _setup(self) -> None:
        io = self.io
        self._initial = self.snapshot()
        # A max below the table's top at open was set by someone else: honour it.
        self._cap_hz = self._initial.max_hz
        self._userspace = self._userspace_active()
        readers = _busy_readers(io, self.path)
        self.busy_source = readers[0][0] if readers else None
        self._busy = BusyIntegrator(readers[0][1]) if readers else None
        self._counter_check = CounterCheck(self.name)
        self.capabilities = Capabilities(
            can_set=io.writable(self._f("min_freq")) and io.writable(self._f("max_freq")),
            has_pmu=False,
            simulated=False,
            switch_latency_ns=SWITCH_LATENCY_ASSUMED_NS,
            switch_latency_source=SWITCH_LATENCY_NOTE,
            notes=(f"busy source: {self.busy_source or 'none'}",),
        )

    def _f(self, name: str) -> str:
        return f"{self.path}/{name}"

    def _read_int(self, name: str) -> int:
        text = self.io.read(self._f(name))
        try:
            return int(text.split()[0])
        except (ValueError, IndexError) as e:
            raise DeviceError(f"{self._f(name)}: unexpected contents {text!r}") from e

    def _table(self) -> str:
        return "levels: " + ", ".join(f"{h / 1e6:g} MHz" for h in self._levels)

    # ---- GpuDevice ---------------------------------------------------------------

    def frequencies_hz(self) -> list[int]:
        return list(self._levels)

    def current_hz(self) -> int:
        return self._read_int("cur_freq")

    @property
    def governor(self) -> str:
        return self.io.read(self._f("governor"))

    @property
    def thermal_cap_hz(self) -> int:
        return self._cap_hz

    def set_hz(self, hz: int) -> int:
        self._check_open()
        if hz <= 0:
            raise InvalidFrequency(f"{hz} Hz: frequencies must be positive; {self._table()}")
        current_max = self._observe_max()
        level = self._capped(snap_hz(self._levels, int(hz)))
        if self._userspace:
            self.io.write(self._f("userspace/set_freq"), str(level))
        else:
            self._write_range(level, level, current_max)
        return level

    def set_range(self, min_hz: int, max_hz: int) -> None:
        self._check_open()
        if min_hz <= 0 or max_hz < min_hz:
            raise InvalidFrequency(
                f"range {min_hz}-{max_hz} Hz: need 0 < min <= max; {self._table()}"
            )
        current_max = self._observe_max()
        lo = self._capped(snap_hz(self._levels, int(min_hz)))
        hi = self._capped(snap_hz(self._levels, int(max_hz)))
        self._write_range(lo, hi, current_max)

    def read_counters(self) -> Counters:
        self._check_open()
        if self._busy is None:
            raise Unsupported(
                f"{self.path}: no busy counter found (looked for device/load, "
                "device/utilization, gpu_busy, gpubusy, load)"
            )
        ts, busy, total = self._busy.read()
        return self._counter_check.check(Counters(ts, busy, total, None, self.current_hz()))

    def snapshot(self) -> DeviceState:
        return DeviceState(
            governor=self.governor,
            min_hz=self._read_int("min_freq"),
            max_hz=self._read_int("max_freq"),
        )

    def restore(self, state: DeviceState) -> None:
        if state.governor is not None and self.governor != state.governor:
            self.io.write(self._f("governor"), state.governor)
        self._userspace = self._userspace_active()
        now = (self._read_int("min_freq"), self._read_int("max_freq"))
        if now != (state.min_hz, state.max_hz):
            self._write_range(state.min_hz, state.max_hz, now[1])

    # ---- internals ---------------------------------------------------------------

    def _userspace_active(self) -> bool:
        """Read once at open and after restore (one adb round-trip less per set_hz)."""
        return self.governor == "userspace" and self.io.exists(self._f("userspace/set_freq"))

    def _capped(self, hz: int) -> int:
        if hz <= self._cap_hz:
            return hz
        below = [lv for lv in self._levels if lv <= self._cap_hz]
        return below[-1] if below else self._levels[0]

    def _observe_max(self) -> int:
        """Read max_freq; if it is lower than we wrote, a thermal or QoS cap came in
        since: honour it from now on."""
        observed = self._read_int("max_freq")
        if self._last_max_hz is not None and observed < self._last_max_hz:
            log.info(
                "%s: max_freq lowered to %d Hz by someone else; honouring it", self.name, observed
            )
            self._cap_hz = min(self._cap_hz, observed)
        return observed

    def observe_cap_hz(self, written_max_hz: int | None) -> int:
        """The cap now, when someone else (the native executor) wrote max_freq last:
        ``written_max_hz`` is what it wrote; a lower max_freq is a cap to honour."""
        self._check_open()
        if written_max_hz is not None:
            self._last_max_hz = written_max_hz
        self._observe_max()
        return self._cap_hz

    def rebase(self) -> None:
        """Take the state now as the one to put back on close (after the caller put
        back a state that a dead owner left)."""
        self._initial = self.snapshot()
        self._cap_hz = self._initial.max_hz

    def health(self) -> dict[str, object]:
        """Foreign writes seen, lock, state file and guardian (for stats())."""
        return {**self.foreign_write_health(), **self.ownership_health()}

    def _write_range(self, lo: int, hi: int, current_max: int) -> None:
        """Write min and max in an order that never makes min > max on the way. On a
        local tree, read back before (did someone change what we wrote last?) and
        after (did our write stick?): foreign writes are logged and counted, not
        fought."""
        if self.read_back and self._last_written is not None:
            now = (self._read_int("min_freq"), self._read_int("max_freq"))
            if now != self._last_written:
                self._note_foreign_write(
                    f"min/max changed to {now[0]}-{now[1]} Hz since we wrote "
                    f"{self._last_written[0]}-{self._last_written[1]} Hz"
                )
            current_max = now[1]
        if lo > current_max:
            self.io.write(self._f("max_freq"), str(hi))
            self.io.write(self._f("min_freq"), str(lo))
        else:
            self.io.write(self._f("min_freq"), str(lo))
            self.io.write(self._f("max_freq"), str(hi))
        self._last_max_hz = hi
        self._last_written = (lo, hi)
        if self.read_back:
            back = (self._read_int("min_freq"), self._read_int("max_freq"))
            if back != (lo, hi):
                self._note_foreign_write(
                    f"wrote min/max {lo}-{hi} Hz, read back {back[0]}-{back[1]} Hz"
                )
                self._last_written = back

    # ---- native plan executor ------------------------------------------------------

    def native_actuator(self) -> NativeActuator:
        """What ``set_hz`` writes for each level, for the native executor: the pinned
        min/max pair in Hz, or ``userspace/set_freq`` when that governor is active.
        Capped at the thermal cap known now. Local trees only."""
        if type(self.io) is not LocalSysfs:  # a wrapped IO (faults, tests) sees every write
            raise Unsupported(f"{self.name}: the native executor writes local files only")
        root = self.io.root

        def local(name: str) -> str:
            return str(root / self._f(name).lstrip("/"))

        values = tuple(str(self._capped(h)) for h in self._levels)
        if self._userspace:
            return SysfsOneActuator(local("userspace/set_freq"), values)
        state = self.snapshot()
        return SysfsPairActuator(
            local("min_freq"),
            local("max_freq"),
            values,
            values,
            initial_floor=level_index(self._levels, state.min_hz),
            initial_ceiling=level_index(self._levels, state.max_hz),
        )


def find_gpu_devfreq(io: SysfsIO) -> list[str]:
    """devfreq device paths whose names look like GPUs."""
    if not io.exists(DEVFREQ_CLASS):
        return []
    return [
        f"{DEVFREQ_CLASS}/{name}"
        for name in io.listdir(DEVFREQ_CLASS)
        if any(h in name.lower() for h in GPU_NAME_HINTS)
        and io.exists(f"{DEVFREQ_CLASS}/{name}/available_frequencies")
    ]


def resolve(io: SysfsIO, arg: str | None) -> str:
    """The devfreq path for ``arg``: a path, a name under /sys/class/devfreq, or (None)
    the only GPU-like devfreq device."""
    if arg:
        path = arg if arg.startswith("/") else f"{DEVFREQ_CLASS}/{arg}"
        if not io.exists(f"{path}/available_frequencies"):
            raise DeviceNotFound(f"no devfreq device at {path} ({io.describe()})")
        return path
    gpus = find_gpu_devfreq(io)
    if not gpus:
        raise DeviceNotFound(f"no GPU devfreq device under {DEVFREQ_CLASS} ({io.describe()})")
    if len(gpus) > 1:
        log.info("several GPU devfreq devices (%s); using %s", ", ".join(gpus), gpus[0])
    return gpus[0]


@functools.lru_cache(maxsize=32)
def available(arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    io = LocalSysfs(root)
    try:
        path = resolve(io, arg)
    except DeviceError as e:
        log.debug("devfreq not available: %s", e)
        return False, str(e)
    if not (io.writable(f"{path}/min_freq") and io.writable(f"{path}/max_freq")):
        why = f"{path}/min_freq and max_freq are not writable (run as root or chmod them)"
        log.debug("devfreq not available: %s", why)
        return False, why
    return True, f"devfreq GPU at {path}"


def open_backend(arg: str | None = None, *, root: str = "/") -> DevfreqGpu:
    io = LocalSysfs(root)
    return DevfreqGpu(io, resolve(io, arg))
