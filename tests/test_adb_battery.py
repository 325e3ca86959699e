"""Fuel-gauge calibration and energy metering over adb against fake phones with the
Qualcomm (positive µA while discharging) and Huawei-style (negative mA) conventions."""

from __future__ import annotations

import time

import pytest
from fakeadb import HUAWEI_BATTERY, LINUX_ABI_BATTERY, oneplus8, pixel_mali, serving

from turboinfer_llama.android import fuelgauge
from turboinfer_llama.devices.adb_link import AdbLink
from turboinfer_llama.devices.adb_settings import AdbSettings


def _link() -> AdbLink:
    return AdbLink(None, AdbSettings())


@pytest.mark.parametrize(
    ("battery", "sign", "unit", "vunit"),
    [(None, 1, "uA", "uV"), (HUAWEI_BATTERY, -1, "mA", "mV"), (LINUX_ABI_BATTERY, -1, "uA", "uV")],
    ids=["qualcomm", "huawei", "linux-abi"],
)
def test_adb_calibration_decides_sign_and_unit(tmp_path, monkeypatch, battery, sign, unit, vunit):
    phone = oneplus8(tmp_path / "phone", battery=battery)
    with serving(monkeypatch, tmp_path / "state", phone):
        link = _link()
        record = fuelgauge.calibrate(link, seconds=0.4)
        assert (record.sign, record.current_unit, record.voltage_unit) == (sign, unit, vunit)
        assert abs(record.load_raw) > abs(record.idle_raw)  # the busy loops drew current
        assert phone.load_jobs == 0, "calibration left busy loops running"
        saved = fuelgauge.load_calibration(phone.serial, AdbSettings())
        assert saved == record
        cal = record.calibration()
        assert cal.sign == sign
        assert cal.current_unit_scale == (1e-6 if unit == "uA" else 1e-3)


def test_adb_calibration_refuses_while_charging(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone")
    phone.battery.charging = True
    with serving(monkeypatch, tmp_path / "state", phone):
        with pytest.raises(fuelgauge.ChargingError, match=r"charging.*Unplug"):
            fuelgauge.calibrate(_link(), seconds=0.4)
        # Forced: the load still moves the raw current towards "discharge".
        record = fuelgauge.calibrate(_link(), seconds=0.4, force=True)
        assert (record.sign, record.current_unit) == (1, "uA")


def test_adb_meter_integrates_battery_power(tmp_path, monkeypatch):
    phone = pixel_mali(tmp_path / "phone", battery=HUAWEI_BATTERY)
    with serving(monkeypatch, tmp_path / "state", phone):
        link = _link()
        record = fuelgauge.calibrate(link, seconds=0.4)
        meter = fuelgauge.BatteryEnergyMeter(link, record, period_s=0.05)
        try:
            meter.begin_window("run")
            time.sleep(0.6)
            m = meter.end_window("run")
        finally:
            meter.close()
    model = phone.battery
    expected_w = model.discharge_ma(0, 260_000_000) / 1e3 * model.voltage_mv / 1e3
    assert not m.simulated
    assert "fuel gauge" in m.source and "mA" in m.source
    assert m.avg_power_w == pytest.approx(expected_w, rel=0.02)
    assert m.energy_j == pytest.approx(m.avg_power_w * m.duration_s)


def test_adb_meter_warns_and_refuses_energy_while_charging(tmp_path, monkeypatch, caplog):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone):
        link = _link()
        record = fuelgauge.calibrate(link, seconds=0.4)
        phone.battery.charging = True
        with pytest.raises(fuelgauge.ChargingError, match="charging"):
            fuelgauge.BatteryEnergyMeter(link, record, period_s=0.05)
        meter = fuelgauge.BatteryEnergyMeter(link, record, period_s=0.05, force_charging=True)
        try:
            meter.begin_window("w")
            time.sleep(0.2)
            m = meter.end_window("w")
        finally:
            meter.close()
    assert "WHILE CHARGING" in m.source
    assert meter.warnings and "charging" in caplog.text
