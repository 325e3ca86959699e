"""The oracle (issue 13, item 2): its DP's schedule keeps the TTFT and TPOT budget as
the accounting measures it, spends no more than static-best, phase or tmpc at the
same budget, and reports its Lagrangian dual bound. All figures simulated."""

import itertools
import math

import numpy as np
import pytest

from turboinfer_llama.accounting import PhoneTrace, default_shadow, phone_segments
from turboinfer_llama.bench.runner import BenchConfig, build_report, replay_all
from turboinfer_llama.control.baselines.oracle import (
    Oracle,
    dwell_segments,
    latency_windows,
    viterbi,
)
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimGpu, load_profile

PROFILES = ["adreno650", "adreno640", "mali-g76", "generic"]


def _traces():
    return {
        # kernel granularity, short stalls
        "kernel": make_trace(seed=1, requests=2, prompt_tokens=16, decode_tokens=8),
        # graph granularity, long sampling stalls shifting to short ones
        "graph": make_trace(
            seed=2,
            requests=2,
            prompt_tokens=16,
            decode_tokens=10,
            kernel_timing=False,
            sample_ms=6.0,
            sample_ms_after_shift=1.5,
        ),
    }


TRACES = _traces()


def _bench(segments, profile: str, slack: float, names: list[str]) -> dict:
    cfg = BenchConfig(
        device=f"sim:{profile}",
        controllers=["default", *names],
        latency_slack=slack,
        timing=False,
        live_rounds=0,
    )
    p = load_profile(profile)
    res: dict = {}
    bound: dict = {}
    replay_all(cfg, phone_segments(segments, p), res, {}, None, None, bound)
    rep = build_report(cfg, "m", res, None)
    rep["oracle_bound"] = bound
    return rep


@pytest.mark.parametrize("trace_name", list(TRACES))
@pytest.mark.parametrize("profile", PROFILES)
def test_oracle_keeps_the_budget_and_dominates_the_baselines(profile, trace_name):
    slack = 0.02
    rep = _bench(TRACES[trace_name], profile, slack, ["static-best", "phase", "tmpc", "oracle"])
    c = rep["controllers"]
    o = c["oracle"]
    # the budget, as the accounting measures every controller
    assert o["latency_change_vs_default"] <= slack + 1e-6, o
    assert o["ttft_change_vs_default"] <= slack + 1e-6, o
    for name in ("static-best", "phase", "tmpc"):
        other = c[name]
        in_budget = (
            other["latency_change_vs_default"] <= slack + 1e-6
            and other["ttft_change_vs_default"] <= slack + 1e-6
        )
        if in_budget:  # a controller over budget bought its saving with latency
            assert o["energy_saving_vs_default"] >= other["energy_saving_vs_default"], name
    b = rep["oracle_bound"]
    assert b["dual_bound_j"] <= b["model_energy_j"] * (1 + 1e-12)
    assert 0.0 <= b["gap"] < 0.01


@pytest.mark.parametrize("trace_name", list(TRACES))
@pytest.mark.parametrize("profile", PROFILES)
def test_the_bench_holds_oracle_request_to_each_requests_ttft_and_reports_tmpc_against_it(
    profile, trace_name
):
    """``oracle-request``: the oracle under the promise tmpc keeps (each request's
    TTFT within the slack, the run's TPOT too). In the bench it keeps that promise,
    saves at most the pooled oracle's saving (the same problem with more
    constraints), dominates tmpc wherever tmpc kept the same promise, and every row
    gives its share of that saving (``oracle_request_fraction``)."""
    slack = 0.02
    rep = _bench(TRACES[trace_name], profile, slack, ["tmpc", "oracle", "oracle-request"])
    c = rep["controllers"]
    o, own, t = c["oracle"], c["oracle-request"], c["tmpc"]
    assert own["latency_change_vs_default"] <= slack + 1e-6
    assert all(q["ttft_change_vs_default"] <= slack + 1e-6 for q in own["per_request"]), own
    assert own["energy_saving_vs_default"] <= o["energy_saving_vs_default"] + 1e-3
    assert own["oracle_request_fraction"] == pytest.approx(1.0)
    assert own["energy_saving_vs_default"] > 0
    assert t["oracle_request_fraction"] == pytest.approx(
        t["energy_saving_vs_default"] / own["energy_saving_vs_default"]
    )
    kept = t["latency_change_vs_default"] <= slack + 1e-6 and all(
        q["ttft_change_vs_default"] <= slack + 1e-6 for q in t["per_request"]
    )
    if kept:
        assert own["energy_saving_vs_default"] >= t["energy_saving_vs_default"]
    # the pooled oracle's bound, not the other's, is the report's
    assert rep["oracle_bound"]["gap"] < 0.01


def test_oracle_model_agrees_with_the_accounting(raw_gemma):
    """The cause of the old miss: a block model whose level changed every few hundred
    microseconds, against a 0.5-1 ms minimum dwell, so the accounted run's switches
    landed late (+8% TPOT on a recording). Planned over dwell-long segments, the
    model's time per latency window is the accounting's within 0.3%, and no two
    planned switches land closer than the dwell."""
    for profile in ("adreno650", "mali-g76"):
        p = load_profile(profile)
        phone = phone_segments(raw_gemma, p)
        o = Oracle(phone, lambda p=p: SimGpu(p), latency_slack=0.02, refine=0)
        acc = o.account()
        got = o._measure(acc)
        model = o._group_t(o.segment_levels)
        for gi, g in enumerate(o.groups):
            assert model[gi] == pytest.approx(got[g], rel=3e-3), (profile, g)
        assert acc.energy_j == pytest.approx(o.energy_j, rel=3e-3)
        # one landing per planned level change, each a segment (>= the dwell) apart
        starts = o._block_start[o.seg_start]
        changes = np.flatnonzero(np.diff(o.segment_levels)) + 1
        assert np.all(np.diff(starts[changes]) >= p.min_dwell_ns)


@pytest.fixture(scope="module")
def raw_gemma(gemma_10tok_segments):
    return list(gemma_10tok_segments)


def test_windows_follow_the_accounting():
    """TTFT's window runs from a request's first step to its first token, TPOT's from
    there to its last; the budgets are the default run's TTFT and TPOT times their
    counts, so a schedule within them is within the slack as bench reports it."""
    p = load_profile("generic")
    phone = phone_segments(TRACES["kernel"], p)
    trace = PhoneTrace.shared(phone, p)
    win, n_req, n_gaps = latency_windows(trace)
    assert n_req == 2 and n_gaps == trace.tokens - n_req > 0
    assert win[0] == "ttft" and win.count("tpot") > win.count("ttft") > 0
    assert None in win  # the idle stall between the requests is in neither
    ref = default_shadow(trace, SimGpu(p))
    o = Oracle(phone, lambda: SimGpu(p), latency_slack=0.0, refine=0)
    assert o.budgets_ns["ttft"] == pytest.approx(ref.ttft_ms * 1e6 * n_req)
    assert o.budgets_ns["tpot"] == pytest.approx(ref.tpot_ms * 1e6 * n_gaps)


@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_per_request_ttft_holds_every_request_and_costs_the_pooled_oracle_little(profile):
    """Held to each request's own TTFT (the promise tmpc keeps) instead of the run's
    pooled TTFT, the oracle keeps every request's TTFT within the slack, the run's
    TPOT too, and saves at most what the pooled oracle saves: its problem is the
    pooled one with more constraints."""
    slack = 0.02
    p = load_profile(profile)
    phone = phone_segments(TRACES["kernel"], p)
    ref = default_shadow(PhoneTrace.shared(phone, p), SimGpu(p))
    pooled = Oracle(phone, lambda: SimGpu(p), latency_slack=slack)
    own = Oracle(phone, lambda: SimGpu(p), latency_slack=slack, per_request_ttft=True)
    assert own.groups == ["ttft#0", "ttft#1", "tpot"]
    acc = own.account()
    assert len(acc.requests_latency) == len(ref.requests_latency) == 2
    for q, r in zip(acc.requests_latency, ref.requests_latency, strict=True):
        assert q.ttft_ns <= (1 + slack) * r.ttft_ns * (1 + 1e-9), (q, r)
    assert acc.tpot_ms <= (1 + slack) * ref.tpot_ms * (1 + 1e-9)
    assert own.energy_j >= pooled.energy_j * (1 - 1e-3)
    # the pooled oracle moves TTFT between requests here (+19% and +12% on one of them)
    assert any(
        q.ttft_ns > (1 + slack) * r.ttft_ns
        for q, r in zip(pooled.account().requests_latency, ref.requests_latency, strict=True)
    )
    # it is a schedule below the top level: the windows left it room to save
    assert acc.energy_j < default_shadow(PhoneTrace.shared(phone, p), SimGpu(p)).energy_j


def test_segments_are_dwell_long_and_keep_stalls_whole():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        step = np.sort(rng.integers(0, 12, n))
        stall_steps = set(rng.choice(12, 4, replace=False).tolist())
        # a stall step is one block
        keep = np.ones(n, bool)
        for i in range(1, n):
            if step[i] == step[i - 1] and step[i] in stall_steps:
                keep[i] = False
        step = step[keep]
        n = len(step)
        t = rng.uniform(1e3, 4e5, n)
        is_stall = np.array([s in stall_steps for s in step.tolist()])
        d = 5e5
        seg = dwell_segments(t, step, is_stall, d)
        assert seg[0] == 0 and np.all(np.diff(seg) > 0)
        dur = np.add.reduceat(t, seg)
        if t.sum() >= d:
            assert np.all(dur >= d)
        else:
            assert len(seg) == 1
    assert dwell_segments(np.ones(5), np.arange(5), np.zeros(5, bool), 0.0).tolist() == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_viterbi_is_the_cheapest_path():
    rng = np.random.default_rng(1)
    for _ in range(30):
        n, L = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        cost = rng.uniform(0, 1, (n, L))
        sw = float(rng.uniform(0, 0.5))

        def total(path, cost=cost, sw=sw):
            return sum(cost[i, q] for i, q in enumerate(path)) + sw * sum(
                a != b for a, b in itertools.pairwise(path)
            )

        brute = min(total(p) for p in itertools.product(range(L), repeat=n))
        assert total(viterbi(cost, sw).tolist()) == pytest.approx(brute)


def test_dual_bound_brackets_the_true_optimum():
    """On small random instances of the segment model: dual bound <= the best schedule
    within the targets (by enumeration) <= the schedule the DP and the fill find, and
    that schedule keeps the targets."""
    rng = np.random.default_rng(2)
    for _ in range(20):
        n, L = 6, 3
        o = Oracle.__new__(Oracle)
        t = np.sort(rng.uniform(1.0, 3.0, (n, L)), axis=1)[:, ::-1]  # faster at higher
        e = np.sort(rng.uniform(1.0, 3.0, (n, L)), axis=1)  # dearer at higher
        grp = rng.integers(0, 2, n)
        o._seg_e = e
        o._seg_t = np.stack([t * (grp == g)[:, None] for g in (0, 1)])
        o.switch_j = float(rng.uniform(0, 0.2))
        o.groups = ["ttft", "tpot"]
        fast = o._seg_t[:, np.arange(n), L - 1].sum(axis=1)
        slow = o._seg_t[:, np.arange(n), 0].sum(axis=1)
        tgt = fast + rng.uniform(0.2, 0.9) * (slow - fast)
        targets = {"ttft": float(tgt[0]), "tpot": float(tgt[1])}
        seg, bound = o._solve(targets)

        def energy(path, e=e, n=n, sw=o.switch_j):
            return float(e[np.arange(n), path].sum()) + sw * float(np.count_nonzero(np.diff(path)))

        assert np.all(o._group_t(seg) <= tgt + 1e-9)
        best = math.inf
        for path in itertools.product(range(L), repeat=n):
            path = np.array(path)
            if np.all(o._group_t(path) <= tgt + 1e-9):
                best = min(best, energy(path))
        assert bound.dual_j <= best + 1e-9
        assert best <= energy(seg) + 1e-9
        assert bound.model_energy_j == pytest.approx(energy(seg))


@pytest.mark.parametrize("profile", ["adreno640", "mali-g76"])
def test_at_a_switch_slower_than_a_step_the_oracle_keeps_the_budget_and_beats_the_phase_split(
    raw_gemma, profile
):
    """At an 80 ms switch each switch is issued 80 ms ahead of its segment, timed on the
    steps before it: segments a dwell long (0.5-1 ms) switched inside every stall, and
    the drift of those steps from the model put the accounted TPOT 5% over the
    modelled one at every refinement (the sweep: the oracle fell back to the top
    level on sim adreno640, -2.9% against the phase split's +7.1%, and on mali-g76,
    -18.5%). Segments at least one switch latency long keep the model within 0.5%
    of the accounting; the oracle keeps the budget and beats the phase split."""
    import dataclasses

    from turboinfer_llama.control.baselines.hindsight import PhaseSplit

    p = dataclasses.replace(load_profile(profile), switch_latency_direct_ns=80_000_000)
    phone = phone_segments(raw_gemma, p)
    o = Oracle(phone, lambda: SimGpu(p), latency_slack=0.02)
    acc = o.account()
    assert o.min_segment_ns >= 80_000_000
    ref = default_shadow(PhoneTrace.shared(phone, p), SimGpu(p))
    assert acc.tpot_ms <= 1.02 * ref.tpot_ms and acc.ttft_ms <= 1.02 * ref.ttft_ms
    ph = PhaseSplit(phone, lambda: SimGpu(p), latency_slack=0.02).account()
    assert acc.energy_j < ph.energy_j
    got = o._measure(acc)
    model = o._group_t(o.segment_levels)
    for gi, g in enumerate(o.groups):
        assert model[gi] == pytest.approx(got[g], rel=5e-3), g


def test_a_refinement_that_makes_no_progress_steps_every_target_down():
    """Another app's DRAM load that comes and goes lands where the schedule puts it,
    so a faster prompt moves the decode under the load: the sweep's first Latin-
    hypercube point alternated TTFT and TPOT 0.01-0.1% over budget through every
    refinement, and the oracle fell back to the top level (sim adreno650: -0.7%
    against the phase split's +40.6%). With no progress every target now steps down
    (``STALL_STEP``, doubled each time) until a schedule keeps both. Here (that
    point's parameters on adreno640, a synthetic trace) the old refinement fell back
    too: -0.4%."""
    import dataclasses

    trace = make_trace(
        seed=4, requests=3, prompt_tokens=[16, 400, 24], decode_tokens=24, sample_ms=1.5
    )
    base = load_profile("adreno640")
    p = dataclasses.replace(
        base, switch_latency_direct_ns=190_000, bus_coupling=0.0,
        host_cpu_factor=base.host_cpu_factor * 1.94,
    )  # fmt: skip
    phone = phone_segments(trace, p)
    quiet = default_shadow(
        PhoneTrace.build(phone, p, host_model=False), SimGpu(p, background_share=0.27)
    )
    d = quiet.duration_ns
    sched = [(d // 3, 0.67), (2 * d // 3, 0.27)]

    def factory():
        return SimGpu(p, background_share=0.27, background_schedule=sched)

    o = Oracle(phone, factory, latency_slack=0.02)
    acc = o.account()
    ref = default_shadow(PhoneTrace.shared(phone, p), factory())
    assert o.bound is not None  # a schedule within budget was found, not the fallback
    assert acc.tpot_ms <= 1.02 * ref.tpot_ms and acc.ttft_ms <= 1.02 * ref.ttft_ms
    assert acc.energy_j < 0.7 * ref.energy_j


def test_per_request_ttft_needs_per_request_budgets_when_budgets_are_given():
    p = load_profile("generic")
    phone = phone_segments(TRACES["kernel"], p)
    with pytest.raises(ValueError, match="ttft#k"):
        Oracle(
            phone,
            lambda: SimGpu(p),
            budgets_ns={"ttft": 1e9, "tpot": 1e9},
            per_request_ttft=True,
            refine=0,
        )
