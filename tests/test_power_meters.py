"""Meters: window rules, the sim integral, battery calibration, RAPL wrap, NVML, Monsoon."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest
from fakesysfs import make_battery, make_rapl, write

from turboinfer_llama.devices.base import DeviceNotFound, PermissionDenied, Unsupported
from turboinfer_llama.devices.sim import SimGpu
from turboinfer_llama.devices.sysfs_io import LocalSysfs
from turboinfer_llama.power import Calibration, Measurement, open_meter, probe_meters
from turboinfer_llama.power.battery import BatteryMeter, guess_calibration
from turboinfer_llama.power.monsoon import MonsoonMeter
from turboinfer_llama.power.rapl import RaplMeter
from turboinfer_llama.power.sim import SimMeter


def test_sim_meter_reads_the_simulator_integral() -> None:
    gpu = SimGpu("adreno650")
    meter = SimMeter(gpu)
    meter.begin_window("decode")
    gpu.run_kernel("MUL_MAT", 1e9, 1e7, phase="decode")
    gpu.run_gap(2_000_000, kind="sample", phase="decode")
    m = meter.end_window("decode")
    assert isinstance(m, Measurement) and m.simulated
    assert m.energy_j == pytest.approx(gpu.energy_j)
    assert m.duration_s == pytest.approx(gpu.now_ns() / 1e9)
    assert m.avg_power_w == pytest.approx(m.energy_j / m.duration_s)
    assert "simulated" in m.source
    with pytest.raises(AttributeError):
        m.energy_j = 0.0  # type: ignore[misc]


def test_window_names() -> None:
    meter = SimMeter(SimGpu("generic"))
    meter.begin_window("a")
    meter.begin_window("b")  # nested windows with different names are fine
    with pytest.raises(ValueError, match="already open"):
        meter.begin_window("a")
    with pytest.raises(ValueError, match="no open window"):
        meter.end_window("zzz")
    meter.end_window("a")
    with pytest.raises(ValueError):
        meter.end_window("a")
    assert meter.open_windows() == ["b"]


# ---- battery -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "voltage", "cal"),
    [
        (-500_000, 4_000_000, Calibration()),  # Linux ABI: uA, negative discharging
        (500_000, 4_000_000, Calibration(sign=1)),  # Qualcomm: positive while discharging
        (-500, 4_000_000, Calibration(sign=-1, current_unit_scale=1e-3)),  # Huawei: mA
    ],
)
def test_battery_power_with_calibration(tmp_path, current, voltage, cal) -> None:
    make_battery(tmp_path, current_now=current, voltage_now=voltage)
    meter = BatteryMeter(root=str(tmp_path), calibration=cal, period_s=0.01)
    try:
        assert meter.power_w() == pytest.approx(2.0)
        meter.begin_window("w")
        time.sleep(0.05)
        m = meter.end_window("w")
        assert not m.simulated and "fuel gauge" in m.source
        assert m.avg_power_w == pytest.approx(2.0)
        assert m.energy_j == pytest.approx(2.0 * m.duration_s)
        assert meter.samples >= 3  # the thread sampled meanwhile
    finally:
        meter.close()


def test_battery_trapezoid_between_samples(tmp_path) -> None:
    paths = make_battery(tmp_path, current_now=-250_000, voltage_now=4_000_000)  # 1 W
    meter = BatteryMeter(root=str(tmp_path), period_s=3600)  # no thread samples in between
    try:
        meter.begin_window("w")
        time.sleep(0.02)
        write(paths["current_now"], -750_000)  # 3 W at the end
        m = meter.end_window("w")
        assert m.avg_power_w == pytest.approx(2.0)  # linear between the two ends
    finally:
        meter.close()


def test_guess_calibration() -> None:
    assert guess_calibration(-450_000, 3_850_000, discharging=True) == Calibration(-1, 1e-6, 1e-6)
    assert guess_calibration(450_000, 3_850_000, discharging=True) == Calibration(1, 1e-6, 1e-6)
    assert guess_calibration(-450, 3850, discharging=True) == Calibration(-1, 1e-3, 1e-3)
    assert guess_calibration(300_000, 4_100_000, discharging=False) == Calibration(-1, 1e-6, 1e-6)
    with pytest.raises(ValueError):
        guess_calibration(0, 3_850_000, discharging=True)
    with pytest.raises(ValueError):
        Calibration(sign=2)


def test_battery_missing(tmp_path) -> None:
    with pytest.raises(DeviceNotFound, match="battery"):
        BatteryMeter(root=str(tmp_path))


def test_battery_found_by_type(tmp_path) -> None:
    make_battery(tmp_path, name="bms")
    meter = BatteryMeter(root=str(tmp_path))
    assert meter.path.endswith("/bms")
    meter.close()


# ---- RAPL --------------------------------------------------------------------------


def test_rapl_window_and_wrap(tmp_path) -> None:
    paths = make_rapl(tmp_path, energy_uj=1_000_000, max_uj=10_000_000)
    meter = RaplMeter(root=str(tmp_path))
    meter.begin_window("a")
    write(paths["energy_uj"], 3_000_000)
    assert meter.end_window("a").energy_j == pytest.approx(2.0)
    meter.begin_window("b")
    write(paths["energy_uj"], 9_500_000)
    meter._read()  # a reading in between, as windows would take
    write(paths["energy_uj"], 500_000)  # wrapped past 10 J
    m = meter.end_window("b")
    assert m.energy_j == pytest.approx(7.5)
    assert "RAPL package-0" in m.source and not m.simulated


class Unreadable(LocalSysfs):
    def read(self, path: str) -> str:
        if path.endswith("energy_uj"):
            raise PermissionDenied(f"cannot read {path}: permission denied; run as root")
        return super().read(path)


def test_rapl_permission_error(tmp_path) -> None:
    make_rapl(tmp_path)
    with pytest.raises(PermissionDenied, match="root"):
        RaplMeter(Unreadable(tmp_path))


def test_rapl_missing(tmp_path) -> None:
    with pytest.raises(DeviceNotFound, match="RAPL"):
        RaplMeter(root=str(tmp_path))


# ---- NVML (optional) ---------------------------------------------------------------


def test_nvml_missing_package_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(Unsupported, match="nvidia-ml-py"):
        open_meter("nvml")


def test_nvml_with_a_fake_library(monkeypatch) -> None:
    total_mj = [5000]

    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetTotalEnergyConsumption=lambda h: total_mj[0],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    meter = open_meter("nvml:0")
    meter.begin_window("w")
    total_mj[0] += 1500
    m = meter.end_window("w")
    assert m.energy_j == pytest.approx(1.5) and "Fake GPU" in m.source
    meter.close()


# ---- Monsoon (optional) ------------------------------------------------------------


def test_monsoon_missing_package(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "Monsoon", None)
    monkeypatch.setitem(sys.modules, "Monsoon.HVPM", None)
    with pytest.raises(Unsupported, match="pip install monsoon"):
        open_meter("monsoon")


class FakeEngine:
    """The periodic-sampling part of Monsoon's SampleEngine: 100 mA at 4 V."""

    def __init__(self) -> None:
        self.started = self.stopped = False
        self.batches = threading.Semaphore(0)

    def periodicStartSampling(self) -> None:
        self.started = True

    def periodicCollectSamples(self, n: int) -> dict[str, list[float]]:
        time.sleep(0.001)
        self.batches.release()
        return {"main_i": [100.0] * n, "main_v": [4.0] * n}

    def periodicStopSampling(self, closeConnection: bool = False) -> None:
        self.stopped = closeConnection


def test_monsoon_integrates_batches() -> None:
    engine = FakeEngine()
    channels = types.SimpleNamespace(MainCurrent="main_i", MainVoltage="main_v")
    meter = MonsoonMeter(engine=engine, channels=channels, batch=50)
    meter.begin_window("w")
    # batches collected before the window opened may already be counted: wait for
    # three whole batches inside it (not for three releases, which can predate it)
    s0 = meter.samples
    deadline = time.monotonic() + 5.0
    while meter.samples < s0 + 3 * 50 and time.monotonic() < deadline:
        engine.batches.acquire(timeout=0.5)
    assert meter.samples >= s0 + 3 * 50
    m = meter.end_window("w")
    meter.close()
    assert engine.started and engine.stopped
    # each sample is 0.4 W for 1/5000 s
    assert meter._energy_j == pytest.approx(meter.samples * 0.4 / 5000)
    assert m.energy_j > 0 and not m.simulated


# ---- open_meter / probe ------------------------------------------------------------


def test_open_meter_specs(tmp_path) -> None:
    with pytest.raises(ValueError, match="battery"):
        open_meter("thermometer")
    with pytest.raises(ValueError, match="sim"):
        open_meter("sim")
    gpu = SimGpu("adreno650")
    assert isinstance(open_meter("auto", device=gpu), SimMeter)
    make_battery(tmp_path)
    meter = open_meter("auto", root=str(tmp_path))
    assert isinstance(meter, BatteryMeter)
    meter.close()


def test_probe_meters(tmp_path) -> None:
    make_battery(tmp_path)
    found = {name: (ok, why) for name, ok, why in probe_meters(root=str(tmp_path))}
    assert found["battery"][0]
    assert not found["rapl"][0] and "RAPL" in found["rapl"][1]
    assert set(found) == {"battery", "rapl", "nvml", "monsoon"}
