"""Each controller's energy and time by request and phase (bench.breakdown)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turboinfer_llama.bench.breakdown import breakdown, main
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.base import DeviceNotFound

RECORDING = Path(__file__).resolve().parents[1] / "docs" / "recordings"
RECORDING = RECORDING / "gemma3-270m-4prompts.json.gz"


@pytest.fixture(scope="module")
def doc():
    segments = make_trace(requests=3, decode_tokens=24, prompt_tokens=11)
    return breakdown(segments, "sim:generic", ("default", "tmpc", "phase"))


def test_each_controllers_requests_add_up_to_its_run(doc):
    assert doc["simulated"] is True
    for name, got in doc["controllers"].items():
        reqs = got["requests"]
        assert len(reqs) == 3, name
        parts = sum(r["prefill_j"] + r["decode_j"] for r in reqs) + got["idle_j"]
        assert parts == pytest.approx(got["energy_j"], rel=1e-9), name
        for r in reqs:
            assert r["prefill_ms"] > 0 and r["decode_ms"] > 0
            assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0
            busy = sum(r["decode_busy_ms_by_mhz"].values())
            assert 0 < busy <= r["decode_ms"] + 1e-9


def test_each_request_is_set_against_the_defaults_same_request(doc):
    base = doc["controllers"]["default"]["requests"]
    for name in ("default", "tmpc", "phase"):
        for r, b in zip(doc["controllers"][name]["requests"], base, strict=True):
            assert r["decode_j_vs_default"] == pytest.approx(r["decode_j"] - b["decode_j"])
            assert r["prefill_j_vs_default"] == pytest.approx(r["prefill_j"] - b["prefill_j"])
    # the phase split runs every decode at one level
    for r in doc["controllers"]["phase"]["requests"]:
        assert len(r["decode_busy_ms_by_mhz"]) == 1


def test_only_a_simulated_device_and_a_known_profile():
    segments = make_trace(requests=1, decode_tokens=4, prompt_tokens=4)
    with pytest.raises(ValueError, match="simulated device"):
        breakdown(segments, "devfreq", ("default",))
    with pytest.raises(DeviceNotFound):
        breakdown(segments, "sim:no-such-profile", ("default",))


def test_the_command_prints_simulated_figures_per_request_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bd.json"
    args = ["--replay", str(RECORDING), "--device", "sim:mali-g76", "--controllers", "default"]
    assert main([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "simulated" in text and "request 4:" in text
    got = json.loads(out.read_text())
    assert got["simulated"] is True and len(got["controllers"]["default"]["requests"]) == 4


def test_the_command_refuses_a_missing_recording(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--replay", str(tmp_path / "none.json")])
    assert e.value.code == 2
    assert "none.json" in capsys.readouterr().err


def test_a_sweep_points_device_as_the_sweep_builds_it():
    segments = make_trace(requests=2, decode_tokens=12, prompt_tokens=11)
    fast = breakdown(segments, "sim:mali-g76", ("default",))
    slow = breakdown(segments, "sim:mali-g76", ("default",), params={"host_cpu_scale": 2.0})
    assert fast["sweep_params"] is None
    assert slow["sweep_params"]["host_cpu_scale"] == 2.0
    assert slow["sweep_params"]["switch_latency_us"] == 1000.0  # the profile's own
    # a host twice as slow: the same requests take longer
    assert slow["controllers"]["default"]["tpot_ms"] > fast["controllers"]["default"]["tpot_ms"]
    with pytest.raises(ValueError, match="unknown sweep parameter"):
        breakdown(segments, "sim:mali-g76", ("default",), params={"no_such": 1.0})


def test_the_command_reads_sweep_parameters(capsys):
    args = ["--replay", str(RECORDING), "--device", "sim:generic", "--controllers", "default"]
    assert main([*args, "--param", "background_change=true", "--param", "host_cpu_scale=2"]) == 0
    assert '"background_change": true' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*args, "--param", "host_cpu_scale"])
    assert "KEY=VALUE" in capsys.readouterr().err


def test_offline_controllers_are_figured_as_the_bench_figures_them():
    """The oracle's schedule is anchored to its steps: replayed as an event-driven
    controller it ran the 1,000-token prompt at the bottom level (generic, 2%: +91%
    TTFT). Figured by its own accounting it is the bench's oracle."""
    from turboinfer_llama.control.factory import for_device, make_controller

    segments = make_trace(requests=2, decode_tokens=16, prompt_tokens=11)
    names = ("default", "oracle-request", "phase")
    got = breakdown(segments, "sim:generic", names)["controllers"]
    for name in names[1:]:
        phone, factory = _devices_for(segments)
        ctl = make_controller(
            name,
            **for_device(factory()),
            latency_slack=0.02,
            trace=phone,
            device_factory=factory,
            seed=0,
        )
        acc = ctl.account()
        assert got[name]["energy_j"] == pytest.approx(acc.energy_j, rel=1e-9), name
        assert got[name]["ttft_ms"] == pytest.approx(acc.ttft_ms, rel=1e-9), name
        assert got[name]["tpot_ms"] == pytest.approx(acc.tpot_ms, rel=1e-9), name
    # and within the budget, as the bench reports it
    base = got["default"]
    assert got["oracle-request"]["ttft_ms"] <= 1.022 * base["ttft_ms"]
    assert got["oracle-request"]["tpot_ms"] <= 1.022 * base["tpot_ms"]


def _devices_for(segments):
    from turboinfer_llama.bench.breakdown import _devices

    phone, factory, _ = _devices(segments, "sim:generic", 0.02, None)
    return phone, factory


def test_replay_records_each_graphs_compute_time_at_the_clock_it_ran():
    from turboinfer_llama.control.factory import for_device, make_controller
    from turboinfer_llama.control.replay import replay

    segments = make_trace(requests=2, decode_tokens=8, prompt_tokens=11)
    phone, factory = _devices_for(segments)
    got = {}
    for hz in (200_000_000, 800_000_000):
        dev = factory()
        ctl = make_controller(f"static:{hz}", **for_device(dev), trace=phone, seed=0)
        got[hz] = replay(phone, ctl, dev, seed=0, granularity="graph").graph_compute_ns
    assert got[200_000_000].keys() == got[800_000_000].keys()
    assert len(got[200_000_000]) >= 2 * 8  # every prompt and decode graph
    assert all(got[200_000_000][g] > got[800_000_000][g] > 0 for g in got[200_000_000])


def test_the_hindsight_reference_is_the_reference_tmpc_keeps_its_budget_to():
    """The diagnostic row spends its budget against the default's own graph times:
    within the budget against the default, and a reference twice as slow (the hook
    fed wrong figures) shows at once as a slower decode."""
    from turboinfer_llama.bench.breakdown import HINDSIGHT
    from turboinfer_llama.control.factory import for_device, make_controller
    from turboinfer_llama.control.replay import replay

    segments = make_trace(requests=2, decode_tokens=24, prompt_tokens=11)
    doc = breakdown(segments, "sim:generic", ("default", "tmpc"), hindsight_reference=True)
    got = doc["controllers"]
    base, hind = got["default"], got[HINDSIGHT]
    assert doc["simulated"] is True
    assert hind["tpot_ms"] <= (1.02 + 0.002) * base["tpot_ms"]
    phone, factory = _devices_for(segments)
    dev = factory()
    base_ctl = make_controller("default", **for_device(dev), trace=phone, seed=0)
    ref = replay(phone, base_ctl, dev, seed=0, granularity="graph")
    dev = factory()
    ctl = make_controller("tmpc", **for_device(dev), latency_slack=0.02, trace=phone, seed=0)
    decode = {s.graph for s in phone if s.phase == "decode"}
    ctl.hindsight_reference_ns = {
        g: 2.0 * t for g, t in ref.graph_compute_ns.items() if g in decode
    }
    slow = replay(phone, ctl, dev, seed=0, granularity="graph")
    assert slow.tpot_ms > 1.05 * hind["tpot_ms"]
