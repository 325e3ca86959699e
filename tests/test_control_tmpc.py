"""TMPC: stays within its latency budget on traces with bounded forecast errors."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turboinfer_llama.accounting import phone_segments
from turboinfer_llama.control import tmpc as tmpc_mod
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.control.tmpc import TubeMPC
from turboinfer_llama.control.tmpc_solver import _edges, _gap_edges, dwell_merge
from turboinfer_llama.control.tmpc_solver import level_combinations as _combos
from turboinfer_llama.devices.sim import SimGpu, load_profile

SLACK = 0.02
# Small margin for the top-level reference's context-growth scaling between probes
# (measured under 0.5 point at kernel granularity on these traces).
TOLERANCE = 0.005
PROFILE = load_profile("adreno650")  # with its GPU-DDR coupling


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sample_ms=st.floats(1.5, 6.0),
    sigma=st.floats(0.0, 0.25),  # bounded stall-forecast error
    inter_kernel_us=st.floats(8.0, 30.0),
    seed=st.integers(0, 1000),
)
def test_tmpc_stays_within_its_latency_budget(sample_ms, sigma, inter_kernel_us, seed):
    trace = make_trace(
        requests=1,
        decode_tokens=10,
        prompt_tokens=8,
        sample_ms=sample_ms,
        sample_sigma=sigma,
        inter_kernel_us=inter_kernel_us,
        seed=seed,
    )
    dev = SimGpu(PROFILE)
    base = replay(trace, make_controller("default", **for_device(dev)), dev)
    dev = SimGpu(PROFILE)
    ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
    got = replay(trace, ctl, dev)
    limit = 1.0 + SLACK + TOLERANCE
    for phase in ("prefill", "decode"):
        assert got.time_by_phase_ns[phase] <= limit * base.time_by_phase_ns[phase], phase


def test_solver_respects_the_budget_and_prefers_cheap_levels():
    levels = [305_000_000, 490_000_000, 670_000_000]
    ctl = TubeMPC(levels, horizon=5)
    combos, changes = _combos(3, 3)
    assert combos.shape == (27, 3) and changes.max() == 2
    # outer sums enumerate rows in the same order as ``combos``
    e = np.arange(9.0).reshape(3, 3)
    flat = e[0]
    for i in (1, 2):
        flat = (flat[..., None] + e[i]).ravel()
    np.testing.assert_allclose(flat, e[np.arange(3), combos].sum(axis=1))
    assert ctl.n_compute == 3


def test_horizon_must_be_three_to_six_segments():

    with pytest.raises(ValueError, match=r"3\.\.6"):
        TubeMPC([1, 2], horizon=8)


def test_dwell_merge_leaves_no_run_shorter_than_a_switch_latency_and_never_slows():
    rng = np.random.default_rng(3)
    for _ in range(200):
        nb, n_lv = int(rng.integers(1, 30)), int(rng.integers(2, 8))
        # faster at higher levels, as a device's table
        block_ns = np.sort(rng.uniform(0.05e6, 1.5e6, (nb, n_lv)), axis=1)[:, ::-1].copy()
        levels = rng.integers(0, n_lv, nb)
        min_ns = float(rng.uniform(0.1e6, 1.0e6))
        got = dwell_merge(levels, block_ns, min_ns)
        assert (got >= levels).all()  # only ever a higher level: never slower
        # every run but a whole graph of one level lasts at least min_ns
        starts = [0] + [i for i in range(1, nb) if got[i] != got[i - 1]]
        ends = [*starts[1:], nb]
        if len(starts) > 1:
            for a, b in zip(starts, ends, strict=True):
                assert block_ns[np.arange(a, b), got[a:b]].sum() >= min_ns
    # a short dip between two long runs joins the higher neighbour
    block_ns = np.array([[2e6, 1e6], [0.2e6, 0.1e6], [2e6, 1e6]])
    assert list(dwell_merge(np.array([1, 0, 1]), block_ns, 0.5e6)) == [1, 1, 1]
    assert list(dwell_merge(np.array([1, 0, 1]), block_ns, 0.1e6)) == [1, 0, 1]


def test_gap_edges_give_each_large_host_gap_a_block_of_its_own():
    n = 500
    host = np.zeros(n)
    host[[100, 201, 350]] = 800e3  # batch recording gaps
    host[7] = 1e3  # a small one: no block of its own
    edges = _gap_edges(n, host)
    assert edges[0] == 0 and edges[-1] == n and (np.diff(edges) > 0).all()
    for g in (100, 201, 350):
        assert g in edges and g + 1 in edges
    assert 7 not in edges and 8 not in edges
    assert list(_gap_edges(n, np.zeros(n))) == list(_edges(n))
    # no block for a gap shorter than a switch latency (a level cannot land in it):
    # at a 5.4 ms switch the sweep's Latin-hypercube point on sim adreno650 saved
    # 16.5% with blocks for its ~1 ms gaps, 17.9% without (simulated)
    assert list(_gap_edges(n, host, 1e6)) == list(_edges(n))
    assert 100 in _gap_edges(n, host, 0.5e6)


def test_tmpc_places_host_time_at_the_measured_gaps():
    # kernel granularity with batch-recording gaps (Vulkan-like, ~100 nodes a batch)
    trace = phone_segments(
        make_trace(requests=1, decode_tokens=6, prompt_tokens=8, model="gemma-3-270m"), PROFILE
    )
    dev = SimGpu(PROFILE)
    ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
    replay(trace, ctl, dev, granularity="kernel")
    tpl = ctl._templates["decode"]
    # where the simulated phone host records a batch, the template puts its host time
    gaps = PROFILE.host_gaps_ns(int(tpl.launch.sum()))
    assert gaps.sum() > 0
    big = np.nonzero(tpl.host_ns > 0.5 * gaps.max())[0]
    assert len(big) >= 2
    assert tpl.host_ns[big].sum() > 0.8 * tpl.host_ns.sum()


def test_a_plan_two_ahead_of_a_prompt_times_its_stall_raise_by_the_decode_stall():
    """Planning two graphs ahead (the default), the plan solved at a prompt's end is
    for the second decode graph: the stall before it follows the first decode graph,
    a decode stall, not the (longer) stall after the prompt. Timed by the latter, its
    raise fired inside the graph it was for (on the simulated adreno650, 96-token
    gemma recording at 2%: 16.2% saved, now 17.4%)."""
    sample_ms, after_ms = 3.0, 25.0
    trace = make_trace(
        requests=3,
        decode_tokens=8,
        prompt_tokens=8,
        sample_ms=sample_ms,
        sample_sigma=0.05,
        after_prefill_ms=after_ms,
        seed=3,
    )
    dev = SimGpu(PROFILE)
    ctl = make_controller("tmpc", latency_slack=0.05, **for_device(dev))
    assert isinstance(ctl, TubeMPC)
    seen = []
    on_graph = ctl.on_graph

    def spy(b):
        plan = on_graph(b)
        if b.phase == "prefill" and b.ahead == 2 and plan is not None:
            raise_ns = [sw.key - b.t_end_ns for sw in plan.switches if sw.anchor.name == "TIME"]
            seen.append(max(raise_ns))
        return plan

    ctl.on_graph = spy  # type: ignore[method-assign]
    replay(trace, ctl, dev)
    # the prompts after the first have an after-prompt stall forecast to go wrong by
    assert len(seen) >= 2
    for dt_ns in seen[1:]:
        assert dt_ns < 2 * sample_ms * 1e6 < after_ms * 1e6


def _host_spikes(trace, every: int, factor: float):
    """``trace`` as a loaded recording host would record it: every ``every``-th decode
    graph's kernels took ``factor`` times as long (the segments re-laid end to end)."""
    from dataclasses import replace

    out, t = [], trace[0].t_ns
    for s in trace:
        slow = s.kind == "kernel" and s.phase == "decode" and s.graph % every == 0
        dur = int(s.dur_ns * factor) if slow else s.dur_ns
        out.append(replace(s, t_ns=t, dur_ns=dur))
        t += dur
    return out


def test_a_clock_decoupled_budget_holds_when_the_hosts_graph_times_spike():
    """The simulated device, live (``clock_coupled=False``): the host's times say
    nothing of the device's clock, and on a loaded host they spike. The measured
    top-level reference followed a slowed probe far above what the plans predicted, so
    every plan looked faster than its reference, its debt went negative, and later
    graphs ran at the bottom level (+5-17% simulated TPOT per request at 2%, live, on a
    2-core host at load 3-4). The debt is now kept against the plans' own reference.
    Here the recording's probes and other graphs spike 3x; the switches the controller
    issued, placed on the phone's timeline as the live accounting places them, keep
    the simulated TPOT within the budget of the default governor's."""
    from turboinfer_llama.accounting import PhoneTrace, applied_energy, default_shadow

    trace = _host_spikes(
        make_trace(requests=2, decode_tokens=60, prompt_tokens=16, sample_ms=3.0, seed=5),
        every=4,
        factor=3.0,
    )
    dev = SimGpu(PROFILE, start_ns=trace[0].t_ns)
    ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev), clock_coupled=False)
    got = replay(trace, ctl, dev, timing="recorded", granularity="graph", counters=False)
    levels_hz = dev.frequencies_hz()
    assert len({a.level for a in got.applied}) >= 2  # it switched
    phone = PhoneTrace.build(trace, PROFILE)
    placed = phone.place([a.t_ns for a in got.applied], [levels_hz[a.level] for a in got.applied])
    ours = applied_energy(phone, SimGpu(PROFILE), placed)
    base = default_shadow(phone, SimGpu(PROFILE))
    assert ours.tpot_ms <= (1.0 + SLACK + 0.002) * base.tpot_ms, (ours.tpot_ms, base.tpot_ms)
    assert ours.ttft_ms <= (1.0 + SLACK + 0.002) * base.ttft_ms, (ours.ttft_ms, base.ttft_ms)


def test_the_template_meets_a_top_level_graph_where_the_model_is_far_off():
    # a GPU computing 2.7x slower than the model's prior, with host gaps in its graphs
    # (counters tell busy from host time): after a graph at the top level the template's
    # top-level time is that graph's measured time. The time scale is the kernels' ratio
    # alone; a ratio taken over kernel and host time together, applied to the kernels,
    # put it 16 ms under a measured 54.8 ms graph on a generated Mali, and the plans spent
    # the gap (+3.7% TPOT at a 2% budget)
    import dataclasses

    base = load_profile("mali-g76")
    prof = dataclasses.replace(
        base, compute_efficiency=base.compute_efficiency * 0.37, default_governor="msm-adreno-tz"
    )
    trace = make_trace(requests=1, decode_tokens=4, prompt_tokens=12, inter_kernel_us=15.0)
    dev = SimGpu(prof)
    # slack 0: every graph at the top level
    ctl = make_controller("tmpc", latency_slack=0.0, **for_device(dev))
    seen: list[tuple[float, float, float]] = []
    on_graph = ctl.on_graph

    def spy(b):
        plan = on_graph(b)
        if b.phase == "decode":
            tpl = ctl._templates["decode"]
            seen.append((float(b.compute_ns), float(tpl.graph_ns[-1]), float(tpl.host_ns.sum())))
        return plan

    ctl.on_graph = spy
    replay(trace, ctl, dev, granularity="graph")
    assert len(seen) >= 3
    measured, top_ns, host_ns = seen[0]
    assert host_ns > 0.05 * measured  # host time the counters told apart
    assert top_ns == pytest.approx(measured, rel=0.01)


def test_a_plan_made_for_what_became_a_prompt_does_not_widen_the_tube():
    # planning two graphs ahead, the plan made after a request's second-last decode
    # graph is for the graph after its last: the next request's prompt, a graph of as
    # many nodes. Its error against the prompt's time (~0.93) is no plan error: counted,
    # it held the tube near 0.93 for the next 64 decode graphs of every request
    trace = make_trace(requests=3, decode_tokens=8, prompt_tokens=96)
    dev = SimGpu(PROFILE)
    ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
    tube: list[tuple[str, float]] = []
    on_graph = ctl.on_graph

    def spy(b):
        plan = on_graph(b)
        tube.append((b.phase, ctl.rel_err.estimate().upper_ns))
        return plan

    ctl.on_graph = spy
    replay(trace, ctl, dev, granularity="graph")
    assert sum(1 for ph, _ in tube if ph == "prefill") == 3
    assert max(r for _, r in tube) < 0.2


def _levels_in(res, graph):
    """The levels in effect from a graph's DECODE_BEGIN to the next graph's."""
    import bisect

    ts = [a.t_ns for a in res.applied]
    t0 = res.graph_begin_ns[graph]
    t1 = res.graph_begin_ns.get(graph + 1, t0 + 10**9)
    j = bisect.bisect_right(ts, t0) - 1
    out = {res.applied[j].level} if j >= 0 else set()
    out |= {a.level for a in res.applied if t0 <= a.t_ns < t1}
    return out


def _tmpc_on(trace, slack, profile=PROFILE):
    dev = SimGpu(profile)
    base = replay(trace, make_controller("default", **for_device(dev)), dev)
    dev = SimGpu(profile)
    ctl = make_controller("tmpc", latency_slack=slack, **for_device(dev))
    return ctl, base, replay(trace, ctl, dev)


def test_a_requests_first_decode_graph_runs_below_the_top():
    # it has no plan of its own (the planner learns the prompt only once it has begun,
    # plan.HOLD_FOR_ENGINE) and ran at the prompt plan's fallback, the top level: on the
    # gemma recording, 4 graphs and 0.12 J of the 0.29 J decode gap to the oracle
    trace = make_trace(requests=3, prompt_tokens=24, decode_tokens=10, seed=3)
    graphs = sorted({s.graph for s in trace if s.kind == "kernel"})
    firsts = [g for g in graphs if g % 11 == 1 and g > 1]  # 11 graphs per request
    _, base, got = _tmpc_on(trace, 0.05)
    top = len(PROFILE.levels_hz) - 1
    for g in firsts:
        assert max(_levels_in(got, g)) < top, (g, _levels_in(got, g))
    assert got.tpot_ms <= (1.05 + TOLERANCE) * base.tpot_ms
    assert got.ttft_ms <= (1.05 + TOLERANCE) * base.ttft_ms


def test_a_plan_past_a_requests_first_decode_graph_leaves_room_for_its_debt(monkeypatch):
    """The request's first decode graph has no plan (above) and runs at the prompt
    plan's fallback level, below the top: time over the reference, debt. The plan
    solved at the prompt's end is for the graph after it (two ahead) and must count
    that debt; it did not, so it spent the same room twice, and the graph after paid
    it back at the top level (sim adreno650, gemma recording, 2%: the second decode
    graph of each request 5.7% over its reference, the third at the top; saving
    21.1% -> 21.4%). Both runs are the same up to the second request's prompt, so the
    two plans solved there compare exactly."""
    import turboinfer_llama.control.tmpc as tmpc_mod

    top = len(PROFILE.levels_hz) - 1
    plan_next = tmpc_mod.TubeMPC._plan_next
    prompts = [16, 300, 24]  # a long one in the middle: its plan reaches past a graph
    trace = make_trace(requests=3, decode_tokens=24, prompt_tokens=prompts, idle_ms=50, seed=1)
    dev = SimGpu(PROFILE)
    base = replay(trace, make_controller("default", **for_device(dev)), dev, hold=True)

    def run(count_it: bool) -> tuple[list[tuple[int, float]], object]:
        seen: list[tuple[int, float]] = []

        def spy(self, t_now, graph=-1, ahead=1):
            plan = plan_next(self, t_now, graph, ahead)
            got = self._planned.get(graph + ahead)
            if self._prev_phase == "prefill" and ahead == 2 and got is not None:
                seen.append((self._event_fallback_lv, got.committed_ns))
            return plan

        monkeypatch.setattr(tmpc_mod.TubeMPC, "_plan_next", spy)
        if not count_it:  # the fallback level never noted: taken as the top, no debt
            monkeypatch.setattr(tmpc_mod.TubeMPC, "on_event", tmpc_mod.TubeMPC._event_plan)
        dev = SimGpu(PROFILE)
        ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
        res = replay(trace, ctl, dev, hold=True)
        monkeypatch.undo()
        return seen, res

    counted, got = run(True)
    uncounted, _ = run(False)
    assert len(counted) == 2 and len(uncounted) == 2  # the second and third prompts
    (lv, committed), (_, committed_before) = counted[0], uncounted[0]
    assert lv < top  # the first decode graph runs below the top: it has debt
    assert committed < committed_before  # this plan spends less, leaving room for it
    assert got.tpot_ms <= (1 + SLACK + TOLERANCE) * base.tpot_ms
    assert got.ttft_ms <= (1 + SLACK + TOLERANCE) * base.ttft_ms


def test_probes_come_less_often_while_they_agree_with_the_reference():
    from turboinfer_llama.control import tmpc as tmpc_module

    trace = make_trace(requests=1, prompt_tokens=8, decode_tokens=150, seed=4)
    ctl, base, got = _tmpc_on(trace, SLACK)
    # 150 graphs at one probe every PROBE_EVERY (24) would be 7 probes
    assert 2 <= ctl.probes < 150 // tmpc_module.PROBE_EVERY
    assert ctl._probe_every["decode"] > tmpc_module.PROBE_EVERY
    assert got.tpot_ms <= (1.0 + SLACK + TOLERANCE) * base.tpot_ms


def test_a_long_prompt_after_a_short_one_is_planned_at_its_own_length():
    # a 700-token prompt (two micro-batches) planned from the 12-token one before it:
    # the prompt plans are made per length from the one-token and the short prompt's
    # graphs (affine node times), then timed again at the prompt's own length
    trace = make_trace(requests=3, prompt_tokens=[12, 700, 40], decode_tokens=10, seed=3)
    long_prompt = 11  # graph of request 1's prompt
    assert {s.phase for s in trace if s.graph == long_prompt} == {"prefill"}
    ctl, base, got = _tmpc_on(trace, 0.05)
    top = len(PROFILE.levels_hz) - 1
    plan = ctl._prompt_plan_for(700)
    assert plan is not None and plan[0].n == 2 * ctl._templates["decode"].n  # both halves
    below = [a for a in got.applied if a.graph == long_prompt and a.source != "end"]
    assert any(a.level < top for a in below), below
    assert not any(a.source == "feedback" for a in below)  # no raise for a false delay
    assert got.ttft_ms <= (1.05 + TOLERANCE) * base.ttft_ms
    assert got.tpot_ms <= (1.05 + TOLERANCE) * base.tpot_ms


def test_prompt_plans_follow_the_micro_batch_size_prompt_graphs_show():
    # llama.cpp splits a batch into n_ubatch-token micro-batches (512 by default); a
    # 700-token prompt run as three shows 256, and a later prompt's plan has its nodes
    trace = make_trace(
        requests=3, prompt_tokens=[12, 700, 600], decode_tokens=6, seed=5, ubatch_tokens=256
    )
    ctl, base, got = _tmpc_on(trace, 0.05)
    assert ctl._ubatch == 256
    plan = ctl._prompt_plan_for(600)
    assert plan is not None and plan[0].n == 3 * ctl._templates["decode"].n
    assert got.ttft_ms <= (1.05 + TOLERANCE) * base.ttft_ms


def test_micro_batches_and_the_prompt_lengths_planned_ahead():
    from turboinfer_llama.control.tmpc import _prompt_lengths, _ubatch_seen, _ubatches

    assert _ubatches(968) == [512, 456] and _ubatches(512) == [512] and _ubatches(1) == [1]
    assert _ubatches(968, 256) == [256, 256, 256, 200]
    # n_ubatch as a prompt graph shows it: the least power of two that splits it so
    assert _ubatch_seen(968, 2, 512) == 512  # already consistent
    assert _ubatch_seen(968, 4, 512) == 256
    assert _ubatch_seen(700, 1, 512) == 1024  # one micro-batch of 700: at least that
    assert _prompt_lengths(512) == [16, 64, 256, 512, 1024, 1536, 2048]
    assert _prompt_lengths(256) == [16, 64, 256, 512, 768, 1024]


def test_the_slow_actuation_mode_has_hysteresis():
    """A switch close to one decode step would flip tmpc's slow-actuation mode (and
    the prompt envelope and the probes with it) graph by graph as the step's time
    moves: it is entered at ``SLOW_SWITCH_STEPS`` steps and left under
    ``SLOW_SWITCH_LEAVE`` of that."""
    from types import SimpleNamespace

    from turboinfer_llama.control import tmpc as tm

    ctl = tm.TubeMPC([300_000_000, 600_000_000], switch_latency_ns=20_000_000)
    step_ns = 20_000_000 / 0.9  # the switch: 0.9 of a step
    tpl = SimpleNamespace(graph_ns=np.array([2 * step_ns, step_ns]))
    assert not ctl._slow_actuation(tpl, 0.0)  # not entered under one step
    ctl._slow = True
    assert ctl._slow_actuation(tpl, 0.0)  # not left at 0.9 of one
    tpl_fast = SimpleNamespace(graph_ns=np.array([2 * step_ns, 20_000_000 / 0.7]))
    assert not ctl._slow_actuation(tpl_fast, 0.0)  # left under 0.8


def _with_load_from(trace, profile, at_share: float, share: float):
    """The default's run and a device factory where another app's DRAM load of
    ``share`` starts ``at_share`` of the way through the unloaded default's run."""
    dev = SimGpu(profile)
    quiet = replay(trace, make_controller("default", **for_device(dev)), dev)
    schedule = [(int(quiet.duration_s * 1e9 * at_share), share)]

    def factory():
        return SimGpu(profile, background_schedule=schedule)

    dev = factory()
    return replay(trace, make_controller("default", **for_device(dev)), dev), factory


def test_a_load_that_comes_mid_run_is_charged_against_the_slowed_reference(monkeypatch):
    """Graphs run between a DRAM load's arrival and the probe that confirms it were
    charged against the reference of the unloaded GPU; once the probe confirms the
    shift they are charged again against it scaled by the probe's ratio (the
    default's graphs slowed alike), instead of leaving phantom debt that holds the
    top level. ``SHIFT_WINDOW`` 0 turns that off, for comparison."""
    trace = make_trace(requests=2, prompt_tokens=16, decode_tokens=40, seed=11)
    base, factory = _with_load_from(trace, PROFILE, 0.5, 0.6)
    runs = {}
    for window in (tmpc_mod.SHIFT_WINDOW, 0):
        monkeypatch.setattr(tmpc_mod, "SHIFT_WINDOW", window)
        dev = factory()
        ctl = make_controller("tmpc", latency_slack=0.05, **for_device(dev))
        got = replay(trace, ctl, dev)
        assert got.tpot_ms <= (1.05 + TOLERANCE) * base.tpot_ms, window
        assert got.ttft_ms <= (1.05 + TOLERANCE) * base.ttft_ms, window
        runs[window] = (ctl.shift_credits, got.energy_j)
    (on_credits, on_j), (off_credits, off_j) = runs.values()
    assert on_credits >= 1 and off_credits == 0
    assert on_j < 0.98 * off_j, runs  # the phantom debt held the top level


def test_graph_granularity_spans_follow_the_plan_so_the_model_tracks_mixed_level_graphs():
    """At ``graph`` granularity no node completion is seen during compute, so where each
    node ran (and at which clock) is inferred: from the node times the graph's plan
    predicted at its levels. With the cost weights alone (no clock in them) a block run
    at a low level seemed shorter than it was, the time-keyed raise after it seemed to
    land nodes later, and those nodes were taken as run at the low clock: the model then
    missed every mixed-level graph (relative error's upper quantile 0.07 here) and the
    plans swung between low and high levels. Simulated adreno650, 3 x 48 tokens, 2%."""
    trace = make_trace(requests=3, decode_tokens=48, model="gemma-3-270m")
    dev = SimGpu(PROFILE)
    ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
    assert isinstance(ctl, TubeMPC)
    spans = ctl._node_spans
    planned_share_used = []

    def watched(b):
        p = ctl._planned.get(b.graph)
        if b.phase == "decode" and p is not None and p.share is not None:
            _, ends = spans(b)
            expected = b.t_first_ns + (b.t_end_ns - b.t_first_ns) * p.share
            planned_share_used.append(bool(np.allclose(ends, expected)))
        return spans(b)

    ctl._node_spans = watched  # type: ignore[method-assign]
    dev = SimGpu(PROFILE)
    base = replay(trace, make_controller("default", **for_device(dev)), dev, granularity="graph")
    dev = SimGpu(PROFILE)
    got = replay(trace, ctl, dev, granularity="graph")
    # mixed-level graphs were planned and their spans came from their plans
    assert len(planned_share_used) > 100 and all(planned_share_used)
    assert ctl.rel_err.estimate().upper_ns < 0.03
    assert got.tpot_ms <= (1.0 + SLACK + TOLERANCE) * base.tpot_ms
    assert got.energy_j < 0.78 * base.energy_j  # 25.7% saving before, 28.7% after


@pytest.mark.parametrize(("profile", "slack"), [("generic", 0.02), ("adreno640", 0.05)])
def test_an_open_loop_prompt_far_beyond_its_fit_keeps_its_own_ttft_budget(profile, slack):
    """At ``graph`` granularity a prompt runs open-loop: every switch is timed from the
    graph's start by the predicted elapsed time. A 968-token prompt after an 11-token
    one is predicted from a fit 88x shorter and may run well over that time, so its
    switches land early in its work; the plan prices that (``_open_loop_risk``) and
    keeps its low levels early. Before, the request's own TTFT went over budget
    (+2.41% at 2% on generic, +5.16% at 5% on adreno640; simulated)."""
    trace = make_trace(requests=2, prompt_tokens=(11, 968), decode_tokens=24)
    got = {}
    for name in ("default", "tmpc"):
        dev = SimGpu(load_profile(profile), record_intervals=True)
        ctl = make_controller(name, latency_slack=slack, **for_device(dev))
        got[name] = replay(trace, ctl, dev, granularity="graph")
    tmpc, base = got["tmpc"].requests_latency, got["default"].requests_latency
    assert len(tmpc) == len(base) == 2
    for mine, theirs in zip(tmpc, base, strict=True):
        assert mine.ttft_ns <= (1.0 + slack + 0.002) * theirs.ttft_ns
    # the prompts ran partly below the top level (the budget kept by a plan, not by
    # running at the top throughout)
    top_hz = max(dev.profile.levels_hz)
    low_ns = sum(d for _, d, hz, kind, phase, _ in dev.intervals
                 if phase == "prefill" and kind == "busy" and hz < top_hz)  # fmt: skip
    assert low_ns > 0.1 * base[1].ttft_ns


def test_host_time_goes_where_the_backend_submits_at_graph_granularity():
    """At ``graph`` granularity no completion is seen, so a graph's host time (its
    measured time less the device's busy time) is placed where the backend submits,
    where the device says how often: before every 100th launched kernel after the
    first, in proportion to the kernels each batch records, the first batch's in the
    submission stall. No claim, or one kernel per submission: no placement."""
    ctl = TubeMPC([305_000_000, 670_000_000], submit_batch_nodes=100)
    launch = np.zeros(260)
    launch[::1] = 1.0
    launch[[3, 50, 120]] = 0.0  # no-ops: not counted as kernels
    gaps = ctl._batch_gaps(launch, 1_000.0)
    kernels = np.flatnonzero(launch)
    assert np.flatnonzero(gaps).tolist() == [int(kernels[100]), int(kernels[200])]
    assert gaps.sum() == pytest.approx(1_000.0)
    assert gaps[kernels[100]] / gaps[kernels[200]] == pytest.approx(100 / 57)
    assert TubeMPC([305_000_000, 670_000_000])._batch_gaps(launch, 1_000.0) is None
    assert TubeMPC([1, 2], submit_batch_nodes=1)._batch_gaps(launch, 1_000.0) is None
    # the simulator claims its batches only where its phone host model is applied
    assert SimGpu(PROFILE).capabilities.submit_batch_nodes is None
    assert SimGpu(PROFILE, host_model=True).capabilities.submit_batch_nodes == 100
    assert for_device(SimGpu(PROFILE, host_model=True))["submit_batch_nodes"] == 100


def test_told_where_the_backend_submits_tmpc_lowers_the_clock_in_the_recording_gaps():
    """The phone host model's Vulkan-like recording gaps (~1 ms every 100 kernels on sim
    adreno640) are GPU idle time inside each decode graph. At ``graph`` granularity
    tmpc sees only the graph's total host time; told where the backend submits, it
    gives each gap a block of its own and runs it low, within the same TPOT budget.
    (Stop 37's gemma recording, 2%: 12.7% -> 13.1% saving on adreno640, 20.7% ->
    21.7% on adreno650; simulated.) Without the claim (a real device today) nothing
    changes."""
    p = load_profile("adreno640")
    trace = phone_segments(make_trace(requests=2, decode_tokens=32, model="gemma-3-270m"), p)
    dev = SimGpu(p, host_model=True)
    base = replay(trace, make_controller("default", **for_device(dev)), dev, granularity="graph")
    got = {}
    idle_low_ms = {}
    idle_j = {}
    for told in (False, True):
        dev = SimGpu(p, host_model=told, record_intervals=True)
        ctl = make_controller("tmpc", latency_slack=SLACK, **for_device(dev))
        got[told] = replay(trace, ctl, dev, granularity="graph")
        # decode idle at the bottom two levels: sampling stalls and, told, the gaps
        low = set(p.levels_hz[:2])
        idle = [
            (d, hz, e)
            for _, d, hz, kind, ph, e in dev.intervals
            if kind == "idle" and ph == "decode"
        ]
        idle_low_ms[told] = sum(d for d, hz, _ in idle if hz in low) / 1e6
        idle_j[told] = sum(e for _, _, e in idle)
    for told in (False, True):
        assert got[told].tpot_ms <= (1.0 + SLACK + TOLERANCE) * base.tpot_ms, told
    # (here: 305 -> 361 ms at the bottom two levels, 0.207 -> 0.198 J of decode idle,
    # 15.9% -> 16.4% saving)
    assert idle_low_ms[True] > 1.1 * idle_low_ms[False], idle_low_ms
    assert idle_j[True] < 0.98 * idle_j[False], idle_j
    assert got[True].energy_j < got[False].energy_j
