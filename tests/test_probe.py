"""``turboinfer probe`` against the fake trees."""

from __future__ import annotations

import json

from fakesysfs import make_battery, make_exynos_mali, make_jetson_orin, make_oneplus8_kgsl

from turboinfer_llama.cli import main


def probe_json(root, capsys) -> dict:
    assert main(["probe", "--root", str(root), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_probe_oneplus8_and_battery(tmp_path, capsys) -> None:
    make_oneplus8_kgsl(tmp_path)
    make_battery(tmp_path)
    report = probe_json(tmp_path, capsys)
    assert report["auto_picks"] == "kgsl"
    names = {d["name"]: d for d in report["devices"]}
    kgsl = names["kgsl:kgsl-3d0"]
    assert kgsl["governor"] == "msm-adreno-tz"
    assert kgsl["frequencies_mhz"] == [305, 400, 441.6, 490, 525, 587, 670]
    assert kgsl["current_mhz"] == 305 and kgsl["can_set"]
    assert "devfreq:3d00000.qcom,kgsl-3d0" in names  # KGSL's devfreq node is listed too
    meters = {m["meter"]: m["usable"] for m in report["meters"]}
    assert meters["battery"] and meters["sim"] and not meters["rapl"]


def test_probe_jetson_and_mali(tmp_path, capsys) -> None:
    make_jetson_orin(tmp_path)
    make_exynos_mali(tmp_path)
    report = probe_json(tmp_path, capsys)
    assert report["auto_picks"] == "devfreq"
    busy = {d["name"]: d.get("busy_source", "") for d in report["devices"]}
    assert "jetson load" in busy["devfreq:17000000.ga10b"]
    assert "mali utilization" in busy["devfreq:18500000.mali"]


def test_probe_empty_machine_tables(tmp_path, capsys) -> None:
    assert main(["probe", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sim:adreno650 (simulated)" in out
    assert "Energy meters" in out and "GPU backends" in out


def test_probe_bad_root(tmp_path, capsys) -> None:
    assert main(["probe", "--root", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_probe_shows_llama_cpp_devices_beside_the_gpu(tmp_path, capsys) -> None:
    from turboinfer_llama.engine import backends

    make_oneplus8_kgsl(tmp_path)
    report = probe_json(tmp_path, capsys)
    llama = report["llama_cpp"]
    assert llama["gpu_offload"] == backends.supports_gpu_offload()
    assert any(d["backend"] == "CPU" and d["type"] == "cpu" for d in llama["devices"])
    assert {b["name"] for b in llama["backends"]} >= {"CPU"}
    verdict = report["compute_matches_steered"]
    if not any(d["type"] in ("gpu", "igpu") for d in llama["devices"]):
        assert verdict["match"] is False and "no GPU device" in verdict["why"]
    else:  # a Vulkan host build (lavapipe) is no Adreno either
        assert verdict["match"] is False and "kgsl" in verdict["why"]
    assert main(["probe", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp compute devices" in out and "computes on the steered GPU: NO" in out


def test_match_adreno_vulkan_device_with_kgsl() -> None:
    from turboinfer_llama.commands.probe import match_backends

    gpus = [{"backend": "kgsl", "name": "kgsl:kgsl-3d0"}]
    adreno = {
        "devices": [
            {"name": "CPU", "type": "cpu", "description": "Kryo", "backend": "CPU"},
            {
                "name": "Vulkan0",
                "type": "igpu",
                "description": "Adreno (TM) 650",
                "backend": "Vulkan",
            },
        ]
    }
    v = match_backends(gpus, adreno)
    assert v["match"] is True and "Vulkan0" in v["why"] and "kgsl:kgsl-3d0" in v["why"]
    mali = {
        "devices": [
            {"name": "Vulkan0", "type": "igpu", "description": "Mali-G76", "backend": "Vulkan"}
        ]
    }
    v = match_backends(gpus, mali)
    assert v["match"] is False and "Mali-G76" in v["why"]
    assert match_backends([], adreno)["match"] is None
    unknown = [{"backend": "devfreq", "name": "devfreq:fde60000.gpu"}]
    assert match_backends(unknown, adreno)["match"] is None
