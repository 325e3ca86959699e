"""devices/kmod.py against a fake /dev/turboinfer.

The fd is a FIFO (the read path: the test writes sampler records into it); ioctls go
to ``FakeTurboinfer``, which implements the module's ABI in Python and checks that
each call passes the struct type and size its ioctl number encodes. Together with
test_kmod_layout.py this covers every ioctl call site.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from pathlib import Path

import pytest

from turboinfer_llama.devices import kmod
from turboinfer_llama.devices.base import (
    DeviceError,
    DeviceGone,
    DeviceNotFound,
    GpuDevice,
    InvalidFrequency,
    PermissionDenied,
    Unsupported,
)

ADRENO650_HZ = [
    305_000_000,
    400_000_000,
    441_600_000,
    490_000_000,
    525_000_000,
    587_000_000,
    670_000_000,
]
ALL_IOCTLS = {
    kmod.TI_GET_INFO: kmod.TiInfo,
    kmod.TI_SET_FREQ: kmod.TiSetFreq,
    kmod.TI_SET_RANGE: kmod.TiRange,
    kmod.TI_RELEASE: None,
    kmod.TI_GET_STATS: kmod.TiStats,
    kmod.TI_SAMPLE_CONFIG: kmod.TiSampleConfig,
}


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class FakeTurboinfer:
    """turboinfer.ko's ioctl semantics in Python, for one open file.

    The governor is simple_ondemand with total_time 0 (as on the virtual GPU): the
    clock is the top of the allowed range, and the smallest max request wins.
    """

    def __init__(
        self, levels: list[int] = ADRENO650_HZ, *, flags: int = kmod.TI_INFO_F_VIRTUAL
    ) -> None:
        self.levels = sorted(levels)
        self.flags = flags
        self.abi = kmod.TI_ABI_VERSION
        self.cooling_state = 0
        self.pin: tuple[int, int] | None = None
        self.sampler_period_ns = 0
        self.busy_ns = 1_000
        self.total_ns = 10_000
        self.instructions = 123_456
        self.t_ns = 5_000_000
        self.calls: list[int] = []
        self.fail_with: int | None = None

    @property
    def cap_hz(self) -> int:
        return self.levels[len(self.levels) - 1 - self.cooling_state]

    @property
    def cur_hz(self) -> int:
        top = self.cap_hz if self.pin is None else min(self.cap_hz, self.pin[1])
        return top

    def _snap(self, hz: int) -> int:
        return min(self.levels, key=lambda lv: (abs(lv - hz), -lv))

    def ioctl(self, fd: int, request: int, arg: object, mutate: bool = True) -> int:
        assert mutate is True
        os.fstat(fd)  # a real, open fd
        self.calls.append(request)
        if (request >> 8) & 0xFF != kmod.TI_IOC_MAGIC or request not in ALL_IOCTLS:
            raise _err(errno.ENOTTY)
        expected = ALL_IOCTLS[request]
        size = (request >> 16) & 0x3FFF
        if expected is None:
            assert arg == 0 and size == 0
        else:
            assert type(arg) is expected, f"{type(arg).__name__} passed to {expected.__name__}"
            assert ctypes.sizeof(arg) == size
        if self.fail_with is not None:
            raise _err(self.fail_with)
        handler = {
            kmod.TI_GET_INFO: self._info,
            kmod.TI_SET_FREQ: self._set_freq,
            kmod.TI_SET_RANGE: self._set_range,
            kmod.TI_RELEASE: self._release,
            kmod.TI_GET_STATS: self._stats,
            kmod.TI_SAMPLE_CONFIG: self._sample_config,
        }[request]
        handler(arg)
        return 0

    def _info(self, info: kmod.TiInfo) -> None:
        info.abi_version = self.abi
        info.num_freqs = len(self.levels)
        info.flags = self.flags
        info.cooling_state = self.cooling_state
        info.max_cooling_state = len(self.levels) - 1
        info.cur_freq_hz = self.cur_hz
        info.cooling_cap_hz = self.cap_hz
        for i, hz in enumerate(self.levels):
            info.freqs_hz[i] = hz
        info.name = b"turboinfer-vgpu"

    def _set_freq(self, req: kmod.TiSetFreq) -> None:
        if req.flags & ~kmod.TI_SET_FREQ_F_EXACT or getattr(
            req, "__pad0"
        ):  # by name: __pad0 would be mangled
            raise _err(errno.EINVAL)
        if not self.levels[0] <= req.freq_hz <= self.levels[-1]:
            raise _err(errno.ERANGE)
        if req.flags & kmod.TI_SET_FREQ_F_EXACT and req.freq_hz not in self.levels:
            raise _err(errno.EINVAL)
        level = min(self._snap(req.freq_hz), self.cap_hz)
        self.pin = (level, level)
        self.t_ns = time.monotonic_ns()  # the module stamps CLOCK_MONOTONIC, as now_ns
        req.target_hz, req.applied_hz, req.t_ns = level, self.cur_hz, self.t_ns

    def _set_range(self, req: kmod.TiRange) -> None:
        if req.min_hz > req.max_hz:
            raise _err(errno.EINVAL)
        if req.min_hz < self.levels[0] or req.max_hz > self.levels[-1]:
            raise _err(errno.ERANGE)
        inside = [lv for lv in self.levels if req.min_hz <= lv <= req.max_hz]
        if not inside:
            raise _err(errno.EINVAL)
        hi = min(inside[-1], self.cap_hz)
        lo = min(inside[0], hi)
        self.pin = (lo, hi)
        req.applied_min_hz, req.applied_max_hz, req.cur_freq_hz = lo, hi, self.cur_hz

    def _release(self, _arg: int) -> None:
        self.pin = None

    def _stats(self, st: kmod.TiStats) -> None:
        self.t_ns += 1_000
        st.t_ns, st.cur_freq_hz = self.t_ns, self.cur_hz
        st.busy_ns, st.total_ns = self.busy_ns, self.total_ns
        st.instructions = self.instructions
        st.flags = kmod.TI_STATS_F_BUSY_SIMULATED
        if self.flags & kmod.TI_INFO_F_HAS_PMU:
            st.flags |= kmod.TI_STATS_F_PMU

    def _sample_config(self, cfg: kmod.TiSampleConfig) -> None:
        if cfg.flags & ~kmod.TI_SAMPLE_F_ENABLE or getattr(
            cfg, "__pad0"
        ):  # by name: __pad0 would be mangled
            raise _err(errno.EINVAL)
        if cfg.flags & kmod.TI_SAMPLE_F_ENABLE:
            if not kmod.TI_SAMPLE_PERIOD_MIN_NS <= cfg.period_ns <= kmod.TI_SAMPLE_PERIOD_MAX_NS:
                raise _err(errno.EINVAL)
            self.sampler_period_ns = cfg.period_ns
        elif cfg.period_ns:
            raise _err(errno.EINVAL)
        else:
            self.sampler_period_ns = 0


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "turboinfer"
    os.mkfifo(path)
    return path


@pytest.fixture
def fake() -> FakeTurboinfer:
    return FakeTurboinfer()


@pytest.fixture
def dev(fifo: Path, fake: FakeTurboinfer):
    device = kmod.KmodDevice(str(fifo), ioctl=fake.ioctl)
    yield device
    device.close()


def _record(seq: int, t_ns: int, *, flags: int = kmod.TI_STATS_F_BUSY_SIMULATED) -> bytes:
    rec = kmod.TiSample(
        t_ns=t_ns,
        freq_hz=490_000_000,
        busy_ns=seq * 60,
        total_ns=seq * 100,
        instructions=7 * seq,
        seq=seq,
        flags=flags,
    )
    return bytes(rec)


def test_open_reads_info_and_labels_the_virtual_gpu_simulated(dev: kmod.KmodDevice) -> None:
    assert isinstance(dev, GpuDevice)
    assert dev.name == "kmod:turboinfer-vgpu"
    assert dev.frequencies_hz() == ADRENO650_HZ
    assert dev.current_hz() == 670_000_000
    caps = dev.capabilities
    assert caps.can_set and caps.simulated and not caps.has_pmu
    assert any("simulated" in n for n in caps.notes)
    assert caps.switch_latency_source.startswith("assumption")


def test_set_hz_snaps_returns_applied_and_measures_latency(
    dev: kmod.KmodDevice, fake: FakeTurboinfer
) -> None:
    assert dev.set_hz(500_000_000) == 490_000_000
    assert fake.pin == (490_000_000, 490_000_000)
    assert dev.current_hz() == 490_000_000
    assert dev.capabilities.switch_latency_source.startswith("measured")
    assert dev.capabilities.switch_latency_ns > 0


def test_set_hz_never_exceeds_the_cooling_cap(dev: kmod.KmodDevice, fake: FakeTurboinfer) -> None:
    fake.cooling_state = 3
    for hz in ADRENO650_HZ:
        assert dev.set_hz(hz) <= 490_000_000
    assert dev.info().cooling_cap_hz == 490_000_000


@pytest.mark.parametrize("hz", [0, -5, 100, 10_000_000_000])
def test_set_hz_out_of_table_is_invalid_frequency(dev: kmod.KmodDevice, hz: int) -> None:
    with pytest.raises(InvalidFrequency, match=r"305 MHz.*670 MHz"):
        dev.set_hz(hz)


def test_set_range_and_its_rejections(dev: kmod.KmodDevice, fake: FakeTurboinfer) -> None:
    dev.set_range(350_000_000, 500_000_000)
    assert fake.pin == (400_000_000, 490_000_000)
    state = dev.snapshot()
    assert (state.min_hz, state.max_hz, state.extra["pinned"]) == (400_000_000, 490_000_000, True)
    with pytest.raises(InvalidFrequency, match="min > max"):
        dev.set_range(500_000_000, 400_000_000)
    with pytest.raises(InvalidFrequency, match="outside the table"):
        dev.set_range(1_000, 500_000_000)
    with pytest.raises(InvalidFrequency, match="rejected"):
        dev.set_range(450_000_000, 480_000_000)  # no level inside


def test_snapshot_restore_release(dev: kmod.KmodDevice, fake: FakeTurboinfer) -> None:
    initial = dev.snapshot()
    assert initial.extra["pinned"] is False
    dev.set_hz(305_000_000)
    pinned = dev.snapshot()
    dev.restore(initial)
    assert fake.pin is None
    dev.restore(pinned)
    assert fake.pin == (305_000_000, 305_000_000)
    dev.release()
    assert fake.pin is None


def test_read_counters_are_cumulative_since_open(
    dev: kmod.KmodDevice, fake: FakeTurboinfer
) -> None:
    fake.busy_ns += 600
    fake.total_ns += 1_000
    c = dev.read_counters()
    assert (c.busy_ns, c.total_ns, c.freq_hz) == (600, 1_000, 670_000_000)
    assert c.instructions is None  # no PMU flag
    assert c.ts_ns == fake.t_ns
    assert dev.stats().transitions == 0


def test_pmu_counts_when_the_module_has_one(fifo: Path) -> None:
    fake = FakeTurboinfer(flags=kmod.TI_INFO_F_HAS_PMU)
    with kmod.KmodDevice(str(fifo), ioctl=fake.ioctl) as dev:
        assert dev.capabilities.has_pmu and not dev.capabilities.simulated
        assert dev.read_counters().instructions == 123_456


def test_close_releases_closes_and_is_idempotent(fifo: Path, fake: FakeTurboinfer) -> None:
    dev = kmod.KmodDevice(str(fifo), ioctl=fake.ioctl)
    fd = dev._fd
    dev.set_hz(400_000_000)
    dev.start_sampler(200_000)
    dev.close()
    assert fake.pin is None and fake.sampler_period_ns == 0
    assert fake.calls[-2:] == [kmod.TI_SAMPLE_CONFIG, kmod.TI_RELEASE]
    with pytest.raises(OSError):
        os.fstat(fd)
    n = len(fake.calls)
    dev.close()
    assert len(fake.calls) == n
    with pytest.raises(DeviceGone):
        dev.set_hz(400_000_000)
    with pytest.raises(DeviceGone):
        dev.read_counters()


def test_sampler_config_and_read_path(
    dev: kmod.KmodDevice, fake: FakeTurboinfer, fifo: Path
) -> None:
    with pytest.raises(ValueError, match="100000"):
        dev.start_sampler(50_000)
    dev.start_sampler(250_000)
    assert fake.sampler_period_ns == 250_000
    assert dev.read_samples(timeout_s=0.0) == []
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        lost = kmod.TI_STATS_F_BUSY_SIMULATED | kmod.TI_SAMPLE_F_LOST
        os.write(writer, _record(1, 1_000) + _record(2, 2_000) + _record(5, 3_000, flags=lost))
        samples = dev.read_samples(max_records=8, timeout_s=1.0)
    finally:
        os.close(writer)
    assert [s.seq for s in samples] == [1, 2, 5]
    assert [s.lost_before for s in samples] == [False, False, True]
    assert samples[1].busy_ns == 120 and samples[1].total_ns == 200
    assert samples[0].instructions is None
    dev.stop_sampler()
    assert fake.sampler_period_ns == 0


def test_read_samples_keeps_whole_records_and_pmu(dev: kmod.KmodDevice, fifo: Path) -> None:
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, _record(1, 10, flags=kmod.TI_STATS_F_PMU) * 3)
        first = dev.read_samples(max_records=2, timeout_s=1.0)
        rest = dev.read_samples(max_records=2, timeout_s=1.0)
    finally:
        os.close(writer)
    assert len(first) == 2 and len(rest) == 1
    assert first[0].instructions == 7
    with pytest.raises(DeviceError, match="multiple"):
        kmod.parse_samples(b"\0" * (kmod.SAMPLE_SIZE + 3))


def test_every_ioctl_call_site_uses_its_declared_struct(
    dev: kmod.KmodDevice, fake: FakeTurboinfer
) -> None:
    dev.current_hz()
    dev.set_hz(441_600_000)
    dev.set_range(305_000_000, 670_000_000)
    dev.read_counters()
    dev.start_sampler(100_000)
    dev.stop_sampler()
    dev.release()
    assert set(fake.calls) == set(ALL_IOCTLS)


@pytest.mark.parametrize(
    ("code", "exc", "words"),
    [
        (errno.EACCES, PermissionDenied, ("root", "chmod", "insmod")),
        (errno.EBADF, PermissionDenied, ("read-only", "chmod")),
        (errno.ENODEV, DeviceGone, ("gone",)),
        (errno.ENOTTY, Unsupported, ("ABI",)),
        (errno.EFAULT, DeviceError, ("Bad address",)),
    ],
)
def test_os_errors_map_to_our_hierarchy(
    dev: kmod.KmodDevice,
    fake: FakeTurboinfer,
    code: int,
    exc: type[Exception],
    words: tuple[str, ...],
) -> None:
    fake.fail_with = code
    with pytest.raises(exc) as info:
        dev.set_hz(400_000_000)
    assert isinstance(info.value.__cause__, OSError)
    for w in words:
        assert w in str(info.value)
    fake.fail_with = None


def test_open_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DeviceNotFound, match="insmod"):
        kmod.KmodDevice(str(tmp_path / "missing"))

    def denied(*_a: object, **_k: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(kmod.os, "open", denied)
    with pytest.raises(PermissionDenied, match=r"sudo chmod 0666 .*insmod"):
        kmod.KmodDevice("/dev/turboinfer")


def test_abi_mismatch_is_unsupported_and_closes_the_fd(
    fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTurboinfer()
    fake.abi = 99
    opened: list[int] = []
    real_open = os.open

    def spy(*a: object, **k: object) -> int:
        fd = real_open(*a, **k)  # type: ignore[arg-type]
        opened.append(fd)
        return fd

    monkeypatch.setattr(kmod.os, "open", spy)
    with pytest.raises(Unsupported, match="ABI 99"):
        kmod.KmodDevice(str(fifo), ioctl=fake.ioctl)
    with pytest.raises(OSError):
        os.fstat(opened[0])


@pytest.fixture
def fresh_probe():
    kmod.available.cache_clear()
    yield
    kmod.available.cache_clear()


def test_available_says_why_not(tmp_path: Path, fresh_probe: None) -> None:
    ok, why = kmod.available(root=str(tmp_path))
    assert not ok and "not loaded" in why and "insmod" in why
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "turboinfer").write_text("")
    ok, why = kmod.available(root=str(tmp_path))
    assert ok is False  # cached: the probe result does not change within a run
    kmod.available.cache_clear()
    ok, why = kmod.available(root=str(tmp_path))
    assert not ok and "not a character device" in why


def test_available_rejects_a_char_device_that_is_not_ours(
    tmp_path: Path, fresh_probe: None
) -> None:
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/null", tmp_path / "dev" / "turboinfer")
    ok, why = kmod.available(root=str(tmp_path))
    assert not ok and "not a turboinfer device" in why


def test_open_backend_resolves_under_root(tmp_path: Path) -> None:
    with pytest.raises(DeviceNotFound, match=str(tmp_path)):
        kmod.open_backend(root=str(tmp_path))
    with pytest.raises(DeviceNotFound, match="elsewhere"):
        kmod.open_backend("/dev/elsewhere", root=str(tmp_path))
