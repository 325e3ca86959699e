"""The default governor at several phases of its polling timer (bench.default_phases)."""

from __future__ import annotations

from turboinfer_llama.accounting import PhoneTrace, default_shadow, phone_segments
from turboinfer_llama.bench.default_phases import PHASES, default_phase_spread, spread_line
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import load_profile


def _phone(profile_name: str):
    profile = load_profile(profile_name)
    segments = phone_segments(make_trace(requests=3, decode_tokens=24, prompt_tokens=11), profile)
    return segments, profile


def test_the_spread_runs_the_default_at_each_phase_the_first_being_the_benchs_own():
    segments, profile = _phone("mali-g76")
    got = default_phase_spread(segments, profile)
    assert got is not None and got["phases"] == PHASES and got["simulated"] is True
    own = default_shadow(PhoneTrace.shared(segments, profile), profile)
    assert got["tpot_ms"]["this_run"] == own.tpot_ms
    assert got["ttft_ms"]["this_run"] == own.ttft_ms
    assert got["energy_per_token_j"]["this_run"] == own.energy_per_token_j
    for key in ("tpot_ms", "ttft_ms", "energy_per_token_j"):
        s = got[key]
        assert s["min"] <= s["this_run"] <= s["max"] and s["min"] <= s["mean"] <= s["max"]
    # the phase matters on this multi-stable governor: not every phase ran alike
    assert got["tpot_ms"]["max"] > got["tpot_ms"]["min"]
    assert "timer phases (simulated)" in (spread_line({"default_timer_phases": got}) or "")


def test_no_spread_where_the_default_has_no_polling_timer():
    segments, profile = _phone("adreno650")  # msm-adreno-tz
    assert default_phase_spread(segments, profile) is None
    assert spread_line({"default_timer_phases": None}) is None
