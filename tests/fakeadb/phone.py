"""A fake phone: a directory tree standing in for the device's filesystem, plus the few
pieces of kernel and battery behaviour our adb code observes.

Device paths (``/sys/...``) map onto ``root/sys/...``. Files under /sys, /proc, /dev,
/system and /vendor are writable by uid 0 only; /data/local/tmp and /sdcard by the shell
user too. The battery files are computed on each read from ``BatteryModel`` so that
calibration and energy integration see current that rises under load and flips sign
when the phone charges, in the phone's own sign and unit convention.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BATTERY_DIR = "/sys/class/power_supply/battery"
SHELL_WRITABLE = ("/data/local/tmp", "/sdcard")


class FakeOSError(Exception):
    """An errno with the strerror text a real phone's tools print."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.errno = code


@dataclass
class BatteryModel:
    """How the fake fuel gauge reports current and voltage.

    ``sign=+1``: positive while discharging (Qualcomm fuel gauges); ``sign=-1``:
    negative while discharging (the Linux ABI; Huawei-style mA devices).
    """

    sign: int = 1
    current_unit: str = "uA"  # or "mA"
    voltage_unit: str = "uV"  # or "mV"
    idle_ma: float = 250.0
    load_ma_per_job: float = 450.0
    gpu_ma_per_ghz: float = 900.0
    voltage_mv: float = 3850.0
    charging: bool = False
    charge_ma: float = 1500.0
    level: int = 80

    def discharge_ma(self, load_jobs: int, gpu_hz: int) -> float:
        return self.idle_ma + load_jobs * self.load_ma_per_job + self.gpu_ma_per_ghz * gpu_hz / 1e9

    def current_raw(self, load_jobs: int, gpu_hz: int) -> int:
        net_ma = self.discharge_ma(load_jobs, gpu_hz)
        if self.charging:
            net_ma -= self.charge_ma
        scale = 1000 if self.current_unit == "uA" else 1
        return round(self.sign * net_ma * scale)

    def voltage_raw(self) -> int:
        return round(self.voltage_mv * (1000 if self.voltage_unit == "uV" else 1))

    def status(self) -> str:
        return "Charging" if self.charging else "Discharging"


@dataclass
class FakePhone:
    """One fake device. ``rooted``: a working ``su``; ``adbd_root``: adbd itself runs
    as root (userdebug builds after ``adb root``)."""

    serial: str
    root: Path
    props: dict[str, str] = field(default_factory=dict)
    rooted: bool = True
    adbd_root: bool = False
    kernel_release: str = "4.19.157-perf+"
    kernel_version: str = "#1 SMP PREEMPT Tue Jan 12 2021"
    machine: str = "aarch64"
    selinux: str = "Enforcing"
    selinux_blocks_modules: bool = False
    unreadable: set[str] = field(default_factory=set)
    battery: BatteryModel | None = field(default_factory=BatteryModel)
    gpu_freq_path: str | None = None
    modules: dict[str, str] = field(default_factory=dict)
    dmesg: list[str] = field(default_factory=list)
    load_jobs: int = 0
    commands_run: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        for d in ("data/local/tmp", "sdcard", "dev", "proc"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        (self.root / "proc/sys/kernel/modules_disabled").write_text("0\n")
        (self.root / "proc/modules").write_text("")
        (self.root / "proc/version").write_text(
            f"Linux version {self.kernel_release} (builder@android) {self.kernel_version}\n"
        )
        if self.battery is not None:
            (self.root / BATTERY_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)

    # -- paths -----------------------------------------------------------------------
    def host_path(self, path: str) -> Path:
        norm = os.path.normpath("/" + path.lstrip("/"))
        return self.root / norm.lstrip("/")

    def _dynamic(self, path: str) -> str | None:
        if self.battery is None or not path.startswith(BATTERY_DIR + "/"):
            return None
        name = path[len(BATTERY_DIR) + 1 :]
        if name == "current_now":
            return str(self.battery.current_raw(self.load_jobs, self._gpu_hz()))
        if name == "voltage_now":
            return str(self.battery.voltage_raw())
        if name == "status":
            return self.battery.status()
        if name == "capacity":
            return str(self.battery.level)
        if name == "present":
            return "1"
        return None

    def _gpu_hz(self) -> int:
        if self.gpu_freq_path is None:
            return 0
        try:
            return int(self.host_path(self.gpu_freq_path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def exists(self, path: str) -> bool:
        return self._dynamic(path) is not None or self.host_path(path).exists()

    def is_dir(self, path: str) -> bool:
        return self.host_path(path).is_dir()

    def may_write(self, path: str, uid: int) -> bool:
        norm = os.path.normpath("/" + path.lstrip("/"))
        if uid == 0:
            return True
        return any(norm == p or norm.startswith(p + "/") for p in SHELL_WRITABLE)

    def read(self, path: str, uid: int) -> bytes:
        norm = os.path.normpath("/" + path.lstrip("/"))
        if uid != 0 and norm in self.unreadable:
            raise FakeOSError(errno.EACCES)
        dyn = self._dynamic(norm)
        if dyn is not None:
            return (dyn + "\n").encode()
        p = self.host_path(norm)
        if p.is_dir():
            raise FakeOSError(errno.EISDIR)
        try:
            return p.read_bytes()
        except FileNotFoundError as e:
            raise FakeOSError(errno.ENOENT) from e

    def check_writable(self, path: str, uid: int) -> None:
        """Raise as opening ``path`` for writing would on the phone."""
        norm = os.path.normpath("/" + path.lstrip("/"))
        if norm == "/dev/null":
            return
        p = self.host_path(norm)
        if p.is_dir():
            raise FakeOSError(errno.EISDIR)
        if not p.parent.is_dir():
            raise FakeOSError(errno.ENOENT)
        if self._dynamic(norm) is not None or not self.may_write(norm, uid):
            raise FakeOSError(errno.EACCES)
        if norm.startswith("/sys/") and not p.exists():
            raise FakeOSError(errno.EACCES)  # sysfs: no new files

    def write(self, path: str, data: bytes, uid: int, append: bool = False) -> None:
        norm = os.path.normpath("/" + path.lstrip("/"))
        self.check_writable(norm, uid)
        if norm == "/dev/null":
            return
        with self.lock:
            p = self.host_path(norm)
            if norm.startswith("/sys/"):
                p.write_bytes(data)  # sysfs store: one write replaces the value
                self._follow_clock(p)
            else:
                with open(p, "ab" if append else "wb") as f:
                    f.write(data)

    def _follow_clock(self, p: Path) -> None:
        """Like the drivers do: after a new min/max the clock moves into the range."""
        d = p.parent

        def num(name: str) -> int:
            return int((d / name).read_text().split()[0])

        if p.name in ("min_pwrlevel", "max_pwrlevel") and (d / "gpuclk").exists():
            by_level = sorted(
                (int(t) for t in (d / "gpu_available_frequencies").read_text().split()),
                reverse=True,
            )
            lo = by_level[min(num("min_pwrlevel"), len(by_level) - 1)]
            hi = by_level[min(num("max_pwrlevel"), len(by_level) - 1)]
            hz = min(max(num("gpuclk"), lo), hi)
            (d / "gpuclk").write_text(f"{hz}\n")
        elif p.name in ("min_freq", "max_freq") and (d / "cur_freq").exists():
            hz = min(max(num("cur_freq"), num("min_freq")), num("max_freq"))
            (d / "cur_freq").write_text(f"{hz}\n")

    def listdir(self, path: str, uid: int) -> list[str]:
        p = self.host_path(path)
        if not p.exists():
            raise FakeOSError(errno.ENOENT)
        if not p.is_dir():
            return [os.path.basename(path)]
        return sorted(os.listdir(p))

    # -- kernel modules --------------------------------------------------------------
    def vermagic(self) -> str:
        return f"{self.kernel_release} SMP preempt mod_unload modversions {self.machine}"

    def insmod(self, path: str, params: list[str], uid: int) -> int:
        """0 or an errno, as init_module/finit_module would return; logs to dmesg."""
        if uid != 0:
            return errno.EPERM
        try:
            blob = self.read(path, uid)
        except FakeOSError as e:
            return e.errno
        if self.selinux == "Enforcing" and self.selinux_blocks_modules:
            self.dmesg.append(
                'avc: denied { module_load } for pid=4242 comm="insmod" '
                "scontext=u:r:su:s0 tcontext=u:object_r:shell_data_file:s0 "
                "tclass=system permissive=0"
            )
            return errno.EACCES
        info = _modinfo(blob)
        name = info.get("name", Path(path).stem)
        if name in self.modules:
            return errno.EEXIST
        magic = info.get("vermagic", "")
        if magic.split(" ")[0] != self.kernel_release:
            self.dmesg.append(f"{name}: version magic '{magic}' should be '{self.vermagic()}'")
            return errno.ENOEXEC
        values = dict(p.split("=", 1) for p in params if "=" in p)
        target = values.get("target", "")
        if not target:
            self.dmesg.append(
                f"{name}: name a devfreq device with target=<name> or load with virtual=1"
            )
            return errno.EINVAL
        names = self.listdir("/sys/class/devfreq", 0) if self.exists("/sys/class/devfreq") else []
        found = [d for d in names if _matches(target, d)]
        if not found:
            self.dmesg.append(f'{name}: no devfreq device on the platform bus matches "{target}"')
            return errno.ENODEV
        with self.lock:
            self.modules[name] = " ".join(params)
            self.host_path("/dev/turboinfer").write_text("")
        self.dmesg.append(f"{name}: attached to devfreq {found[0]}")
        return 0

    def rmmod(self, name: str, uid: int) -> int:
        if uid != 0:
            return errno.EPERM
        if self.modules.pop(name, None) is None:
            return errno.ENOENT
        self.host_path("/dev/turboinfer").unlink(missing_ok=True)
        return 0

    def now_ns(self) -> int:
        return time.time_ns()


def _matches(pattern: str, name: str) -> bool:
    """The module's target= rule: glob, exact, or a suffix after '.' or ','."""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    n, p = len(name), len(pattern)
    return n > p and name.endswith(pattern) and name[n - p - 1] in ".,"


def _modinfo(blob: bytes) -> dict[str, str]:
    """key=value strings from a module's .modinfo section (NUL-separated)."""
    out: dict[str, str] = {}
    for chunk in blob.split(b"\0"):
        text = chunk.decode("ascii", "replace")
        for key in ("vermagic", "name"):
            if text.startswith(key + "="):
                out[key] = text[len(key) + 1 :]
    return out


def fake_module(name: str = "turboinfer", vermagic: str = "4.19.157-perf+ SMP preempt") -> bytes:
    """Bytes shaped like a .ko's modinfo strings, enough for the fake insmod."""
    return b"\x7fELF\0" + f"name={name}\0vermagic={vermagic}\0".encode()
