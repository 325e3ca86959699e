"""devices/adb.py against the fake adb server: set/restore over one shell session, the
measured round-trip, no-root errors and a disconnect mid-run."""

from __future__ import annotations

import threading

import adbutils
import pytest
from fakeadb import oneplus8, pixel_mali, serving

from turboinfer_llama.android.actuator import SafeActuator
from turboinfer_llama.control.base import Decision
from turboinfer_llama.devices import open_device
from turboinfer_llama.devices.adb import available
from turboinfer_llama.devices.base import DeviceGone, PermissionDenied

KGSL = "sys/class/kgsl/kgsl-3d0"
MALI = "sys/class/devfreq/18500000.mali"


def _read(phone, rel: str) -> str:
    return (phone.root / rel).read_text().strip()


def test_adb_fake_server_speaks_to_unchanged_adbutils(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone) as srv:
        client = adbutils.AdbClient(host="127.0.0.1", port=srv.port)
        assert client.server_version() == 41
        assert [d.serial for d in client.device_list()] == [phone.serial]
        dev = client.device(phone.serial)
        assert dev.prop.model == "IN2013"
        r = dev.shell2("cat /sys/class/kgsl/kgsl-3d0/gpuclk", v2=True)
        assert (r.returncode, r.output.strip()) == (0, "305000000")
        dev.sync.push(b"payload", "/data/local/tmp/p.bin")
        assert dev.sync.read_bytes("/data/local/tmp/p.bin") == b"payload"


def test_adb_kgsl_set_and_restore_over_one_session(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone) as srv:
        ok, why = available(phone.serial)
        assert ok, why
        gpu = open_device(f"adb:{phone.serial}")
        caps = gpu.capabilities
        assert caps.can_set and not caps.has_pmu and not caps.simulated
        assert caps.switch_latency_source.startswith("measured over adb")
        assert caps.switch_latency_ns > 0
        assert any("token-level" in n for n in caps.notes)
        assert gpu.frequencies_hz()[0] == 305_000_000
        opened = len(srv.services)
        for hz in (400_000_000, 587_000_000, 441_600_000):
            assert gpu.set_hz(hz) == hz
            assert gpu.current_hz() == hz
        # KGSL: min_pwrlevel == max_pwrlevel == the 441.6 MHz level (index 4 from the top).
        assert (_read(phone, f"{KGSL}/min_pwrlevel"), _read(phone, f"{KGSL}/max_pwrlevel")) == (
            "4",
            "4",
        )
        assert len(srv.services) == opened, "no new adb service per write"
        state_file = tmp_path / "state" / f"{phone.serial}.gpu-state.json"
        assert state_file.exists()
        gpu.close()
        assert (_read(phone, f"{KGSL}/min_pwrlevel"), _read(phone, f"{KGSL}/max_pwrlevel")) == (
            "6",
            "0",
        )
        assert not state_file.exists()
        gpu.close()  # idempotent


def test_adb_devfreq_mali_set_and_restore(tmp_path, monkeypatch):
    phone = pixel_mali(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone):
        gpu = open_device("adb")
        assert "18500000.mali" in gpu.name
        assert gpu.set_hz(433_000_000) == 433_000_000
        assert _read(phone, f"{MALI}/min_freq") == _read(phone, f"{MALI}/max_freq") == "433000000"
        gpu.set_range(200_000_000, 546_000_000)
        assert (_read(phone, f"{MALI}/min_freq"), _read(phone, f"{MALI}/max_freq")) == (
            "200000000",
            "546000000",
        )
        gpu.close()
        assert (_read(phone, f"{MALI}/min_freq"), _read(phone, f"{MALI}/max_freq")) == (
            "100000000",
            "702000000",
        )


def test_adb_without_root_reads_but_says_setting_needs_root(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone", rooted=False)
    with serving(monkeypatch, tmp_path / "state", phone):
        ok, why = available()
        assert ok and "not rooted" in why
        gpu = open_device("adb")
        assert not gpu.capabilities.can_set
        assert "clock reads" in gpu.capabilities.switch_latency_source
        assert gpu.current_hz() == 305_000_000
        with pytest.raises(PermissionDenied, match=r"not rooted.*Magisk"):
            gpu.set_hz(400_000_000)
        assert _read(phone, f"{KGSL}/max_pwrlevel") == "0"
        gpu.close()
        assert gpu.errors == []


def test_adb_unreadable_node_without_root_is_explained(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone", rooted=False, unreadable={f"/{KGSL}/gpuclk"})
    with (
        serving(monkeypatch, tmp_path / "state", phone),
        pytest.raises(PermissionDenied, match=r"gpuclk.*not rooted.*Magisk"),
    ):
        open_device("adb")


def test_adb_missing_phone_and_server_are_clear_errors(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone):
        ok, why = available("nosuchserial")
        assert not ok and "nosuchserial" in why and phone.serial in why
    monkeypatch.setenv("TURBOINFER_ADB_SERVER", "127.0.0.1:1")
    ok, why = available()
    assert not ok and "adb start-server" in why


def test_adb_disconnect_mid_run_falls_back_and_reports(tmp_path, monkeypatch):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone) as srv:
        gpu = open_device("adb")
        actuator = SafeActuator(gpu)
        levels = gpu.frequencies_hz()
        started = threading.Event()
        steps = []

        def controller_loop() -> None:
            i = 0
            while actuator.active and i < 100_000:
                actuator.apply(Decision(levels[i % len(levels)], 0, "test"))
                steps.append(i)
                started.set()
                i += 1

        t = threading.Thread(target=controller_loop, daemon=True)
        t.start()
        assert started.wait(10)
        srv.stop()  # the adb server dies mid-run
        t.join(15)
        assert not t.is_alive(), "the controller loop hung on a dead phone"
        assert actuator.error and phone.serial in actuator.error
        assert "control stopped" in actuator.error
        assert actuator.apply(Decision(levels[0], 0, "after")) is None
        with pytest.raises(DeviceGone):
            gpu.set_hz(levels[0])
        closer = threading.Thread(target=gpu.close, daemon=True)
        closer.start()
        closer.join(15)
        assert not closer.is_alive(), "close hung on a dead phone"
        assert gpu.errors and "android restore" in gpu.errors[0]
        assert (tmp_path / "state" / f"{phone.serial}.gpu-state.json").exists()
