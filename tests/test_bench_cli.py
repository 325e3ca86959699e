"""`turboinfer bench` on the tiny GGUF: errors, JSON schema, replay determinism, plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from turboinfer_llama.cli import main

FAST = ["--max-tokens", "6", "--live-rounds", "0", "--n-ctx", "256"]


def _bench(*args: str) -> int:
    return main(["bench", *args])


@pytest.fixture(scope="module")
def recorded(tiny_gguf, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bench")
    rec, js = out / "rec.json", out / "report.json"
    prompts = out / "prompts.txt"  # the byte-level tiny model cannot hold the built-in set
    prompts.write_text("Explain why the sky is blue.\nWrite a haiku about rain.\n")
    rc = _bench(
        "--model",
        str(tiny_gguf),
        *FAST,
        "--prompts",
        str(prompts),
        "--all",
        "--record",
        str(rec),
        "--json",
        str(js),
        "--csv",
        str(out / "t.csv"),
        "--trace",
        str(out / "trace.json"),
    )
    assert rc == 0
    return rec, json.loads(js.read_text())


def test_json_schema(recorded):
    _, report = recorded
    assert report["version"] == 1 and report["simulated"] is True
    assert report["device"] == "sim:adreno650"
    assert set(report["controllers"]) == {
        "default",
        "max",
        "reactive",
        "ztt",
        "tmpc",
        "oracle",
        "oracle-request",
        "static-best",
        "phase",
        "phase-request",
        "phase-prefix",
    }
    keys = {
        "energy_per_token_j",
        "avg_power_w",
        "ttft_ms",
        "tpot_ms",
        "tokens_per_s",
        "energy_saving_vs_default",
        "latency_change_vs_default",
        "ttft_change_vs_default",
        "oracle_fraction",
        "oracle_request_fraction",
        "switches_per_s",
        "decision_us_median",
    }
    for row in report["controllers"].values():
        assert keys <= set(row)
        assert row["energy_per_token_j"] > 0 and row["tpot_ms"] > 0
        assert row["simulated"] is True
    assert report["controllers"]["default"]["energy_saving_vs_default"] == 0.0
    assert report["controllers"]["default"]["ttft_change_vs_default"] == 0.0
    acc = report["accounting"]
    assert acc["accounting_ms_per_token"] > 0
    # the arrays-based accounting of every controller's issued switches = its replay
    assert max(acc["max_rel_error_vs_replay"].values()) < 5e-3
    assert report["live"] is None  # --live-rounds 0
    # the oracle's Lagrangian dual bound: below its schedule's modelled energy, close
    bound = report["oracle_bound"]
    assert bound["dual_bound_j"] <= bound["model_energy_j"]
    assert 0.0 <= bound["gap"] < 0.01


def test_csv_and_trace_written(recorded):
    rec, _ = recorded
    out = rec.parent
    rows = (out / "t.csv").read_text().splitlines()
    # a header and a row per controller of the full comparison
    assert rows[0].startswith("controller,energy_per_token_j") and len(rows) == 12
    doc = json.loads((out / "trace.json").read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "freq_mhz" in names and "MUL_MAT" in names


def test_each_request_has_its_own_latency_against_the_defaults(recorded):
    """``per_request``: every controller, replayed or accounted, lists each request's
    tokens, TTFT and TPOT; they pool to the run's figures, and each is set against the
    default's same request."""
    _, report = recorded
    base = report["controllers"]["default"]["per_request"]
    assert len(base) == report["prompts"] * report["repeats"] == 2
    for name, row in report["controllers"].items():
        reqs = row["per_request"]
        assert len(reqs) == len(base), name
        assert sum(q["tokens"] for q in reqs) == row["tokens"]
        mean_ttft = sum(q["ttft_ms"] for q in reqs) / len(reqs)
        assert mean_ttft == pytest.approx(row["ttft_ms"], rel=1e-9), name
        gaps = [(q["tpot_ms"], q["tokens"] - 1) for q in reqs if q["tpot_ms"] is not None]
        pooled = sum(t * n for t, n in gaps) / sum(n for _, n in gaps)
        assert pooled == pytest.approx(row["tpot_ms"], rel=1e-9), name
        for q, b in zip(reqs, base, strict=True):
            assert q["ttft_change_vs_default"] == pytest.approx(q["ttft_ms"] / b["ttft_ms"] - 1)
            assert q["tpot_change_vs_default"] == pytest.approx(q["tpot_ms"] / b["tpot_ms"] - 1)
    assert all(q["tpot_change_vs_default"] == 0.0 for q in base)


def test_the_json_gives_the_default_at_other_timer_phases_on_an_ondemand_gpu(recorded, tmp_path):
    rec, report = recorded
    assert report["default_timer_phases"] is None  # adreno650's msm-adreno-tz: no timer
    out = tmp_path / "generic.json"
    args = ["--replay", str(rec), "--device", "sim:generic", "--controllers", "default,tmpc"]
    assert _bench(*args, "--no-timing", "--json", str(out)) == 0
    doc = json.loads(out.read_text())
    spread = doc["default_timer_phases"]
    assert spread["governor"] == "simple_ondemand" and spread["simulated"] is True
    assert spread["phases"] == 8 and spread["polling_ms"] == 50.0
    assert spread["tpot_ms"]["this_run"] == doc["controllers"]["default"]["tpot_ms"]
    assert spread["ttft_ms"]["this_run"] == doc["controllers"]["default"]["ttft_ms"]


def test_replay_is_byte_identical(recorded, tmp_path):
    rec, _ = recorded
    outs = []
    for i in range(2):
        js = tmp_path / f"r{i}.json"
        assert (
            _bench("--replay", str(rec), "--all", "--seed", "3", "--no-timing", "--json", str(js))
            == 0
        )
        outs.append(js.read_bytes())
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["controllers"]["tmpc"]["decision_us_median"] is None


def test_plot_created(recorded, tmp_path):
    pytest.importorskip("matplotlib")
    rec, _ = recorded
    png = tmp_path / "fig.png"
    assert _bench("--replay", str(rec), "--plot", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "/nonexistent/model.gguf"], "model not found"),
        (["--controllers", "default,bogus"], "unknown controller 'bogus'"),
        (["--device", "nosuch:thing"], "device"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
        (["--max-tokens", "0"], "--max-tokens must be positive"),
        (["--replay", "/nonexistent/trace.json"], "trace not found"),
        (["--n-ctx", "128"], "more than --n-ctx 128"),
    ],
)
def test_argument_errors_one_line(args, needle, tiny_gguf):
    argv = ["bench", *FAST, *args]
    if "--model" not in args:
        argv += ["--model", str(tiny_gguf)]
    proc = subprocess.run(
        [sys.executable, "-m", "turboinfer_llama.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_prompts_file(tmp_path, tiny_gguf, capsys):
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    assert _bench("--model", str(tiny_gguf), *FAST, "--prompts", str(bad)) == 2
    assert "invalid JSON" in capsys.readouterr().err


def test_prompts_file_and_live_ab(tmp_path, tiny_gguf):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello the world\n\nthe world is\n")
    js = tmp_path / "r.json"
    assert (
        _bench(
            "--model",
            str(tiny_gguf),
            "--max-tokens",
            "6",
            "--n-ctx",
            "256",
            "--live-rounds",
            "2",
            "--prompts",
            str(prompts),
            "--json",
            str(js),
        )
        == 0
    )
    report = json.loads(js.read_text())
    assert report["prompts"] == 2
    live = report["live"]
    assert live["tokens_per_s_on"] > 0 and live["tokens_per_s_off"] > 0 and live["ratio"] > 0


def test_trace_export_and_stats(recorded, tmp_path, capsys):
    rec, _ = recorded
    out = tmp_path / "p.json"
    assert main(["trace", "export", str(rec), str(out)]) == 0
    doc = json.loads(out.read_text())
    assert any(e.get("name") == "MUL_MAT" for e in doc["traceEvents"])
    assert main(["trace", "stats", str(rec)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["stalls"]["sample"]["count"] > 0 and stats["kernels"]["count"] > 0
    assert main(["trace", "stats", str(tmp_path / "missing.json")]) == 2


def test_table_labels_simulated_energy(recorded, capsys):
    rec, _ = recorded
    assert _bench("--replay", str(rec), "--controllers", "default,tmpc") == 0
    out = capsys.readouterr().out
    assert out.count("[simulated]") >= 2  # the energy and power column headers
    assert "energy simulated" in out
    assert "tmpc" in out


def test_ctrl_c_keeps_partial_results(recorded, tmp_path, monkeypatch):
    import turboinfer_llama.bench.runner as runner

    rec, _ = recorded
    real_replay = runner.replay
    calls = []

    def interrupted_replay(*args, **kwargs):
        # default is figured by the accounting (no replay): the first replay is tmpc's
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_replay(*args, **kwargs)

    monkeypatch.setattr(runner, "replay", interrupted_replay)
    js = tmp_path / "partial.json"
    assert _bench("--replay", str(rec), "--controllers", "default,tmpc", "--json", str(js)) == 130
    report = json.loads(js.read_text())
    assert report["interrupted"] is True
    assert list(report["controllers"]) == ["default"]
