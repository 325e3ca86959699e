"""The native executor's sysfs actuators on fake trees, counted from the tree's side.

Evidence comes from the files, never from the executor's log: an inotify watcher sees
every write (IN_MODIFY), in order, and reads both files back after each one. Switches
are spaced 40+ ms apart so the watcher reads every event before the next write (inotify
merges identical unread events).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import stat
import struct
import threading
import time
from pathlib import Path

import pytest
from fakesysfs import make_exynos_mali, make_oneplus8_kgsl

from turboinfer_llama._clock import now_ns
from turboinfer_llama.control.plan import Anchor, Plan, Switch
from turboinfer_llama.devices.base import Unsupported
from turboinfer_llama.devices.devfreq import DevfreqGpu
from turboinfer_llama.devices.kgsl import KgslGpu
from turboinfer_llama.devices.sysfs_io import LocalSysfs
from turboinfer_llama.engine import executor as native_exec

pytestmark = pytest.mark.skipif(
    not native_exec.EXECUTOR_AVAILABLE, reason="native executor library not built"
)

MS = 1_000_000
IN_MODIFY = 0x2
_EVENT = struct.Struct("iIII")


def first_int(path: Path) -> int:
    return int(path.read_text().split()[0])


class Watcher:
    """inotify IN_MODIFY on a few files (libc through ctypes). ``events`` gets one
    ``(file name, {name: value read back})`` per write, in order."""

    def __init__(self, files: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.files = files
        self._wd: dict[int, Path] = {}
        for f in files:
            wd = self._libc.inotify_add_watch(self._fd, str(f).encode(), IN_MODIFY)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {f}")
            self._wd[wd] = f
        self.events: list[tuple[str, dict[str, int | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read_back(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for f in self.files:
            try:
                out[f.name] = first_int(f)
            except (ValueError, IndexError):
                out[f.name] = None  # caught mid-write (never expected on sysfs)
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.02)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            off = 0
            while off < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, off)
                off += _EVENT.size + length
                if mask & IN_MODIFY:
                    self.events.append((self._wd[wd].name, self._read_back()))

    def close(self) -> list[tuple[str, dict[str, int | None]]]:
        time.sleep(0.1)
        self._stop.set()
        self._thread.join()
        os.close(self._fd)
        return self.events


def strip_newline(*files: Path) -> None:
    """Fake files hold "value\\n"; the executor truncates a regular file after writing a
    shorter value (a second IN_MODIFY). Without the newline every write is one event."""
    for f in files:
        f.write_text(f.read_text().strip())


def spaced_plan(levels: list[int], first: int, end: int, gap_ms: int = 40) -> Plan:
    return Plan(
        first_level=first,
        end_level=end,
        switches=tuple(
            Switch(Anchor.OFFSET, gap_ms * MS * (i + 1), lv) for i, lv in enumerate(levels)
        ),
    )


def run_graph(ex: native_exec.NativeExecutor, plan: Plan, duration_s: float) -> None:
    """One graph at graph granularity: the asks at the scan, then the timed plan."""
    ex.set_plan(plan)
    ex.graph_begin(1)
    for n in range(20):
        ex.on_node(n, True, now_ns())
    time.sleep(duration_s)
    ex.graph_end()


def expected_writes(
    sequence: list[int], ceiling: int, floor_name: str, ceiling_name: str
) -> list[str]:
    """File names in the order a range-keeping writer must write them."""
    out = []
    for lv in sequence:
        if lv <= ceiling:
            out += [floor_name, ceiling_name]
        else:
            out += [ceiling_name, floor_name]
        ceiling = lv
    return out


def test_values_mirror_what_set_hz_writes(tmp_path: Path) -> None:
    """The native tables are exactly the strings each backend's set_hz writes."""
    paths = make_exynos_mali(tmp_path / "mali")
    gpu = DevfreqGpu(LocalSysfs(paths["root"]), "/sys/class/devfreq/18500000.mali")
    act = gpu.native_actuator()
    assert isinstance(act, native_exec.SysfsPairActuator)
    assert act.floor_path == str(paths["devfreq"] / "min_freq")
    for i, hz in enumerate(gpu.frequencies_hz()):
        gpu.set_hz(hz)
        assert (paths["devfreq"] / "min_freq").read_text() == act.floor_values[i]
        assert (paths["devfreq"] / "max_freq").read_text() == act.ceiling_values[i]
    gpu.close()

    kpaths = make_oneplus8_kgsl(tmp_path / "op8")
    kgsl = KgslGpu(LocalSysfs(kpaths["root"]), "/sys/class/kgsl/kgsl-3d0")
    kact = kgsl.native_actuator()
    assert isinstance(kact, native_exec.SysfsPairActuator)
    for i, hz in enumerate(kgsl.frequencies_hz()):
        kgsl.set_hz(hz)
        assert (kpaths["kgsl"] / "min_pwrlevel").read_text() == kact.floor_values[i]
        assert (kpaths["kgsl"] / "max_pwrlevel").read_text() == kact.ceiling_values[i]
    # pwrlevel 0 is the fastest: the table runs the other way
    assert kact.floor_values[-1] == "0" and kact.floor_values[0] == str(len(kact.floor_values) - 1)
    kgsl.close()


def test_devfreq_pair_writes_never_invert_the_range(tmp_path: Path) -> None:
    paths = make_exynos_mali(tmp_path)
    node = paths["devfreq"]
    gpu = DevfreqGpu(LocalSysfs(paths["root"]), "/sys/class/devfreq/18500000.mali")
    levels = gpu.frequencies_hz()
    act = gpu.native_actuator()
    assert isinstance(act, native_exec.SysfsPairActuator)
    assert (act.initial_floor, act.initial_ceiling) == (0, len(levels) - 1)
    sequence = [3, 9, 2, 11, 0, 6]
    strip_newline(node / "min_freq", node / "max_freq")
    watcher = Watcher([node / "min_freq", node / "max_freq"])
    with native_exec.NativeExecutor(levels, act) as ex:
        run_graph(ex, spaced_plan(sequence[1:-1], first=sequence[0], end=sequence[-1]), 0.3)
        status = ex.status()
    events = watcher.close()
    assert status["applied"] == len(sequence) and status["failed_errno"] == 0
    written = [name for name, _ in events]
    assert written == expected_writes(sequence, len(levels) - 1, "min_freq", "max_freq"), (
        "one write per file per switch, ceiling first going up, floor first going down"
    )
    for _, back in events:
        assert back["min_freq"] is not None and back["max_freq"] is not None
        assert back["min_freq"] <= back["max_freq"]
    # the levels the device went through, read back after each switch's second write
    pinned = [back["min_freq"] for _, back in events[1::2]]
    assert pinned == [levels[lv] for lv in sequence]
    assert first_int(node / "min_freq") == first_int(node / "max_freq") == levels[sequence[-1]]
    gpu.close()  # the device backend restores what it found
    assert (first_int(node / "min_freq"), first_int(node / "max_freq")) == (levels[0], levels[-1])


def test_kgsl_pwrlevel_pair_keeps_max_pwrlevel_at_or_below_min(tmp_path: Path) -> None:
    paths = make_oneplus8_kgsl(tmp_path)
    kgsl_dir = paths["kgsl"]
    gpu = KgslGpu(LocalSysfs(paths["root"]), "/sys/class/kgsl/kgsl-3d0")
    levels = gpu.frequencies_hz()
    act = gpu.native_actuator()
    assert isinstance(act, native_exec.SysfsPairActuator)
    sequence = [1, 6, 0, 4, 2]
    strip_newline(kgsl_dir / "min_pwrlevel", kgsl_dir / "max_pwrlevel")
    watcher = Watcher([kgsl_dir / "min_pwrlevel", kgsl_dir / "max_pwrlevel"])
    with native_exec.NativeExecutor(levels, act) as ex:
        run_graph(ex, spaced_plan(sequence[1:-1], first=sequence[0], end=sequence[-1]), 0.25)
    events = watcher.close()
    assert [n for n, _ in events] == expected_writes(
        sequence, act.initial_ceiling, "min_pwrlevel", "max_pwrlevel"
    )
    for _, back in events:  # the fastest allowed never faster-numbered than the slowest
        assert back["max_pwrlevel"] is not None and back["min_pwrlevel"] is not None
        assert back["max_pwrlevel"] <= back["min_pwrlevel"]
    top = len(levels) - 1
    assert [back["min_pwrlevel"] for _, back in events[1::2]] == [top - lv for lv in sequence]
    gpu.close()
    assert first_int(kgsl_dir / "min_pwrlevel") == top
    assert first_int(kgsl_dir / "max_pwrlevel") == 0


def test_devfreq_userspace_set_freq_is_one_file(tmp_path: Path) -> None:
    paths = make_exynos_mali(tmp_path)
    node = paths["devfreq"]
    (node / "governor").write_text("userspace\n")
    (node / "userspace").mkdir()
    (node / "userspace/set_freq").write_text("260000000")
    gpu = DevfreqGpu(LocalSysfs(paths["root"]), "/sys/class/devfreq/18500000.mali")
    act = gpu.native_actuator()
    assert isinstance(act, native_exec.SysfsOneActuator)
    levels = gpu.frequencies_hz()
    sequence = [4, 10, 1, 7]
    watcher = Watcher([node / "userspace/set_freq"])
    with native_exec.NativeExecutor(levels, act) as ex:
        run_graph(ex, spaced_plan(sequence[1:-1], first=sequence[0], end=sequence[-1]), 0.2)
    events = watcher.close()
    assert [back["set_freq"] for _, back in events] == [levels[lv] for lv in sequence]
    assert (node / "min_freq").read_text().strip() == str(levels[0])  # untouched
    gpu.close()


def test_shorter_value_on_a_regular_file_leaves_no_tail(tmp_path: Path) -> None:
    """pwrite at offset 0 of a shorter value: a fake tree file is truncated so it reads
    like the attribute (sysfs itself replaces the value)."""
    f = tmp_path / "set_freq"
    f.write_text("306000000\n")
    levels = [306_000_000, 1_300_500_000]
    act = native_exec.SysfsOneActuator(str(f), tuple(str(h) for h in levels))
    with native_exec.NativeExecutor(levels, act) as ex:
        ex.switch_now(1)
        assert f.read_text() == "1300500000"
        ex.switch_now(0)
        assert f.read_text() == "306000000"


# ---- faults -----------------------------------------------------------------------


def test_missing_file_fails_at_create_with_enoent(tmp_path: Path) -> None:
    act = native_exec.SysfsOneActuator(str(tmp_path / "gone"), ("1", "2"))
    with pytest.raises(native_exec.ExecutorError, match="ENOENT"):
        native_exec.NativeExecutor([1, 2], act)


def test_failed_write_stops_the_executor_and_reports_errno(tmp_path: Path) -> None:
    """The ceiling is /dev/full: its write fails with ENOSPC even as root. Going down
    writes the floor first, then the ceiling fails: the executor stops, no further
    write lands, the errno is in the status and the log."""
    floor = tmp_path / "min_freq"
    floor.write_text("300\n")
    act = native_exec.SysfsPairActuator(
        str(floor), "/dev/full", ("100", "200", "300"), ("100", "200", "300"), 0, 2
    )
    with native_exec.NativeExecutor([100, 200, 300], act) as ex:
        ex.switch_now(1)
        status = ex.status()
        assert status["stopped"] == 1 and status["failed_errno"] == errno.ENOSPC
        raw = ex.drain_raw()
        assert raw["level"].tolist() == [1] and raw["err"].tolist() == [errno.ENOSPC]
        mtime = floor.stat().st_mtime_ns
        content = floor.read_text()
        assert content == "200"  # the floor write landed before the ceiling failed
        ex.switch_now(0)
        ex.set_plan(Plan(first_level=2, switches=(Switch(Anchor.OFFSET, 10 * MS, 0),)))
        ex.graph_begin(1)
        ex.on_node(0, True, now_ns())
        time.sleep(0.05)
        ex.graph_end()
        assert floor.stat().st_mtime_ns == mtime and floor.read_text() == content
        assert ex.drain_log() == [] and ex.status()["applied"] == 0


def test_failed_write_errno_is_in_the_raw_log(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the O_WRONLY open succeeds
    try:
        act = native_exec.SysfsOneActuator(str(fifo), ("1", "2"))
        with native_exec.NativeExecutor([1, 2], act) as ex:
            assert stat.S_ISFIFO(os.stat(fifo).st_mode)
            ex.switch_now(1)  # pwrite on a pipe: ESPIPE, whatever the permissions
            raw = ex.drain_raw()
            assert raw["err"].tolist() == [errno.ESPIPE]
            assert ex.status()["failed_errno"] == errno.ESPIPE
    finally:
        os.close(reader)


def test_stop_joins_and_no_write_lands_after_it(tmp_path: Path) -> None:
    f = tmp_path / "set_freq"

    def timed_run(stop_early: bool) -> tuple[str, bool, str]:
        """(content after the timed switch's deadline, mtime changed, content after a
        switch_now)."""
        f.write_text("1")
        mtime = f.stat().st_mtime_ns
        act = native_exec.SysfsOneActuator(str(f), ("1", "2", "3"))
        with native_exec.NativeExecutor([1, 2, 3], act, initial_level=0) as ex:
            ex.set_plan(Plan(switches=(Switch(Anchor.TIME, now_ns() + 80 * MS, 2),)))
            if stop_early:
                ex.stop()
            time.sleep(0.25)
            after = (f.read_text(), f.stat().st_mtime_ns != mtime)
            ex.switch_now(1)
            return (*after, f.read_text())

    assert timed_run(stop_early=False) == ("3", True, "2")  # control: both land
    assert timed_run(stop_early=True) == ("1", False, "1")  # nothing after stop()


def test_log_overflow_is_counted_and_never_blocks() -> None:
    with native_exec.NativeExecutor([1, 2], native_exec.RecordActuator(), log_capacity=4) as ex:
        for i in range(20):
            ex.switch_now(i % 2)
        status = ex.status()
        assert status["applied"] == 20 and status["log_overflow"] == 16
        assert [a.level for a in ex.drain_log()] == [0, 1, 0, 1]
        ex.switch_now(0)
        assert [a.level for a in ex.drain_log()] == [0]


def test_kmod_actuator_issues_the_ioctl(tmp_path: Path) -> None:
    """The KMOD actuator really calls ioctl(TI_SET_FREQ): on a file that is no turboinfer
    device the kernel answers ENOTTY, which stops the executor. (The real device is
    driven in the kernel module's qemu boot test.)"""
    not_a_device = tmp_path / "turboinfer"
    not_a_device.write_text("")

    def open_on_it() -> int:  # this process's descriptors open on the stand-in file
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if _resolves_to(fd, not_a_device))

    with native_exec.NativeExecutor([1, 2], native_exec.KmodActuator(str(not_a_device))) as ex:
        assert open_on_it() == 1
        ex.switch_now(1)
        raw = ex.drain_raw()
        assert raw["err"].tolist() == [errno.ENOTTY]
        assert ex.status()["failed_errno"] == errno.ENOTTY
        # the failed executor let go of the module's fd at once (its frequency request
        # goes with the fd's last close), not only when it is destroyed
        assert open_on_it() == 0


def _resolves_to(fd: Path, target: Path) -> bool:
    try:
        return os.readlink(fd) == str(target)
    except OSError:  # closed meanwhile (the listing's own descriptor)
        return False


def test_device_backends_describe_their_native_actuator(tmp_path: Path) -> None:
    from test_kmod_device import FakeTurboinfer

    from turboinfer_llama.devices.kmod import KmodDevice
    from turboinfer_llama.devices.sim import SimGpu

    assert SimGpu().native_actuator() == native_exec.RecordActuator()
    fifo = tmp_path / "turboinfer"
    os.mkfifo(fifo)
    dev = KmodDevice(str(fifo), ioctl=FakeTurboinfer().ioctl)
    try:
        # a user-space stand-in cannot take the native ioctl: the executor is Python
        with pytest.raises(Unsupported, match="character device"):
            dev.native_actuator()
    finally:
        dev.close()
    if os.geteuid() == 0:  # the kernel's device is a character device
        chr_dev = tmp_path / "chr"
        os.mknod(chr_dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.unlink(fifo)
        os.symlink(chr_dev, fifo)
        dev = KmodDevice(str(fifo), ioctl=FakeTurboinfer().ioctl)
        try:
            assert dev.native_actuator() == native_exec.KmodActuator(str(fifo))
        finally:
            dev.close()


def _capped_run(ex: native_exec.NativeExecutor, ceiling: Path, cap_value: str) -> list[int]:
    """Switch high, let a thermal daemon write ``cap_value`` into the ceiling file, then
    ask for more, for less and for more again: the levels the executor applied."""
    ex.switch_now(10)
    ceiling.write_text(cap_value)  # a thermal daemon, between two of our switches
    for level in (11, 2, 9):
        ex.switch_now(level)
    return [a.level for a in ex.drain_log()]


def test_a_cap_written_between_two_switches_is_never_exceeded(tmp_path: Path) -> None:
    """Issue 11's one-graph ``max_freq`` cap window: the governor reads the device's max
    before each graph, but a cap written mid-graph used to be overwritten by the next
    raise. The executor reads the ceiling back before each switch: a value it did not
    write is a cap, and no later switch goes above it (devfreq Hz and KGSL power levels,
    which run the other way)."""
    paths = make_exynos_mali(tmp_path / "mali")
    node = paths["devfreq"]
    gpu = DevfreqGpu(LocalSysfs(paths["root"]), "/sys/class/devfreq/18500000.mali")
    levels = gpu.frequencies_hz()
    with native_exec.NativeExecutor(levels, gpu.native_actuator()) as ex:
        applied = _capped_run(ex, node / "max_freq", f"{levels[4]}\n")
        assert first_int(node / "max_freq") <= levels[4]
    assert applied == [10, 4, 2, 4], applied
    gpu.close()

    kpaths = make_oneplus8_kgsl(tmp_path / "kgsl")
    kgsl = KgslGpu(LocalSysfs(kpaths["root"]), "/sys/class/kgsl/kgsl-3d0")
    klevels = kgsl.frequencies_hz()
    kact = kgsl.native_actuator()
    assert isinstance(kact, native_exec.SysfsPairActuator)
    top = len(klevels) - 1
    with native_exec.NativeExecutor(klevels, kact) as ex:
        ex.switch_now(top)
        # capped at power level 2: two below the fastest (power level 0 is the top)
        (kpaths["kgsl"] / "max_pwrlevel").write_text("2\n")
        for level in (top, 1, top - 1):
            ex.switch_now(level)
        applied = [a.level for a in ex.drain_log()]
        assert first_int(kpaths["kgsl"] / "max_pwrlevel") >= 2  # never a faster one
    assert applied == [top, top - 2, 1, top - 2], applied
    kgsl.close()
