"""The phone's battery fuel gauge over adb: sampling on the phone, calibration of the
sign and unit of ``current_now``, and a meter that integrates energy over windows.

Sampling runs *on the phone* (a shell loop at a fixed period, each sample stamped with
the phone's clock) and streams to the host, so USB latency does not jitter the sample
times. Conventions differ (BRIEF.md): the Linux ABI says µA, negative while
discharging; Qualcomm gauges report positive µA while discharging; some Huawei devices
report mA, negative. We decide per phone from an idle-vs-load sample and persist it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._clock import now_ns
from ..devices.adb_link import EXIT, STDERR, STDIN, STDOUT, AdbLink
from ..devices.adb_settings import AdbSettings
from ..devices.base import DeviceError, DeviceGone, DeviceNotFound, PermissionDenied
from ..power.base import Calibration, Measurement

log = logging.getLogger(__name__)

BATTERY_DIR = "/sys/class/power_supply/battery"
CHARGING_STATES = ("Charging", "Full")
# |raw current| above this cannot be mA on a phone (20 A), so it is µA.
UA_THRESHOLD = 20_000
# Raw voltage above this is µV (a Li-ion cell is 3-4.5 V, i.e. 3000-4500 mV).
UV_THRESHOLD = 100_000


class ChargingError(DeviceError):
    """Energy from the fuel gauge is meaningless while the charger feeds the phone."""


CHARGING_ADVICE = (
    "the phone is charging: the fuel gauge then measures the charger's current, not the "
    "phone's draw. Unplug it and use adb over Wi-Fi (`adb tcpip 5555; adb connect "
    "PHONE_IP:5555`), or enable the charger's passthrough/bypass mode; --force-charging "
    "reports the numbers anyway"
)


@dataclass(frozen=True, slots=True)
class Sample:
    phone_ns: int
    host_ns: int
    current_raw: int
    voltage_raw: int
    status: str


@dataclass(frozen=True, slots=True)
class CalibrationRecord:
    """What we decided for one phone, and the evidence."""

    serial: str
    sign: int
    current_unit: str  # "uA" | "mA"
    voltage_unit: str  # "uV" | "mV"
    idle_raw: float
    load_raw: float
    status: str
    method: str

    def calibration(self) -> Calibration:
        return Calibration(
            sign=self.sign,
            current_unit_scale=1e-6 if self.current_unit == "uA" else 1e-3,
            voltage_unit_scale=1e-6 if self.voltage_unit == "uV" else 1e-3,
        )

    def describe(self) -> str:
        direction = "positive" if self.sign > 0 else "negative"
        return (
            f"current_now in {self.current_unit}, {direction} while discharging; "
            f"voltage_now in {self.voltage_unit} ({self.method})"
        )


def battery_files(link: AdbLink, directory: str = BATTERY_DIR) -> dict[str, str]:
    """current_now, voltage_now and status of the phone's battery; errors say which."""
    files = {n: f"{directory}/{n}" for n in ("current_now", "voltage_now", "status")}
    r = link.run("cat " + " ".join(shlex.quote(p) for p in files.values()))
    if not r.ok:
        text = r.out.strip()
        if "Permission denied" in text:
            raise PermissionDenied(
                f"{link.serial}: cannot read the battery ({text}); on this phone the "
                "fuel gauge needs root"
            )
        raise DeviceNotFound(f"{link.serial}: no battery fuel gauge at {directory} ({text})")
    return files


class PhoneSampler:
    """A loop on the phone printing ``S``, the phone's clock in ns, current, voltage and
    status every ``period_s``; a host thread collects the samples."""

    def __init__(
        self, link: AdbLink, period_s: float, directory: str = BATTERY_DIR, as_root: bool = False
    ) -> None:
        self.link = link
        self.period_s = period_s
        files = battery_files(link, directory)
        root_cmd = link.root_access().session_command if as_root else None
        self._conn: Any = link.open_service(
            f"shell,v2,raw:{root_cmd or ''}", link.settings.timeout_s
        )
        cat = " ".join(shlex.quote(files[n]) for n in ("current_now", "voltage_now", "status"))
        loop = f"while :; do echo S; date +%s%N; cat {cat}; sleep {period_s:g}; done\n"
        self._sock = self._conn.conn
        self._sock.sendall(bytes([STDIN]) + struct.pack("<I", len(loop)) + loop.encode())
        self.samples: list[Sample] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stopped = False
        self._thread = threading.Thread(target=self._reader, daemon=True, name="fuelgauge")
        self._thread.start()

    def _reader(self) -> None:
        buf = b""
        pending: list[str] = []
        try:
            while not self._stopped:
                head = self._recv(5)
                data = self._recv(struct.unpack("<I", head[1:])[0])
                if head[0] == EXIT:
                    raise DeviceGone(f"{self.link.serial}: the sampling shell exited")
                if head[0] not in (STDOUT, STDERR):
                    continue
                buf += data
                *lines, rest = buf.split(b"\n")
                buf = rest
                for raw in lines:
                    line = raw.decode("utf-8", "replace").strip()
                    if line == "S":
                        self._add(pending)
                        pending = []
                    else:
                        pending.append(line)
        except (DeviceError, OSError, ValueError) as e:
            if not self._stopped:
                self.error = str(e) or type(e).__name__
                log.error("fuel-gauge sampling on %s stopped: %s", self.link.serial, self.error)
        finally:
            with self._cond:
                self._cond.notify_all()

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self._sock.recv(n - len(buf))
            except TimeoutError as e:
                raise DeviceGone(f"{self.link.serial}: fuel-gauge samples stopped arriving") from e
            if not chunk:
                raise DeviceGone(f"{self.link.serial}: adb connection closed")
            buf += chunk
        return buf

    def _add(self, fields: list[str]) -> None:
        if len(fields) != 4:
            if fields:
                log.debug("skipping malformed fuel-gauge sample %r", fields)
            return
        try:
            s = Sample(int(fields[0]), now_ns(), int(fields[1]), int(fields[2]), fields[3])
        except ValueError:
            log.debug("skipping malformed fuel-gauge sample %r", fields)
            return
        with self._cond:
            self.samples.append(s)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> None:
        """Block until ``count`` samples exist in total (or fail clearly)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while len(self.samples) < count:
                if self.error:
                    raise DeviceGone(self.error)
                left = end - time.monotonic()
                if left <= 0:
                    raise DeviceGone(
                        f"{self.link.serial}: only {len(self.samples)} of {count} fuel-gauge "
                        f"samples after {timeout_s:g} s"
                    )
                self._cond.wait(left)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def phone_offset_ns(self) -> int:
        """host clock - phone clock, from the least-delayed sample (a lower bound on the
        USB delay is folded in; it is well under a sampling period)."""
        samples = self.snapshot()
        if not samples:
            raise DeviceGone(f"{self.link.serial}: no fuel-gauge samples yet")
        return min(s.host_ns - s.phone_ns for s in samples)

    def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            self._conn.close()
        self._thread.join(2)


# ---- calibration --------------------------------------------------------------------


def decide(serial: str, idle: list[Sample], load: list[Sample]) -> CalibrationRecord:
    """Sign from the direction the raw current moves under load (more load means more
    discharge, whatever the convention); unit from the magnitude."""
    if not idle or not load:
        raise DeviceError(f"{serial}: no fuel-gauge samples to calibrate from")
    idle_raw = statistics.median(s.current_raw for s in idle)
    load_raw = statistics.median(s.current_raw for s in load)
    status = load[-1].status
    delta = load_raw - idle_raw
    peak = max(abs(s.current_raw) for s in idle + load)
    unit = "uA" if peak >= UA_THRESHOLD else "mA"
    noise = max(abs(idle_raw) * 0.05, 1000 if unit == "uA" else 1)
    if abs(delta) > noise:
        sign = 1 if delta > 0 else -1
        method = f"idle {idle_raw:g} -> load {load_raw:g} raw"
    elif status == "Discharging" and idle_raw != 0:
        sign = 1 if idle_raw > 0 else -1
        method = f"load made no clear change; sign of the idle reading while {status}"
    else:
        raise DeviceError(
            f"{serial}: cannot tell the current's sign: load moved it by only {delta:g} "
            f"(status {status}); unplug the charger and retry"
        )
    voltage = statistics.median(s.voltage_raw for s in idle + load)
    if voltage >= UV_THRESHOLD:
        vunit = "uV"
    elif 1000 <= voltage <= 10_000:
        vunit = "mV"
    else:
        raise DeviceError(
            f"{serial}: voltage_now={voltage:g} is neither µV nor mV of a Li-ion cell"
        )
    return CalibrationRecord(serial, sign, unit, vunit, idle_raw, load_raw, status, method)


def _store_path(settings: AdbSettings, serial: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in serial)
    return settings.state_dir / f"{safe}.fuelgauge.json"


def load_calibration(serial: str, settings: AdbSettings) -> CalibrationRecord | None:
    path = _store_path(settings, serial)
    if not path.exists():
        return None
    try:
        return CalibrationRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        log.warning("ignoring unreadable calibration %s: %s", path, e)
        return None


def save_calibration(record: CalibrationRecord, settings: AdbSettings) -> Path:
    path = _store_path(settings, record.serial)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record), indent=1))
    return path


def calibrate(
    link: AdbLink,
    *,
    seconds: float = 1.0,
    load_jobs: int = 2,
    force: bool = False,
    settings: AdbSettings | None = None,
) -> CalibrationRecord:
    """Sample idle for ``seconds``, then with ``load_jobs`` busy loops (``yes``) on the
    phone's CPUs for ``seconds``; decide and persist the convention."""
    settings = settings or link.settings
    period = min(settings.sample_period_s, seconds / 4)
    sampler = PhoneSampler(link, period)
    try:
        n_phase = max(3, round(seconds / period))
        sampler.wait_for(n_phase, seconds * 4 + settings.timeout_s)
        idle = sampler.snapshot()
        if idle[-1].status in CHARGING_STATES and not force:
            raise ChargingError(f"{link.serial}: cannot calibrate: {CHARGING_ADVICE}")
        session = link.open_session(as_root=False)
        try:
            # Busy loops in this shell: if we vanish, the shell's hangup ends them too.
            session.run("; ".join(f"yes > /dev/null & p{i}=$!" for i in range(load_jobs)))
            try:
                start = len(sampler.snapshot())
                time.sleep(period)  # let the load take hold before sampling it
                sampler.wait_for(start + 1 + n_phase, seconds * 4 + settings.timeout_s)
                load = sampler.snapshot()[start + 1 :]
            finally:
                session.run("kill " + " ".join(f"$p{i}" for i in range(load_jobs)))
        finally:
            session.close()
    finally:
        sampler.close()
    record = decide(link.serial, idle, load)
    save_calibration(record, settings)
    return record


# ---- the meter ----------------------------------------------------------------------


class BatteryEnergyMeter:
    """Energy drawn from the phone's battery over named windows (begin/end_window).

    Power per sample = sign * I * V in SI units; energy = trapezoid integral of the
    samples that fall inside the window (phone timestamps, moved onto the host clock).
    """

    def __init__(
        self,
        link: AdbLink,
        calibration: CalibrationRecord,
        *,
        period_s: float | None = None,
        force_charging: bool = False,
    ) -> None:
        self.link = link
        self.record = calibration
        self.cal = calibration.calibration()
        self.force_charging = force_charging
        self.warnings: list[str] = []
        self.sampler = PhoneSampler(link, period_s or link.settings.sample_period_s)
        self._windows: dict[str, int] = {}
        self.sampler.wait_for(1, link.settings.timeout_s + 1)
        self._check_charging(self.sampler.snapshot())

    @property
    def source(self) -> str:
        return (
            f"battery fuel gauge of {self.link.serial} over adb, sampled every "
            f"{self.sampler.period_s:g} s on the phone ({self.record.describe()})"
        )

    def _check_charging(self, samples: list[Sample]) -> None:
        if any(s.status in CHARGING_STATES for s in samples):
            msg = f"{self.link.serial}: {CHARGING_ADVICE}"
            if not self.force_charging:
                raise ChargingError(msg)
            if msg not in self.warnings:
                self.warnings.append(msg)
                log.warning("%s", msg)

    def power_w(self, s: Sample) -> float:
        return self.cal.power_w(s.current_raw, s.voltage_raw)

    def begin_window(self, name: str) -> None:
        if name in self._windows:
            raise ValueError(f"window {name!r} is already open")
        self._windows[name] = now_ns()

    def end_window(self, name: str) -> Measurement:
        if name not in self._windows:
            raise ValueError(f"window {name!r} was never begun")
        t0 = self._windows.pop(name)
        t1 = now_ns()
        # One sample past the end, so the window's tail is covered.
        self.sampler.wait_for(
            len(self.sampler.snapshot()) + 1,
            self.sampler.period_s * 3 + self.link.settings.timeout_s,
        )
        offset = self.sampler.phone_offset_ns()
        points = [(s.phone_ns + offset, self.power_w(s), s) for s in self.sampler.snapshot()]
        inside = [p for p in points if t0 <= p[0] <= t1]
        self._check_charging([p[2] for p in inside])
        energy_j = _integrate([(t, w) for t, w, _ in points], t0, t1)
        duration_s = (t1 - t0) / 1e9
        return Measurement(
            energy_j=energy_j,
            duration_s=duration_s,
            avg_power_w=energy_j / duration_s if duration_s > 0 else 0.0,
            simulated=False,
            source=self.source + (" WHILE CHARGING (forced)" if self.warnings else ""),
        )

    def close(self) -> None:
        self.sampler.close()


def _integrate(points: list[tuple[int, float]], t0: int, t1: int) -> float:
    """Trapezoid integral (J) of power samples (ns, W) over [t0, t1]; linear between
    samples, held flat beyond the first and last."""
    if not points or t1 <= t0:
        return 0.0
    ts = np.array([t for t, _ in points], dtype=np.float64)
    ws = np.array([w for _, w in points], dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    ts, ws = ts[order], ws[order]
    knots = np.concatenate(([t0], ts[(ts > t0) & (ts < t1)], [t1]))
    watts = np.interp(knots, ts, ws)
    return float(np.sum(np.diff(knots) / 1e9 * (watts[1:] + watts[:-1]) / 2))
