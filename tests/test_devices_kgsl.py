"""KGSL backend on a fake OnePlus 8 tree, and the perfcounter ioctl byte layouts."""

from __future__ import annotations

import ctypes
import struct

import pytest
from fakesysfs import ONEPLUS8_GPU_HZ, make_oneplus8_kgsl, write

from turboinfer_llama.devices import kgsl
from turboinfer_llama.devices.base import DeviceGone, InvalidFrequency, PermissionDenied
from turboinfer_llama.devices.kgsl import KgslGpu, available, open_backend
from turboinfer_llama.devices.sysfs_io import LocalSysfs


def read(p) -> str:
    return p.read_text().strip()


@pytest.fixture
def phone(tmp_path):
    return make_oneplus8_kgsl(tmp_path)


def test_reads_the_oneplus8_table(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    assert gpu.frequencies_hz() == sorted(ONEPLUS8_GPU_HZ)
    assert gpu.current_hz() == 305_000_000
    assert gpu.governor == "msm-adreno-tz"
    assert gpu.level_of(670_000_000) == 0 and gpu.level_of(305_000_000) == 6
    assert gpu.capabilities.can_set and not gpu.capabilities.has_pmu  # no /dev in a fake tree
    gpu.close()


def test_set_hz_pins_both_pwrlevels_and_snaps(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    assert gpu.set_hz(500_000_000) == 490_000_000
    assert read(phone["kgsl"] / "max_pwrlevel") == read(phone["kgsl"] / "min_pwrlevel") == "3"
    gpu.set_range(400_000_000, 587_000_000)
    assert read(phone["kgsl"] / "max_pwrlevel") == "1"
    assert read(phone["kgsl"] / "min_pwrlevel") == "5"
    with pytest.raises(InvalidFrequency):
        gpu.set_range(587_000_000, 400_000_000)
    gpu.close()


class WriteLog(LocalSysfs):
    def __init__(self, root) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path.rsplit("/", 1)[-1], value))
        super().write(path, value)


def test_pwrlevel_writes_never_cross(phone) -> None:
    io = WriteLog(phone["root"])
    gpu = KgslGpu(io)
    gpu.set_hz(305_000_000)  # slower: min_pwrlevel (slowest) may stay, max moves down
    assert io.writes == [("min_pwrlevel", "6"), ("max_pwrlevel", "6")]
    io.writes.clear()
    gpu.set_hz(670_000_000)  # faster: max_pwrlevel first
    assert io.writes == [("max_pwrlevel", "0"), ("min_pwrlevel", "0")]
    gpu.close()


def test_thermal_pwrlevel_caps(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    write(phone["kgsl"] / "thermal_pwrlevel", 2)  # thermal allows 525 MHz at most
    assert gpu.set_hz(670_000_000) == 525_000_000
    assert read(phone["kgsl"] / "max_pwrlevel") == "2"
    gpu.set_range(305_000_000, 670_000_000)
    assert read(phone["kgsl"] / "max_pwrlevel") == "2"
    gpu.close()


def test_max_gpuclk_caps(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    write(phone["kgsl"] / "max_gpuclk", 500_000_000)
    assert gpu.set_hz(587_000_000) == 490_000_000
    gpu.close()


def test_close_restores_levels_and_governor(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    gpu.set_hz(441_600_000)
    write(phone["devfreq"] / "governor", "performance")
    gpu.close()
    assert read(phone["kgsl"] / "max_pwrlevel") == "0"
    assert read(phone["kgsl"] / "min_pwrlevel") == "6"
    assert read(phone["devfreq"] / "governor") == "msm-adreno-tz"
    with pytest.raises(DeviceGone):
        gpu.set_hz(441_600_000)


def test_restore_after_exception(phone) -> None:
    with pytest.raises(ValueError), open_backend(root=str(phone["root"])) as gpu:
        gpu.set_hz(305_000_000)
        raise ValueError("boom")
    assert read(phone["kgsl"] / "max_pwrlevel") == "0"


def test_gpubusy_counters(phone) -> None:
    gpu = open_backend(root=str(phone["root"]))
    c1, c2 = gpu.read_counters(), gpu.read_counters()
    # gpubusy says 12500 of 50000 us: 25% busy
    assert c2.busy_ns - c1.busy_ns == pytest.approx(0.25 * (c2.total_ns - c1.total_ns), abs=2)
    assert c2.freq_hz == 305_000_000 and c2.instructions is None
    gpu.close()


class ReadOnly(LocalSysfs):
    def write(self, path: str, value: str) -> None:
        raise PermissionDenied(f"cannot write {path}: permission denied; run as root (sudo)")

    def writable(self, path: str) -> bool:
        return False


def test_permission_denied(phone) -> None:
    gpu = KgslGpu(ReadOnly(phone["root"]))
    assert not gpu.capabilities.can_set
    with pytest.raises(PermissionDenied, match="root"):
        gpu.set_hz(587_000_000)
    gpu.close()


def test_available_reasons(tmp_path, phone) -> None:
    assert available(root=str(phone["root"]))[0]
    ok, why = available(root=str(tmp_path / "empty"))
    assert not ok and "no KGSL GPU" in why


# ---- perfcounter ioctl layouts (uapi msm_kgsl.h) -----------------------------------


def test_struct_sizes_and_offsets() -> None:
    assert ctypes.sizeof(kgsl.PerfcounterGet) == 20
    assert ctypes.sizeof(kgsl.PerfcounterPut) == 16
    assert ctypes.sizeof(kgsl.PerfcounterReadGroup) == 16
    assert kgsl.PerfcounterReadGroup.value.offset == 8
    # pointer (8) + count (4) + pad[2] (8) = 20, padded to 24 by the pointer's alignment
    assert ctypes.sizeof(kgsl.PerfcounterRead) == 24
    assert kgsl.PerfcounterRead.count.offset == 8
    assert ctypes.sizeof(kgsl.PerfcounterQuery) == 32
    assert kgsl.PerfcounterQuery.countables.offset == 8


def test_struct_bytes() -> None:
    get = kgsl.PerfcounterGet(groupid=0x0A, countable=40)
    assert bytes(get) == struct.pack("<5I", 0x0A, 40, 0, 0, 0)
    group = kgsl.PerfcounterReadGroup(groupid=0x1B, countable=0, value=2**40 + 5)
    assert bytes(group) == struct.pack("<IIQ", 0x1B, 0, 2**40 + 5)
    read = kgsl.PerfcounterRead(reads=0x1122334455667788, count=2)
    assert bytes(read) == struct.pack("<QI8x4x", 0x1122334455667788, 2)


def test_ioctl_numbers() -> None:
    # _IOWR('\x09', 0x38, 20 bytes) etc., as the kernel computes them on arm64
    assert kgsl.IOCTL_PERFCOUNTER_GET == 0xC0140938
    assert kgsl.IOCTL_PERFCOUNTER_PUT == 0x40100939
    assert kgsl.IOCTL_PERFCOUNTER_QUERY == 0xC020093A
    assert kgsl.IOCTL_PERFCOUNTER_READ == 0xC018093B
    assert (kgsl.KGSL_PERFCOUNTER_GROUP_SP, kgsl.KGSL_PERFCOUNTER_GROUP_ALWAYSON) == (0x0A, 0x1B)


def test_perfcounters_on_a_non_kgsl_file_fail_cleanly(tmp_path) -> None:
    fake = tmp_path / "kgsl-3d0"
    fake.write_bytes(b"")
    with pytest.raises(kgsl.DeviceError):
        kgsl.PerfCounters(str(fake))
