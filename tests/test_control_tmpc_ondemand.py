"""tmpc against the hindsight ``phase`` baseline where the default governor is
simple_ondemand (issue 13, item 3). All figures simulated."""

import numpy as np
import pytest

from turboinfer_llama.control.default_bound import OndemandBound
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.control.tmpc import TubeMPC
from turboinfer_llama.devices.sim import SimGpu, load_profile

MS = 1_000_000
LEVELS_HZ = [200_000_000, 300_000_000, 450_000_000, 600_000_000, 800_000_000]


def _bound(initial_level: int | None = None) -> OndemandBound:
    return OndemandBound(
        LEVELS_HZ,
        up_threshold=90,
        down_differential=5,
        polling_ns=50 * MS,
        switch_latency_ns=0,
        initial_level=initial_level,
    )


def test_the_prompt_envelope_after_an_idle_gap_holds_the_bottom_until_a_busy_window():
    # after 300 ms idle every timeline is at the bottom with an idle window; a wholly
    # busy prompt raises one only at a poll whose window is over 90% busy: the first
    # such poll comes 45-50 ms in (the timer phases are 50/12 ms apart)
    b = _bound(initial_level=2)
    steps = b.envelope(b.snapshot(), 0.0, 300 * MS)
    assert steps[0] == (0.0, 0)
    assert steps[-1][1] == len(LEVELS_HZ) - 1
    assert 45 * MS <= steps[1][0] <= 50 * MS + 1
    # a short idle gap after busy work: the level does not start at the bottom
    steps = b.envelope(b.snapshot(), 20 * MS, 1 * MS)
    assert steps[0][1] > 0
    # the state is not changed by asking
    assert b.envelope(b.snapshot(), 0.0, 300 * MS)[1][0] == pytest.approx(45.83 * MS, rel=1e-3)


def test_the_prompt_envelope_never_undercuts_any_timeline():
    # the envelope is the upper envelope of the timelines' own levels over the prompt
    b = _bound(initial_level=1)
    dur = 8.0 * MS * np.asarray(LEVELS_HZ[-1], dtype=np.float64) / np.asarray(LEVELS_HZ)
    for _ in range(30):
        b.idle(9 * MS)
        b.graph(dur, np.ones(len(LEVELS_HZ)) * 0.9, dur)
    snap = b.snapshot()
    env = b.envelope(snap, 3 * MS, 4 * MS)
    env_t = [t for t, _ in env]
    for st in snap:
        one = OndemandBound(
            LEVELS_HZ, up_threshold=90, down_differential=5, polling_ns=50 * MS,
            switch_latency_ns=0, n_phases=1,
        )  # fmt: skip
        for t, lv in one.envelope((st,), 3 * MS, 4 * MS):
            k = max(i for i, x in enumerate(env_t) if x <= t)
            assert env[k][1] >= lv


@pytest.mark.parametrize("profile", ["mali-g76"])
def test_tmpc_keeps_up_with_the_phase_baseline_on_a_simple_ondemand_profile(profile):
    """On mali-g76 (simple_ondemand) tmpc spent 10% *more* than the default governor
    here while ``phase`` (prefill and decode each at its best fixed level, chosen in
    hindsight) saves 1.6% less than it: tmpc ran each prompt at the top where the
    default sits at the bottom after the idle gap, and its decode plans mixed higher
    levels around the bound's level. It must now save at least ``phase`` less one
    point, within the latency budget."""
    prof = load_profile(profile)
    trace = make_trace(
        requests=2, decode_tokens=64, prompt_tokens=16, sample_ms=1.5, idle_ms=50, seed=2
    )
    slack = 0.02
    got = {}
    for name in ("default", "phase", "tmpc"):
        dev = SimGpu(prof)
        ctl = make_controller(
            name,
            latency_slack=slack,
            **for_device(dev),
            trace=trace,
            device_factory=lambda: SimGpu(prof),
        )
        got[name] = replay(trace, ctl, dev, hold=True)
    base = got["default"]
    saving = {k: 1.0 - r.energy_j / base.energy_j for k, r in got.items()}
    assert saving["tmpc"] >= saving["phase"] - 0.01, saving
    tmpc = got["tmpc"]
    assert tmpc.tpot_ms <= base.tpot_ms * (1 + slack + 0.002)
    assert tmpc.ttft_ms <= base.ttft_ms * (1 + slack + 0.002)


@pytest.mark.parametrize("refit", [True, False])
def test_tmpc_finds_the_clocks_effect_on_a_gpu_unlike_the_reference_machine(refit, monkeypatch):
    """The decode model's prior is the reference machine's balance (``engine.graph``);
    the simulated Mali-G76 computes 3.4x slower. Judged memory-bound at the prior, its
    kernels gave the RLS no compute regressor, so the compute efficiency stayed at the
    prior and the memory one grew instead (gemma on sim:mali-g76: 1.15 against 3.39
    true; a graph at 200 MHz predicted 1.16x its top-level time against 2.87x). With
    the refit the compute efficiency lands within 20% of the profile's; without it
    (the trap, shown so this test can fail) it stays under half of it."""
    from turboinfer_llama.control import model as model_mod
    from turboinfer_llama.engine.graph import REF_OPS_PER_S

    if not refit:
        monkeypatch.setattr(model_mod, "REFIT_RESID", float("inf"))
    prof = load_profile("mali-g76")
    trace = make_trace(
        requests=2, decode_tokens=64, prompt_tokens=16, sample_ms=1.5, idle_ms=50, seed=2
    )
    dev = SimGpu(prof)
    ctl = make_controller(
        "tmpc", latency_slack=0.02, **for_device(dev), trace=trace,
        device_factory=lambda: SimGpu(prof),
    )  # fmt: skip
    replay(trace, ctl, dev, hold=True)
    pm = ctl.model.phases["decode"]
    top_ops_per_s = prof.peak_ops_per_cycle * prof.compute_efficiency * max(prof.levels_hz)
    true_c = REF_OPS_PER_S / top_ops_per_s  # the profile's compute time over the reference's
    if refit:
        assert pm.refits >= 1
        assert pm.theta[0] == pytest.approx(true_c, rel=0.2)
    else:
        assert pm.refits == 0
        assert pm.theta[0] < 0.5 * true_c


def test_a_prompt_spends_its_slack_and_the_defaults_ramp_on_a_solved_plan(monkeypatch):
    """Under simple_ondemand a prompt followed the envelope of the default's levels:
    no slower than the default's at every instant, but it saves only while that is
    below the top -- a ramp of ~30 ms before a 968-token prompt's ~2.6 s at the top.
    Its solved plan spends the slack of its top-level time instead (50 ms at 2%), and a
    prompt ran on whichever spends more (``_slack_beats_ramp``): the long prompt on its
    plan, the short one on the envelope. Now a prompt whose ramp covers one of
    ``PROMPT_RAMP_STEPS`` runs on a plan solved against the top-level time plus that
    ramp, its slack of both (``_ramped_plan``): both prompts here. Each step spends
    less energy on the prompts, within the budget."""
    from turboinfer_llama.control import tmpc as tmpc_mod

    prof = load_profile("mali-g76")
    slack = 0.05
    trace = make_trace(
        requests=3, decode_tokens=24, prompt_tokens=[16, 968, 24], sample_ms=1.5, idle_ms=50,
        seed=2,
    )  # fmt: skip
    dev = SimGpu(prof)
    base = replay(trace, make_controller("default", **for_device(dev)), dev, hold=True)
    choose = tmpc_mod.TubeMPC._slack_beats_ramp
    ramped = tmpc_mod.TubeMPC._ramped_plan
    chosen: list[tuple[int, bool]] = []
    took_ramped: list[tuple[int, bool]] = []

    def spy_choice(self, n_tokens, t_ns):
        got = choose(self, n_tokens, t_ns)
        chosen.append((int(n_tokens), got))
        return got

    def spy_ramped(self, n_tokens, t_ns):
        got = ramped(self, n_tokens, t_ns)
        took_ramped.append((int(n_tokens), got is not None))
        return got

    got = {}
    steps = tmpc_mod.PROMPT_RAMP_STEPS
    for name, rule, ramp_steps in (
        ("ramped", spy_choice, steps),
        ("choice", spy_choice, ()),
        ("envelope only", lambda self, n, t: False, ()),
    ):
        monkeypatch.setattr(tmpc_mod.TubeMPC, "_slack_beats_ramp", rule)
        monkeypatch.setattr(tmpc_mod.TubeMPC, "_ramped_plan", spy_ramped)
        monkeypatch.setattr(tmpc_mod, "PROMPT_RAMP_STEPS", ramp_steps)
        chosen.clear()
        took_ramped.clear()
        dev = SimGpu(prof)
        ctl = make_controller("tmpc", latency_slack=slack, **for_device(dev))
        got[name] = replay(trace, ctl, dev, hold=True)
        if name == "ramped":
            # the first request has no bound state to follow; then the long and the
            # short one, each on a ramped plan (so the older choice is not asked)
            assert took_ramped == [(968, True), (24, True)]
            assert chosen == []
        elif name == "choice":
            assert took_ramped == [(968, False), (24, False)]
            assert chosen == [(968, True), (24, False)]
    prefill = {k: r.energy_by_phase_j["prefill"] for k, r in got.items()}
    assert prefill["ramped"] < 0.99 * prefill["choice"] < 0.99 * 0.99 * prefill["envelope only"]
    assert got["ramped"].energy_j < got["choice"].energy_j < got["envelope only"].energy_j
    for r in got.values():
        assert r.tpot_ms <= base.tpot_ms * (1 + slack + 0.002)
        assert r.ttft_ms <= base.ttft_ms * (1 + slack + 0.002)
    # the ramped plans spend more of the TTFT budget, not less
    assert got["ramped"].ttft_ms > got["choice"].ttft_ms


def test_a_graph_run_wholly_at_one_level_bounds_the_requests_later_busy_time_there(monkeypatch):
    """A decode graph run wholly at one level measures its busy time there exactly;
    the default's bound takes it, grown by ``WHOLLY_MARGIN`` plus ``WHOLLY_GROWTH`` a
    graph, as the upper busy time of the request's later graphs at that level (and
    above). Checked here: every later graph run wholly at that level was measured
    within that growth (a longer context), so it is an upper bound; and the busy time
    the bound used never exceeds it. Without it (the clock-ratio bound of a graph run
    at mixed levels alone) the bound took up to ~27% more busy time than measured on
    this trace. Simulated (generic profile, simple_ondemand)."""
    from turboinfer_llama.control import default_bound as bound_mod
    from turboinfer_llama.control import tmpc as tmpc_mod

    prof = load_profile("generic")
    trace = make_trace(
        requests=3, decode_tokens=48, prompt_tokens=[16, 400, 24], sample_ms=1.5, idle_ms=20,
        seed=3,
    )  # fmt: skip
    reference = tmpc_mod.TubeMPC._bound_reference
    graph = bound_mod.OndemandBound.graph

    def run(margin: float) -> tuple[list[float], list[tuple[int, int, int, float]]]:
        over: list[float] = []  # the busy time used at a measured level over the measurement
        # (request, graph count, level, busy ns)
        wholly: list[tuple[int, int, int, float]] = []
        now: dict = {"request": 0}

        def spy_reference(self, phase, g, host, ref, meas):
            now["rec"] = dict(self._busy_wholly) if phase == "decode" else {}
            now["request"] += phase == "prefill"
            out = reference(self, phase, g, host, ref, meas)
            lv = meas.wholly_at
            if phase == "decode" and lv is not None:
                wholly.append((now["request"], self.graphs, lv, float(meas.busy_ns[lv])))
            return out

        def spy_graph(self, dur, share, lo, **kw):
            if kw.get("pooled"):
                over.extend(share[lv] * dur[lv] / b - 1.0 for lv, (b, _) in now["rec"].items())
            return graph(self, dur, share, lo, **kw)

        monkeypatch.setattr(tmpc_mod, "WHOLLY_MARGIN", margin)
        monkeypatch.setattr(tmpc_mod.TubeMPC, "_bound_reference", spy_reference)
        monkeypatch.setattr(bound_mod.OndemandBound, "graph", spy_graph)
        dev = SimGpu(prof)
        ctl = make_controller("tmpc", latency_slack=0.02, **for_device(dev))
        replay(trace, ctl, dev, hold=True)
        return over, wholly

    over, wholly = run(tmpc_mod.WHOLLY_MARGIN)
    assert len(wholly) >= 10
    pairs = 0
    for i, (r0, n0, lv0, b0) in enumerate(wholly):
        for r1, n1, lv1, b1 in wholly[i + 1 :]:
            if r1 == r0 and lv1 == lv0:
                pairs += 1
                grown = tmpc_mod.WHOLLY_MARGIN + tmpc_mod.WHOLLY_GROWTH * (n1 - n0)
                assert b1 <= b0 * (1.0 + grown), (n0, n1, lv0, b1 / b0)
    assert pairs >= 5
    assert max(over) <= tmpc_mod.WHOLLY_MARGIN + tmpc_mod.WHOLLY_GROWTH * 48
    loose, _ = run(float("inf"))
    assert max(loose) > 0.10


def test_the_envelope_takes_decode_not_yet_learnt_at_its_busy_share():
    """The planner learns a graph only when the next one begins, so at a request's
    begin the last decode graphs of the one before are not yet in the bound. Taken as
    wholly busy, 30 ms of them put a timeline at the top a few ms into the next prompt;
    at the decode's own busy share (0.65, an upper estimate) the windows before the
    prompt are as busy as the decode was, and the first raise comes where a wholly
    busy prompt fills a window: later, and never before the all-busy case's."""
    b = _bound(initial_level=1)
    dur = 20.0 * MS * np.asarray(LEVELS_HZ[-1], dtype=np.float64) / np.asarray(LEVELS_HZ)
    share = np.full(len(LEVELS_HZ), 0.65)
    for _ in range(20):  # a decode settled at a level below the top
        b.idle(2 * MS)
        b.graph(dur, share, dur)
    snap = b.snapshot()
    assert max(st[4] for st in snap) < len(LEVELS_HZ) - 1
    top = len(LEVELS_HZ) - 1
    busy = b.envelope(snap, 30 * MS, 2 * MS)
    decode = b.envelope(snap, 30 * MS, 2 * MS, share)
    assert busy[0][1] == decode[0][1] < top
    assert busy[1] == (pytest.approx(11.33 * MS, rel=1e-3), top)  # wholly busy: at 11 ms
    assert decode[1] == (pytest.approx(40.5 * MS, rel=1e-3), top)  # a busy prompt's window
    # 60 ms wholly busy: the prompt would begin at the top; at the share, where it was
    assert b.envelope(snap, 60 * MS, 2 * MS) == [(0.0, top)]
    assert b.envelope(snap, 60 * MS, 2 * MS, share)[0] == (0.0, decode[0][1])


def test_tmpc_follows_that_envelope_and_keeps_the_budget(monkeypatch):
    """Short prompts right after a request (10 ms idle): with the unlearnt decode
    taken as wholly busy, tmpc ran them at the top (TTFT -42% against the default's,
    simulated generic); at the decode's share it follows the default's level, spends
    less and keeps the budget."""
    from turboinfer_llama.control import default_bound as bound_mod

    prof = load_profile("generic")
    trace = make_trace(
        requests=3, decode_tokens=48, prompt_tokens=[24, 24, 33], sample_ms=2.5, idle_ms=10,
        seed=4,
    )  # fmt: skip
    slack = 0.02
    dev = SimGpu(prof)
    base = replay(trace, make_controller("default", **for_device(dev)), dev, hold=True)
    envelope = bound_mod.OndemandBound.envelope
    got = {}
    for name in ("decode share", "wholly busy"):
        if name == "wholly busy":
            monkeypatch.setattr(
                bound_mod.OndemandBound, "envelope",
                lambda self, snap, busy, idle, share=1.0: envelope(self, snap, busy, idle, 1.0),
            )  # fmt: skip
        dev = SimGpu(prof)
        got[name] = replay(
            trace, make_controller("tmpc", latency_slack=slack, **for_device(dev)), dev, hold=True
        )
    on, off = got["decode share"], got["wholly busy"]
    assert on.energy_by_phase_j["prefill"] < 0.95 * off.energy_by_phase_j["prefill"]
    assert on.energy_j < off.energy_j
    assert on.ttft_ms > off.ttft_ms
    assert on.ttft_ms <= base.ttft_ms * (1 + slack + 0.002)
    assert on.tpot_ms <= base.tpot_ms * (1 + slack + 0.002)


@pytest.mark.parametrize("profile", ["mali-g76", "generic"])
def test_no_prompt_ramps_longer_than_the_ramped_plans_are_made_for(profile, monkeypatch):
    """The ramped prompt plans are made only for shares of ramp a prompt of their length
    can have: a wholly busy prompt has the default at the top within
    ``PROMPT_RAMP_POLLS`` polls, so its ramp (as ``_ramped_plan`` times it) is at most
    that many polls and a switch latency. Checked on prompts after idle gaps of several
    polls, short and long: no prompt's ramp exceeds it (were the assumption wrong, a
    prompt would be denied a share it covers: less saving, never a broken budget)."""
    from turboinfer_llama.control import tmpc as tmpc_mod

    prof = load_profile(profile)
    trace = make_trace(
        requests=4, decode_tokens=16, prompt_tokens=[16, 968, 24, 300], sample_ms=1.5,
        idle_ms=400, seed=4,
    )  # fmt: skip
    ramps_ns: list[float] = []
    walk = tmpc_mod.TubeMPC._walk_envelope

    def spy(self, env, t_ns, pace, top_ns, level_j=None):
        got = walk(self, env, t_ns, pace, top_ns, level_j)
        if level_j is not None:  # the ramped plan's walk
            ramps_ns.append(got[0])
        return got

    monkeypatch.setattr(tmpc_mod.TubeMPC, "_walk_envelope", spy)
    dev = SimGpu(prof)
    ctl = make_controller("tmpc", latency_slack=0.05, **for_device(dev))
    replay(trace, ctl, dev, hold=True)
    bound = ctl._default_bound
    assert bound is not None
    longest_ns = tmpc_mod.PROMPT_RAMP_POLLS * bound.poll_ns + ctl.switch_latency_ns
    assert len(ramps_ns) >= 2  # the prompts after the first, each after an idle gap
    assert max(ramps_ns) > 0  # they did ramp
    ms = [round(r / 1e6, 1) for r in ramps_ns]
    print(f"\n{profile}: ramps {ms} ms, at most {longest_ns / 1e6:.1f} ms")
    assert max(ramps_ns) <= longest_ns


def test_graphs_run_wholly_at_the_bounds_level_teach_the_tube(monkeypatch):
    """A decode graph that tmpc runs wholly at the default's bound level costs no debt;
    its time at that one level is still a measurement of the model, and the tube learns
    from it like any planned graph's. (Not learnt from, a request's first plans set the
    tube and nothing moved it while the decode ran at the bound's level: on sim
    mali-g76 at graph granularity, gemma recording, 2%, the tube stayed at 0.079, the
    bound built with it sat a level high, and tmpc ran 12% under the default's TPOT.)"""
    from turboinfer_llama.control.forecast import StallStats

    trace = make_trace(requests=2, decode_tokens=32, model="gemma-3-270m")
    dev = SimGpu(load_profile("mali-g76"))
    ctl = make_controller("tmpc", latency_slack=0.02, **for_device(dev))
    assert isinstance(ctl, TubeMPC)
    wholly: set[int] = set()
    plan_wholly = ctl._plan_wholly

    def watched_plan(tpl, target, lv):
        wholly.add(target)
        plan_wholly(tpl, target, lv)

    ctl._plan_wholly = watched_plan  # type: ignore[method-assign]
    now: list[int] = [-1]
    taught: set[int] = set()
    real_update = StallStats.update

    def update(self, value):
        if self is ctl.rel_err:
            taught.add(now[0])
        real_update(self, value)

    monkeypatch.setattr(StallStats, "update", update)
    on_graph = ctl.on_graph
    ran: set[int] = set()

    def watched_graph(b):
        now[0] = b.graph
        if b.phase == "decode":
            ran.add(b.graph)
        return on_graph(b)

    ctl.on_graph = watched_graph  # type: ignore[method-assign]
    replay(trace, ctl, dev, granularity="graph")
    at_bound = wholly & ran
    assert len(at_bound) >= 5
    assert at_bound <= taught
