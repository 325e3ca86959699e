"""devfreq backend on fake Jetson Orin and Exynos Mali trees."""

from __future__ import annotations

import os

import pytest
from fakesysfs import ORIN_GPU_HZ, make_exynos_mali, make_jetson_orin, write

from turboinfer_llama.devices.base import (
    DeviceGone,
    InvalidFrequency,
    PermissionDenied,
    Unsupported,
)
from turboinfer_llama.devices.devfreq import DevfreqGpu, available, find_gpu_devfreq, open_backend
from turboinfer_llama.devices.sysfs_io import LocalSysfs

ORIN = "/sys/class/devfreq/17000000.ga10b"


class WriteLog(LocalSysfs):
    """LocalSysfs that records writes (to check their order)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path.rsplit("/", 1)[-1], value))
        super().write(path, value)


class ReadOnly(LocalSysfs):
    """A sysfs where every write is refused, as for a non-root user (we run as root)."""

    def write(self, path: str, value: str) -> None:
        raise PermissionDenied(f"cannot write {path}: permission denied; run as root or chmod")

    def writable(self, path: str) -> bool:
        return False


def read(p) -> str:
    return p.read_text().strip()


def test_reads_table_clock_and_governor(tmp_path) -> None:
    make_jetson_orin(tmp_path)
    with DevfreqGpu(LocalSysfs(tmp_path), ORIN) as gpu:
        assert gpu.frequencies_hz() == ORIN_GPU_HZ
        assert gpu.current_hz() == ORIN_GPU_HZ[-1]
        assert gpu.governor == "nvhost_podgov"
        assert gpu.capabilities.can_set and not gpu.capabilities.simulated


def test_set_snaps_and_clamps_min_max_in_safe_order(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    io = WriteLog(tmp_path)
    gpu = DevfreqGpu(io, ORIN)
    assert gpu.set_hz(600_000_000) == 612_000_000
    assert read(paths["devfreq"] / "min_freq") == read(paths["devfreq"] / "max_freq") == "612000000"
    # going down: min first would be fine, max first is needed when going up
    assert io.writes[:2] == [("min_freq", "612000000"), ("max_freq", "612000000")]
    io.writes.clear()
    gpu.set_hz(1_224_000_000)
    assert io.writes == [("max_freq", "1224000000"), ("min_freq", "1224000000")]
    gpu.set_range(400_000_000, 900_000_000)
    assert read(paths["devfreq"] / "min_freq") == "408000000"
    assert read(paths["devfreq"] / "max_freq") == "918000000"
    with pytest.raises(InvalidFrequency, match="MHz"):
        gpu.set_range(900_000_000, 400_000_000)
    with pytest.raises(InvalidFrequency):
        gpu.set_hz(-1)
    gpu.close()


def test_userspace_governor_uses_set_freq(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path, governor="userspace")
    gpu = DevfreqGpu(LocalSysfs(tmp_path), ORIN)
    gpu.set_hz(510_000_000)
    assert read(paths["devfreq"] / "userspace/set_freq") == "510000000"
    assert read(paths["devfreq"] / "min_freq") == str(ORIN_GPU_HZ[0])
    gpu.close()


def test_close_restores_state(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    gpu = open_backend(root=str(tmp_path))
    gpu.set_hz(306_000_000)
    write(paths["devfreq"] / "governor", "performance")  # someone switched it meanwhile
    gpu.close()
    assert read(paths["devfreq"] / "min_freq") == str(ORIN_GPU_HZ[0])
    assert read(paths["devfreq"] / "max_freq") == str(ORIN_GPU_HZ[-1])
    assert read(paths["devfreq"] / "governor") == "nvhost_podgov"
    gpu.close()  # idempotent
    with pytest.raises(DeviceGone):
        gpu.set_hz(306_000_000)


def test_restore_after_exception_in_with_block(tmp_path) -> None:
    paths = make_exynos_mali(tmp_path)
    with pytest.raises(RuntimeError), open_backend("18500000.mali", root=str(tmp_path)) as gpu:
        gpu.set_hz(100_000_000)
        raise RuntimeError("boom")
    assert read(paths["devfreq"] / "max_freq") == "702000000"
    assert read(paths["devfreq"] / "min_freq") == "100000000"


def test_thermal_cap_from_max_freq_at_open(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    write(paths["devfreq"] / "max_freq", 918_000_000)  # capped by someone else
    gpu = DevfreqGpu(LocalSysfs(tmp_path), ORIN)
    assert gpu.set_hz(1_300_500_000) == 918_000_000
    gpu.set_range(306_000_000, 1_300_500_000)
    assert read(paths["devfreq"] / "max_freq") == "918000000"
    gpu.close()
    assert read(paths["devfreq"] / "max_freq") == "918000000"


def test_cap_lowered_after_our_write_is_honoured(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    gpu = DevfreqGpu(LocalSysfs(tmp_path), ORIN)
    gpu.set_range(306_000_000, 1_300_500_000)
    write(paths["devfreq"] / "max_freq", 714_000_000)  # thermal QoS kicks in
    assert gpu.set_hz(1_300_500_000) == 714_000_000
    gpu.close()


def test_permission_errors_say_how_to_fix(tmp_path) -> None:
    make_jetson_orin(tmp_path)
    gpu = DevfreqGpu(ReadOnly(tmp_path), ORIN)
    assert not gpu.capabilities.can_set
    with pytest.raises(PermissionDenied, match="root"):
        gpu.set_hz(612_000_000)
    gpu.close()  # nothing changed, so restoring writes nothing and succeeds


def _as_nobody(fn) -> str:
    """Run ``fn`` in a forked child that dropped root for the nobody user; returns
    what it returned (a string), or the exception it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            out = str(fn())
        except BaseException as e:
            out = f"child raised {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_non_root_user_gets_permission_denied(tmp_path_factory) -> None:
    """A real EACCES: the backend runs as nobody against a read-only (0444) tree."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    root = tmp_path_factory.mktemp("perm")
    make_jetson_orin(root)
    base = tmp_path_factory.getbasetemp().parent  # /tmp/pytest-of-root: 0700 by default
    for d in [root, *root.parents]:
        d.chmod(d.stat().st_mode | 0o755)
        if d == base:
            break
    for name in ("min_freq", "max_freq"):
        (root / "sys/class/devfreq/17000000.ga10b" / name).chmod(0o444)

    def child() -> bool:
        ok, why = available(root=str(root))
        gpu = DevfreqGpu(LocalSysfs(root), ORIN)
        try:
            gpu.set_hz(612_000_000)
        except PermissionDenied as e:
            return f"{ok} | {why} | {e}"
        return "set_hz succeeded"

    out = _as_nobody(child)
    assert out.count(" | ") == 2, out
    ok, why, error = out.split(" | ")
    assert ok == "False" and "not writable" in why
    assert "permission denied" in error and "chmod" in error


def test_busy_readers_per_platform(tmp_path) -> None:
    make_jetson_orin(tmp_path / "orin")
    gpu = DevfreqGpu(LocalSysfs(tmp_path / "orin"), ORIN)
    assert "jetson load" in (gpu.busy_source or "")
    c1 = gpu.read_counters()
    c2 = gpu.read_counters()
    assert c2.total_ns > c1.total_ns
    assert c2.busy_ns - c1.busy_ns == pytest.approx(0.35 * (c2.total_ns - c1.total_ns), abs=2)
    assert c2.instructions is None
    gpu.close()

    mali = make_exynos_mali(tmp_path / "mali")
    gpu = DevfreqGpu(LocalSysfs(tmp_path / "mali"), "/sys/class/devfreq/18500000.mali")
    assert "mali utilization" in (gpu.busy_source or "")
    write(mali["utilization"], 100)
    c1, c2 = gpu.read_counters(), gpu.read_counters()
    assert c2.busy_ns - c1.busy_ns == c2.total_ns - c1.total_ns
    gpu.close()


def test_no_busy_source_is_unsupported(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    paths["load"].unlink()
    gpu = DevfreqGpu(LocalSysfs(tmp_path), ORIN)
    with pytest.raises(Unsupported, match="busy"):
        gpu.read_counters()
    gpu.close()


def test_find_gpu_devfreq_ignores_non_gpus(tmp_path) -> None:
    make_jetson_orin(tmp_path)
    write(tmp_path / "sys/class/devfreq/soc:qcom,cpu-llcc-ddr-bw/available_frequencies", "1 2")
    assert find_gpu_devfreq(LocalSysfs(tmp_path)) == [ORIN]
