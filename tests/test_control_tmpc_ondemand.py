"""tmpc against the hindsight ``phase`` baseline where the default governor is
simple_ondemand (issue 13, item 3). All figures simulated."""

import numpy as np
import pytest

from turboinfer_llama.control.default_bound import OndemandBound
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
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


def test_a_long_prompt_spends_its_slack_where_the_envelope_would_only_ramp(monkeypatch):
    """Under simple_ondemand a prompt followed the envelope of the default's levels:
    no slower than the default's at every instant, but it saves only while that is
    below the top -- a ramp of ~30 ms before a 968-token prompt's ~2.6 s at the top.
    Its solved plan spends the slack of its top-level time instead (50 ms at 2%), and a
    prompt now runs on whichever spends more (``_slack_beats_ramp``): the long prompt
    on its plan, the short one still on the envelope. Without the choice (every
    prompt on the envelope) the prompts spend more energy."""
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
    chosen: list[tuple[int, bool]] = []

    def spy(self, n_tokens, t_ns):
        got = choose(self, n_tokens, t_ns)
        chosen.append((int(n_tokens), got))
        return got

    got = {}
    for name, rule in (("choice", spy), ("envelope only", lambda self, n, t: False)):
        monkeypatch.setattr(tmpc_mod.TubeMPC, "_slack_beats_ramp", rule)
        dev = SimGpu(prof)
        ctl = make_controller("tmpc", latency_slack=slack, **for_device(dev))
        got[name] = replay(trace, ctl, dev, hold=True)
    # the first request has no bound state to follow; then the long and the short one
    assert chosen == [(968, True), (24, False)]
    on, off = got["choice"], got["envelope only"]
    assert on.energy_by_phase_j["prefill"] < 0.99 * off.energy_by_phase_j["prefill"]
    assert on.energy_j < off.energy_j
    assert on.tpot_ms <= base.tpot_ms * (1 + slack + 0.002)
    assert on.ttft_ms <= base.ttft_ms * (1 + slack + 0.002)
