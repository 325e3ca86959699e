"""`turboinfer sweep`: the design, one point's figures, the JSON schema, CLI errors."""

from __future__ import annotations

import gzip
import json

import pytest

from turboinfer_llama.bench import sweep
from turboinfer_llama.cli import main

DATA = "tests/data/gemma3_270m_10tok.json.gz"


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "rec.json"
    with gzip.open(DATA, "rb") as f:
        path.write_bytes(f.read())
    return path


def test_design_is_one_at_a_time_plus_latin_hypercube_per_profile_and_slack() -> None:
    pts = sweep.design(["adreno650", "mali-g76"], [0.0, 0.02, 0.05, 0.1], lhs=2, seed=1)
    assert len(pts) >= 20
    for prof in ("adreno650", "mali-g76"):
        mine = [p for p in pts if p.profile == prof]
        assert sorted(p.slack for p in mine if p.design == "nominal") == [0.0, 0.02, 0.05, 0.1]
        assert sum(p.design == "lhs" for p in mine) == 2
        oat = [p for p in mine if p.design.startswith("oat:")]
        nominal = next(p for p in mine if p.design == "nominal").params
        for p in oat:  # exactly one parameter moved
            moved = [k for k in nominal if p.params[k] != nominal[k]]
            assert moved == [p.design[4:]]
    # Mali has no bus votes: no coupling point that would repeat nominal
    assert not any(p.design == "oat:bus_coupling" for p in pts if p.profile == "mali-g76")
    lhs = [p.params for p in pts if p.design == "lhs"]
    assert all(50 <= q["switch_latency_us"] <= 80_000 for q in lhs)
    assert all(0 <= q["background_share"] <= 0.5 for q in lhs)
    assert sweep.design(["adreno650"], [0.05], lhs=2, seed=1) == sweep.design(
        ["adreno650"], [0.05], lhs=2, seed=1
    )


def test_one_point_json_schema_and_the_mid_run_load(recording, tmp_path, monkeypatch) -> None:
    nominal = sweep.nominal(
        sweep._profile_of(
            sweep.Point(
                "adreno650",
                0.05,
                "x",
                {
                    "switch_latency_us": 500.0,
                    "bus_coupling": 1.0,
                    "host_cpu_scale": 1.0,
                    "compute_efficiency_scale": 1.0,
                    "clock_gated_idle_fraction": 0.1,
                    "background_share": 0.0,
                    "background_change": False,
                },
            )
        )
    )
    points = [
        sweep.Point("adreno650", 0.05, "nominal", nominal),
        sweep.Point(
            "adreno650", 0.05, "oat:background_change", {**nominal, "background_change": True}
        ),
    ]
    monkeypatch.setattr(sweep, "design", lambda *a, **k: points)
    saved: list[dict] = []
    doc = sweep.run_sweep(
        str(recording), profiles=["adreno650"], slacks=[0.05], workers=1, partial=saved.append
    )
    assert [len(d["points"]) for d in saved] == [1, 2]
    assert not saved[0]["complete"]
    assert doc["version"] == 1 and doc["simulated"] is True and doc["complete"] is True
    assert len(doc["points"]) == 2
    keys = {
        "energy_saving_vs_default",
        "latency_change_vs_default",
        "ttft_change_vs_default",
        "oracle_fraction",
    }
    for pt in doc["points"]:
        assert set(pt) >= {"profile", "slack", "params", "controllers"}
        assert set(pt["controllers"]) == set(sweep.CONTROLLERS)
        for row in pt["controllers"].values():
            assert set(row) >= keys
        d = pt["controllers"]["default"]
        assert d["energy_saving_vs_default"] == 0 and d["latency_change_vs_default"] == 0
        # the hindsight baselines keep the budget on both axes
        for name in ("static-best", "phase"):
            row = pt["controllers"][name]
            assert row["latency_change_vs_default"] <= 0.05 + 1e-9
            assert row["ttft_change_vs_default"] <= 0.05 + 1e-9
        assert pt["controllers"]["oracle"]["oracle_fraction"] == pytest.approx(1.0)
    # the photo backup slows the run: the baselines' absolute figures move
    assert doc["points"][0]["controllers"] != doc["points"][1]["controllers"]
    out = tmp_path / "t.json"
    out.write_text(json.dumps(doc))
    assert sweep.table(doc).row_count == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--replay", "/nonexistent.json", "--json", "x.json"], "no such file"),
        (["--slacks", "0.02,7"], "within 0..1"),
        (["--slacks", "a"], "comma-separated"),
        (["--profiles", "adreno999"], "adreno650"),
        (["--json", "/nonexistent/dir/x.json"], "does not exist"),
    ],
)
def test_argument_errors_one_line(args, needle, recording, capsys) -> None:
    base = {"--replay": str(recording), "--json": "out.json"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = ["sweep", *[x for kv in base.items() for x in kv]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") <= 2
