"""The latency budget is a promise: tmpc's TPOT and TTFT stay within the slack of the
default governor's, on every shipped profile, on generated profiles within physical
ranges, and on a profile file no test or constant was tuned for. All simulated.

The reference tmpc keeps its budget against is the top level's measured time (the
default can never be faster), so the promise holds whatever the default governor does;
the tolerance below is what the measured runs need at ``graph`` granularity, where a
graph runs open-loop on its timed plan (kernel granularity stays within 0.1 point).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices import open_device
from turboinfer_llama.devices.sim import SimGpu, load_profile

# the target: +0.2 point. Measured with the planned slowdown widened by the
# upper quantile of the gain's recent overruns: three 40-example runs of the property
# test below (hypothesis seeds 1, 2, 3) all within it; on a synthetic grid (4 profiles,
# both granularities, slack 0/2/5%) the worst excess is +0.02 point. Derandomized, so
# a CI run cannot fail on a draw no other run saw
TOLERANCE = 0.002
PROFILES = ("adreno650", "adreno640", "mali-g76", "generic")


def _changes(profile, trace, slack: float, granularity: str) -> tuple[float, float]:
    dev = SimGpu(profile)
    base = replay(
        trace, make_controller("default", **for_device(dev)), dev, granularity=granularity
    )
    dev = SimGpu(profile)
    ctl = make_controller("tmpc", latency_slack=slack, **for_device(dev))
    got = replay(trace, ctl, dev, granularity=granularity)
    return got.tpot_ms / base.tpot_ms - 1.0, got.ttft_ms / base.ttft_ms - 1.0


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(PROFILES),
    slack=st.sampled_from((0.0, 0.02, 0.05, 0.10)),
    granularity=st.sampled_from(("graph", "kernel")),
    switch_us=st.floats(50.0, 2_000.0),
    coupling=st.floats(0.0, 1.0),
    compute_scale=st.floats(0.3, 3.0),
    idle_fraction=st.floats(0.05, 0.3),
    sample_ms=st.floats(1.5, 6.0),
    sigma=st.floats(0.0, 0.25),
    seed=st.integers(0, 1000),
)
# the stop-18 regression: +5.4% (kernel) and +11.8% (graph) against a 2% budget; the
# stop-20 and stop-21 cases over +0.2 point (+5.29% and +5.21% at a 5% budget)
@example("adreno650", 0.02, "kernel", 500.0, 1.0, 1.0, 0.1, 6.0, 0.0, 0)
@example("adreno650", 0.02, "graph", 500.0, 1.0, 1.0, 0.1, 6.0, 0.0, 0)
@example("adreno640", 0.05, "graph", 752.0, 0.0, 0.5, 0.05, 1.5, 0.0, 658)
# stop 23: at slack 0, plans below the top spent the reference's noise (+0.29% TPOT;
# +0.57% planning two graphs ahead)
@example("adreno640", 0.0, "graph", 50.0, 0.0, 0.5, 0.25, 2.0, 0.0, 0)
# stop 25: at slack 0 under simple_ondemand, decode wholly at the default's bound level
# (not the top) ran +4.9% on a Mali computing 9x slower than the model's prior (found
# by this test with compute_scale widened to 0.3-3; the change was reverted)
@example("mali-g76", 0.0, "graph", 50.0, 0.0, 0.375, 0.25, 2.0, 0.0, 0)
# stop 26: the same profile at 2% ran +5.7% (graph) and +3.7% (kernel): the default's
# bound, built from a model 9x off, put the default two levels below where it ran
# (fixed: the bound is trusted only while the plans hit, tmpc.BOUND_TRUST_TUBE)
@example("mali-g76", 0.02, "graph", 50.0, 0.0, 0.375, 0.25, 2.0, 0.0, 0)
@example("mali-g76", 0.02, "kernel", 50.0, 0.0, 0.375, 0.25, 2.0, 0.0, 0)
@example(
    "adreno640", 0.05, "kernel", 661.1717734697933, 0.4198242694305766, 0.5,
    0.19134132716372776, 2.3125, 0.17536583988493434, 840,
)  # fmt: skip
def test_tmpc_keeps_the_budget_on_generated_profiles(
    name,
    slack,
    granularity,
    switch_us,
    coupling,
    compute_scale,
    idle_fraction,
    sample_ms,
    sigma,
    seed,
):
    base = load_profile(name)
    profile = dataclasses.replace(
        base,
        switch_latency_direct_ns=round(switch_us * 1e3),
        bus_coupling=coupling,
        compute_efficiency=base.compute_efficiency * compute_scale,
        clock_gated_idle_fraction=idle_fraction,
    )
    trace = make_trace(
        requests=2,
        decode_tokens=10,
        prompt_tokens=12,
        sample_ms=sample_ms,
        sample_sigma=sigma,
        inter_kernel_us=12.0,
        seed=seed,
    )
    tpot, ttft = _changes(profile, trace, slack, granularity)
    assert tpot <= slack + TOLERANCE, (tpot, slack)
    assert ttft <= slack + TOLERANCE, (ttft, slack)


def _unseen_profile(path: Path) -> Path:
    """A profile file like the issue's unseen one: 8 levels, a 1.2 ms switch, a vote
    table of its own (written from adreno650's, every changed value marked)."""
    raw = json.loads(
        (Path(__file__).parents[1] / "turboinfer_llama/devices/profiles/adreno650.json").read_text()
    )
    doc = copy.deepcopy(raw)
    doc["name"] = "unseen-8"
    levels = [180_000_000, 267_000_000, 355_000_000, 430_000_000, 512_000_000,
              608_000_000, 700_000_000, 810_000_000]  # fmt: skip
    doc["levels_hz"] = {"value": levels, "assumption": "test profile, no device"}
    doc["voltages_v"] = {
        "value": [0.56, 0.6, 0.64, 0.68, 0.72, 0.76, 0.8, 0.85],
        "assumption": "test profile",
    }
    doc["initial_hz"] = {"value": levels[0], "assumption": "test profile"}
    doc["bus_vote_index"] = {"value": [3, 3, 7, 7, 9, 9, 11, 11], "assumption": "test profile"}
    doc["switch_latency_direct_us"] = {"value": 1200.0, "assumption": "test profile"}
    doc["min_dwell_us"] = {"value": 1200.0, "assumption": "test profile"}
    out = path / "unseen-8.json"
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize("slack", [0.0, 0.02, 0.05, 0.10])
def test_tmpc_keeps_the_budget_on_a_profile_file_it_never_saw(tmp_path, slack):
    spec = f"sim:{_unseen_profile(tmp_path)}"
    dev = open_device(spec)
    profile = dev.profile
    dev.close()
    assert profile.name == "unseen-8" and len(profile.levels_hz) == 8
    trace = make_trace(
        requests=2, decode_tokens=12, prompt_tokens=16, sample_ms=3.0, inter_kernel_us=20.0, seed=3
    )
    for granularity in ("graph", "kernel"):
        tpot, ttft = _changes(profile, trace, slack, granularity)
        assert tpot <= slack + TOLERANCE, (granularity, tpot)
        assert ttft <= slack + TOLERANCE, (granularity, ttft)


def _default_and_tmpc_under_load(profile, trace, schedule_of):
    """``default`` and ``tmpc`` (2%) on ``profile`` with another app's DRAM load on
    ``schedule_of(d)``, ``d`` the run's duration without it (ns)."""
    quiet = replay(
        trace, make_controller("default", **for_device(SimGpu(profile))), SimGpu(profile)
    )
    schedule = schedule_of(int(quiet.duration_s * 1e9))
    dev = SimGpu(profile, background_schedule=schedule)
    base = replay(trace, make_controller("default", **for_device(dev)), dev)
    dev = SimGpu(profile, background_schedule=schedule)
    got = replay(trace, make_controller("tmpc", latency_slack=0.02, **for_device(dev)), dev)
    return base, got


@pytest.mark.parametrize(("seed", "requests", "tokens"), [(0, 2, 96), (2, 1, 160)])
def test_tmpc_keeps_the_budget_when_another_apps_dram_load_comes_and_goes(seed, requests, tokens):
    """Another app takes 40% of the DRAM bandwidth from a third to two thirds of the
    run (the sweep's ``background_change``). The reference is the median of the last
    top-level probes; probes taken under the load set it for up to two probe intervals
    after the load had gone, every plan looked ahead of it, and TPOT ran at +6.1% to
    +6.8% here against a 2% budget (+9.0% in the sweep on a gemma recording). Now a
    graph below the top that runs faster than the reference (no lower clock is
    faster: the probes are stale) brings the next probe forward, and a probe that
    disagrees with the reference brings the two after it forward."""
    trace = make_trace(
        requests=requests, decode_tokens=tokens, prompt_tokens=16, seed=seed, model="gemma-3-270m"
    )
    base, got = _default_and_tmpc_under_load(
        load_profile("adreno650"), trace, lambda d: [(d // 3, 0.4), (2 * d // 3, 0.0)]
    )
    assert got.tpot_ms <= base.tpot_ms * (1.02 + TOLERANCE)
    assert got.ttft_ms <= base.ttft_ms * (1.02 + TOLERANCE)
    assert got.energy_j < base.energy_j  # and it still saves


def generated_gpu(seed: int):
    """One generated GPU and run, drawn from ``seed``: a level table of its own (4-14
    levels, 150 MHz-1.2 GHz), either default governor with its tunables drawn (polling
    20-200 ms, thresholds, the tz steps), compute 0.3-3x and memory 0.6-1.5x the
    shipped profile's, DRAM bandwidth 0.5-2x, the phone host model (batching, CPU
    speed), idle power, wake-up and switch latency; a synthetic trace and a slack.
    Every value within physical ranges; none is a shipped profile's."""
    rng = np.random.default_rng(seed)
    base = load_profile(str(rng.choice(PROFILES)))
    n_lv = int(rng.integers(4, 15))
    top = rng.uniform(500e6, 1200e6)
    hz = np.geomspace(top * rng.uniform(0.15, 0.5), top, n_lv)
    hz[1:-1] *= rng.uniform(0.97, 1.03, n_lv - 2)
    hz = np.unique(np.round(hz / 1e6).astype(int) * 1_000_000)
    switch_ns = int(rng.uniform(50, 2000) * 1e3)
    volts = np.linspace(rng.uniform(0.5, 0.6), rng.uniform(0.75, 0.9), len(hz))
    kw = {
        "levels_hz": tuple(int(x) for x in hz),
        "voltages_v": tuple(float(v) for v in volts),
        "initial_hz": int(hz[rng.integers(0, len(hz))]),
        "default_governor": str(rng.choice(["msm-adreno-tz", "simple_ondemand"])),
        "ondemand_up_threshold": int(rng.integers(70, 96)),
        "ondemand_down_differential": int(rng.integers(3, 16)),
        "ondemand_polling_ns": int(rng.uniform(20, 200) * 1e6),
        "tz_call_interval_ns": int(rng.uniform(5, 20) * 1e6),
        "tz_ceiling_ns": int(rng.uniform(30, 80) * 1e6),
        "tz_ramp_up_idle_ns": int(rng.uniform(3, 10) * 1e6),
        "tz_laziness": int(rng.integers(2, 9)),
        "compute_efficiency": (
            base.compute_efficiency * float(np.exp(rng.uniform(np.log(0.3), np.log(3.0))))
        ),
        "memory_efficiency": min(0.95, base.memory_efficiency * rng.uniform(0.6, 1.5)),
        "dram_bandwidth_bytes_per_s": base.dram_bandwidth_bytes_per_s * rng.uniform(0.5, 2.0),
        "switch_latency_direct_ns": switch_ns,
        "min_dwell_ns": int(switch_ns * rng.choice([0.0, 1.0])),
        "clock_gated_idle_fraction": float(rng.uniform(0.05, 0.3)),
        "host_cpu_factor": float(rng.uniform(1.0, 4.0)),
        "submit_batch_nodes": int(rng.integers(50, 200)),
        "wakeup_ns": int(rng.uniform(0.2, 3) * 1e6),
        "idle_timeout_ns": int(rng.uniform(20, 200) * 1e6),
        "bus_coupling": float(rng.uniform(0, 1)),
    }  # fmt: skip
    if base.bus_vote_index:
        n_votes = len(base.bus_index_bandwidth_fraction)
        kw["bus_vote_index"] = tuple(int(x) for x in np.sort(rng.integers(1, n_votes, len(hz))))
    profile = dataclasses.replace(base, **kw)
    slack = float(rng.choice([0.0, 0.02, 0.05, 0.10]))
    granularity = str(rng.choice(["graph", "kernel"]))
    trace = make_trace(
        requests=int(rng.integers(2, 4)),
        decode_tokens=int(rng.choice([10, 32])),
        prompt_tokens=int(rng.integers(8, 200)),
        sample_ms=float(rng.uniform(1.5, 6)),
        sample_sigma=float(rng.uniform(0, 0.25)),
        inter_kernel_us=float(rng.uniform(5, 25)),
        seed=int(rng.integers(0, 1000)),
    )
    return profile, slack, granularity, trace


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**31 - 1))
# stop 26, found by this generator (seeds 0-49 at that stop's start): +12.2% TPOT at a
# 10% budget (simple_ondemand polling faster than a graph: the bound spread each
# graph's busy time evenly, ``default_bound.graph_pieces``) and +16.7% TTFT at 10% (a
# prompt left at its request-begin level by the last request's prompt debt)
@example(seed=28)
@example(seed=29)
# and then, seeds 0-300 (TPOT at the budget shown): the last graph's plan error against
# the next request's prompt held the tube near 0.93 (237: +6.0% at 5%); a refit whose
# absolute fit walked compute to the floor (249: +5.4% at 5%); a stall drop whose raise
# queued behind it for the device's dwell (98: +5.9% at 5%); the bound's top-level time
# over the probes' (130: +2.24% at 2%); a 1.5 ms raise at a request's begin from the
# idle level at slack 0 (198: +0.37% TTFT at 0%); 230: +2.26% at 2%; after the shape
# refit, a probe's roofline sides kept from when it ran (40: +6.0% at 5%)
@example(seed=40)
@example(seed=98)
@example(seed=130)
@example(seed=198)
@example(seed=230)
@example(seed=237)
@example(seed=249)
# stop 27: prompt plans made ahead per length, a 10-token prompt took the 16-token plan
# with its timed switches scaled by the tokens, early (139: +2.33% TTFT at 2%, graph)
@example(seed=139)
# stop 32, seeds 0-599: plans made with a gain under 1 (their graphs had slowed less
# than planned), the next two 2.7x their planned slowdown (523: +5.22% at 5%, graph)
@example(seed=523)
def test_tmpc_keeps_the_budget_on_generated_gpus(seed):
    profile, slack, granularity, trace = generated_gpu(seed)
    tpot, ttft = _changes(profile, trace, slack, granularity)
    assert tpot <= slack + TOLERANCE, (tpot, slack)
    assert ttft <= slack + TOLERANCE, (ttft, slack)


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**31 - 1), switch_ms=st.floats(10.0, 100.0))
# stop 32 (seeds 0-149 of ``generated_gpu`` at a 10-100 ms switch): a simple_ondemand
# GPU at 87 ms, +3.4% TPOT at 2%: the prompt followed the default's envelope, whose
# raise landed in the decode after a short prompt
@example(seed=130, switch_ms=87.236384)
def test_tmpc_keeps_the_budget_on_generated_gpus_with_a_slow_switch(seed, switch_ms):
    """The same generated GPUs with a switch slower than a decode step (a request
    through Android's thermal framework): tmpc's slow-actuation mode
    (``TubeMPC._slow_plan``) keeps the budget there too."""
    profile, slack, granularity, trace = generated_gpu(seed)
    switch_ns = round(switch_ms * 1e6)
    profile = dataclasses.replace(
        profile,
        switch_latency_direct_ns=switch_ns,
        min_dwell_ns=min(profile.min_dwell_ns, switch_ns),
    )
    tpot, ttft = _changes(profile, trace, slack, granularity)
    assert tpot <= slack + TOLERANCE, (tpot, slack)
    assert ttft <= slack + TOLERANCE, (ttft, slack)


@pytest.mark.parametrize(
    ("seed", "tokens", "prompt", "load_first"), [(0, 160, 400, True), (3, 200, 900, False)]
)
def test_a_load_that_goes_away_does_not_leave_the_default_bound_slow(
    seed, tokens, prompt, load_first
):
    """simple_ondemand (sim generic): the default's bound takes a decode graph's time at
    each level as no less than the request's earlier graphs' (``_anchor_ns``: a longer
    context is never faster). Another app's DRAM load that goes away mid-request breaks
    that: graphs got faster, the anchor held the reference at the loaded times, and the
    plans spent the difference -- +14.5% and +5.2% TPOT here against a 2% budget before
    the anchor restarted where a graph beat it (+3.8% in the sweep's changing load on
    a gemma recording)."""
    trace = make_trace(
        requests=1, decode_tokens=tokens, prompt_tokens=prompt, seed=seed, model="gemma-3-270m"
    )

    def schedule(d: int) -> list[tuple[int, float]]:
        return [(0, 0.4), (d // 2, 0.0)] if load_first else [(d // 3, 0.4), (2 * d // 3, 0.0)]

    base, got = _default_and_tmpc_under_load(load_profile("generic"), trace, schedule)
    assert got.tpot_ms <= base.tpot_ms * (1.02 + TOLERANCE)
    assert got.ttft_ms <= base.ttft_ms * (1.02 + TOLERANCE)


@pytest.mark.parametrize("profile", ["adreno640", "adreno650"])
def test_a_switch_slower_than_a_requests_lead_keeps_the_clock_up_between_requests(profile):
    """With an 80 ms switch (requests through Android's thermal framework, the
    sweep's slow point) the raise at a request's begin lands after its prompt has
    begun: idling at the bottom ran the prompt's first ~77 ms at the bottom level,
    +4.9% (adreno640) and +2.4% (adreno650) TTFT against a 2% budget here. Between
    requests tmpc now idles at the lowest level whose late raise costs the next
    prompt at most a quarter of its TTFT slack (``TubeMPC._idle_level``); with a fast
    switch that is still the bottom."""
    import dataclasses

    prof = dataclasses.replace(load_profile(profile), switch_latency_direct_ns=80_000_000)
    trace = make_trace(
        requests=3, decode_tokens=24, prompt_tokens=[16, 968, 24], sample_ms=1.5, idle_ms=50,
        seed=2, model="gemma-3-270m",
    )  # fmt: skip
    dev = SimGpu(prof)
    base = replay(trace, make_controller("default", **for_device(dev)), dev)
    dev = SimGpu(prof)
    ctl = make_controller("tmpc", latency_slack=0.02, **for_device(dev))
    got = replay(trace, ctl, dev)
    assert got.ttft_ms <= base.ttft_ms * (1.02 + TOLERANCE)
    assert got.tpot_ms <= base.tpot_ms * (1.02 + TOLERANCE)
    assert ctl._idle_level() == ctl.top
    # a raise that lands before the prompt's first kernel costs it nothing: the bottom
    ctl._leads.clear()
    ctl._leads.append(ctl.switch_latency_ns)
    assert ctl._idle_level() == 0


@pytest.mark.parametrize("profile", ["adreno650", "adreno640", "generic"])
def test_a_switch_slower_than_a_decode_step_runs_the_decode_at_one_level_raised_before_the_end(
    profile,
):
    """At an 80 ms switch a level lands four decode steps after it is set: no plan can
    place one inside a graph or a stall. The decode runs at one level, chosen online
    against the budget (``TubeMPC._slow_plan``), and is raised ahead of the request's
    forecast end (the least decode length of the last requests) so that the next
    prompt, back to back with it, starts at the top. Before, the per-graph plans
    issued there landed graphs late, the decode ran mostly near the top, and a drop
    issued before a request's end landed in the next prompt (sweep, sim adreno640 at
    80 ms: +2.3% TTFT against a 2% budget)."""
    import dataclasses

    from turboinfer_llama.control.tmpc import TubeMPC

    prof = dataclasses.replace(load_profile(profile), switch_latency_direct_ns=80_000_000)
    trace = make_trace(
        requests=4, decode_tokens=32, prompt_tokens=[16, 600, 24, 20], sample_ms=1.5,
        idle_ms=2, seed=3, model="gemma-3-270m",
    )  # fmt: skip
    dev = SimGpu(prof)
    base = replay(trace, make_controller("default", **for_device(dev)), dev)
    dev = SimGpu(prof)
    ctl = make_controller("tmpc", latency_slack=0.02, **for_device(dev))
    assert isinstance(ctl, TubeMPC)
    got = replay(trace, ctl, dev)
    assert got.ttft_ms <= base.ttft_ms * (1.02 + TOLERANCE)
    assert got.tpot_ms <= base.tpot_ms * (1.02 + TOLERANCE)
    # every request ran as long: the forecast is that length
    assert len(ctl._req_lengths) == 3 and len(set(ctl._req_lengths)) == 1
    # the decode of a later request ran below the top, at one level
    first_prompt: dict[int, int] = {}
    for s in trace:
        if s.kind == "kernel" and s.phase == "prefill":
            first_prompt.setdefault(s.request, s.graph)
    later = sorted(first_prompt.items())[1:]
    t_begin = [got.graph_begin_ns[g] for _, g in later]
    decode_levels = [a.level for a in got.applied if t_begin[0] < a.t_ns]
    assert min(decode_levels) < ctl.top
    # each later prompt starts at the top (on sim generic, at the default's bound
    # level, where the prompt's envelope starts): the raise landed before its begin
    for t in t_begin[1:]:
        if profile != "generic":
            assert ctl.level_at(t) == ctl.top
