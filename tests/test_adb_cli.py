"""``turboinfer android ...`` against the fake adb server: probe output, deploy and its
failure explanations, bench with and without the runner, restore, push-run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fakeadb import fake_module, oneplus8, pixel_mali, serving

from turboinfer_llama.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "android"


def test_adb_probe_oneplus8_text(tmp_path, monkeypatch, capsys):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "probe"]) == 0
    out = capsys.readouterr().out
    assert "OnePlus IN2013 (SoC QTI SM8250, Android 11)" in out
    assert "GPU path         KGSL (kgsl:kgsl-3d0)" in out
    assert "305, 400, 441.6, 490, 525, 587, 670 MHz" in out
    assert "governor msm-adreno-tz" in out
    assert "thermal cap      670 MHz" in out
    assert "4.19.157-perf+" in out
    assert "su -c works" in out
    assert "kernel module    yes" in out
    assert "measured over adb" in out
    assert "positive while discharging" in out and "uA" in out


def test_adb_probe_pixel_json_without_root(tmp_path, monkeypatch, capsys):
    phone = pixel_mali(tmp_path / "phone", rooted=False)
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "probe", "--json", "--no-calibrate"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == "Google Pixel 6"
    assert info["gpu"]["path"] == "devfreq" and info["gpu"]["name"] == "devfreq:18500000.mali"
    assert info["gpu"]["governor"] == "simple_ondemand"
    assert info["gpu"]["can_set"] is False
    assert info["module_loadable"] is False and "not rooted" in info["module"]
    assert info["battery"]["status"] == "Discharging"
    assert info["battery"]["convention"].startswith("not calibrated")


def test_adb_probe_warns_when_charging(tmp_path, monkeypatch, capsys):
    phone = oneplus8(tmp_path / "phone")
    phone.battery.charging = True
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "probe"]) == 0
    out = capsys.readouterr().out
    assert "WARNING" in out and "charging" in out
    assert "not calibrated" in out


def test_adb_probe_no_server_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TURBOINFER_ADB_SERVER", "127.0.0.1:1")
    assert main(["android", "probe"]) == 2
    err = capsys.readouterr().err
    assert "no adb server at 127.0.0.1:1" in err and "adb start-server" in err


def _ko(tmp_path: Path, vermagic: str = "4.19.157-perf+ SMP preempt") -> Path:
    ko = tmp_path / "turboinfer.ko"
    ko.write_bytes(fake_module(vermagic=vermagic))
    return ko


def test_adb_deploy_loads_module_with_gpu_target(tmp_path, monkeypatch, capsys):
    phone = oneplus8(tmp_path / "phone")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "deploy", str(_ko(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "attached to 3d00000.qcom,kgsl-3d0" in out
    assert phone.modules == {"turboinfer": "target=3d00000.qcom,kgsl-3d0"}
    assert (phone.root / "dev/turboinfer").exists()
    assert (phone.root / "data/local/tmp/turboinfer.ko").read_bytes() == _ko(tmp_path).read_bytes()


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ({"rooted": False}, [], "no root on .*not rooted"),
        ({}, ["--vermagic", "6.1.0-13-amd64 SMP"], "vermagic mismatch.*6.1.0-13-amd64.*4.19.157"),
        ({"selinux_blocks_modules": True}, [], "SELinux \\(Enforcing\\) denied module_load"),
        ({}, ["--target", "nosuchgpu"], "no devfreq device matches target='nosuchgpu'"),
    ],
    ids=["no-root", "vermagic", "selinux", "bad-target"],
)
def test_adb_deploy_failures_are_explained(tmp_path, monkeypatch, capsys, setup, args, message):
    phone = oneplus8(tmp_path / "phone", **setup)
    vermagic = args[1] if args[:1] == ["--vermagic"] else "4.19.157-perf+ SMP preempt"
    extra = args if args[:1] == ["--target"] else []
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "deploy", str(_ko(tmp_path, vermagic)), *extra]) == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert phone.modules == {}


def test_adb_bench_control_only_without_termux(tmp_path, monkeypatch, capsys, tiny_gguf):
    """The real runner, no Termux on the phone: every controller drives the phone's KGSL
    live over adb while the battery meter measures and llama.cpp runs on the host, so
    the report says control only; the GPU is restored afterwards."""
    phone = oneplus8(tmp_path / "phone")
    kgsl = phone.root / "sys/class/kgsl/kgsl-3d0"
    before = {f: (kgsl / f).read_text() for f in ("min_pwrlevel", "max_pwrlevel")}
    with serving(monkeypatch, tmp_path / "state", phone):
        args = ["--model", str(tiny_gguf), "--n-ctx", "8192", "--max-tokens", "8"]
        assert main(["android", "bench", *args]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{") :])
    assert report["inference"].startswith("control only: inference on the host")
    assert report["simulated"] is False
    assert report["energy_source"].startswith("measured")
    assert set(report["controllers"]) == {"default", "tmpc"}
    for row in report["controllers"].values():
        assert row["tokens_per_s"] > 0 and row["energy_per_token_j"] is not None
    assert {f: (kgsl / f).read_text() for f in before} == before


def _fake_runner(monkeypatch: pytest.MonkeyPatch, fn) -> None:
    import turboinfer_llama.bench.runner as runner

    monkeypatch.setattr(runner, "run_bench", fn)


def test_adb_bench_hands_phone_device_and_meter_to_runner(tmp_path, monkeypatch, capsys):
    seen = {}

    def run_bench(*, device, meter, **options):
        seen["options"] = options
        device.set_hz(device.frequencies_hz()[0])
        meter.begin_window("bench")
        m = meter.end_window("bench")
        seen["measurement"] = m
        return {"energy_j": m.energy_j, "device": device.name}

    _fake_runner(monkeypatch, run_bench)
    phone = oneplus8(tmp_path / "phone")
    kgsl = phone.root / "sys/class/kgsl/kgsl-3d0"
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "bench", "--model", "m.gguf"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"].startswith(f"adb:{phone.serial}")
    assert out["control_only"] is True and "no Termux Python" in out["why_control_only"]
    assert seen["options"] == {"model": "m.gguf"}
    assert not seen["measurement"].simulated and seen["measurement"].energy_j > 0
    assert (kgsl / "min_pwrlevel").read_text().strip() == "6"  # restored after the run


def test_adb_bench_refuses_while_charging(tmp_path, monkeypatch, capsys):
    _fake_runner(monkeypatch, lambda *, device, meter: None)
    phone = oneplus8(tmp_path / "phone")
    phone.battery.charging = True
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "bench"]) == 2
    assert "charging" in capsys.readouterr().err


def test_adb_restore_after_lost_connection(tmp_path, monkeypatch, capsys):
    from turboinfer_llama.devices import open_device

    phone = oneplus8(tmp_path / "phone")
    kgsl = phone.root / "sys/class/kgsl/kgsl-3d0"
    with serving(monkeypatch, tmp_path / "state", phone) as srv:
        gpu = open_device("adb")
        gpu.set_hz(400_000_000)
        srv.stop()
        gpu.close()
        assert gpu.errors
    assert (kgsl / "max_pwrlevel").read_text().strip() == "5"  # still pinned
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "restore"]) == 0
        assert main(["android", "restore"]) == 2  # nothing left to restore
    assert (kgsl / "max_pwrlevel").read_text().strip() == "0"
    assert (kgsl / "min_pwrlevel").read_text().strip() == "6"
    assert "GPU restored to governor msm-adreno-tz, 305-670 MHz" in capsys.readouterr().out


def test_adb_push_run_prints_guide_and_pushes_script(tmp_path, monkeypatch, capsys):
    phone = oneplus8(tmp_path / "phone")
    (phone.root / "sdcard/Download").mkdir(parents=True)
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "push-run", "--push"]) == 0
    out = capsys.readouterr().out
    assert "## On the phone (Termux)" in out and "termux-run.sh" in out
    pushed = phone.root / "sdcard/Download/turboinfer-termux.sh"
    assert pushed.read_bytes() == (EXAMPLES / "termux-run.sh").read_bytes()


def test_adb_termux_helper_script_dry_run():
    script = str(EXAMPLES / "termux-run.sh")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", script, *args], capture_output=True, text=True, timeout=30)

    r = run("--dry-run", "bench", "model.gguf", "kmod")
    assert r.returncode == 0
    assert r.stdout.strip() == (
        "+ su -c turboinfer bench --model 'model.gguf' --device kmod --meter battery"
    )
    r = run("--dry-run", "setup", "turboinfer_llama-0.1.0.tar.gz")
    assert "+ pip install turboinfer_llama-0.1.0.tar.gz[server]" in r.stdout
    assert run("--dry-run", "serve", "m.gguf", "sim").returncode == 2
    assert "Usage:" in run("--help").stdout
