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
