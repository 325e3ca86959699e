"""Workload model: RLS identification, compute-bound fraction, sweet spot, intensity."""

import numpy as np
import pytest

from turboinfer_llama.control.model import Intensity, PhaseModel, PowerTable, WorkloadModel
from turboinfer_llama.devices.base import Counters

LEVELS = [305_000_000, 400_000_000, 490_000_000, 587_000_000, 670_000_000]


def _graph(rng, n=40):
    c = rng.uniform(1e3, 2e4, n)
    m = rng.uniform(1e3, 2e4, n)
    return c, m, np.ones(n)


def test_rls_identifies_the_roofline_factors_across_frequencies():
    rng = np.random.default_rng(0)
    truth = PhaseModel(LEVELS[-1])
    truth.theta = np.array([1.4, 0.8, 0.3, 2.0])
    model = PhaseModel(LEVELS[-1], forget=0.98)
    for _ in range(300):
        c, m, ln = _graph(rng)
        f = float(rng.choice(LEVELS))
        t, _ = truth.level_times(c, m, ln, np.array([f]))
        model.update(model.features(c, m, ln, f), float(t.sum()))
    c, m, ln = _graph(rng)
    got, _ = model.level_times(c, m, ln, np.array(LEVELS, dtype=float))
    want, _ = truth.level_times(c, m, ln, np.array(LEVELS, dtype=float))
    np.testing.assert_allclose(got.sum(axis=0), want.sum(axis=0), rtol=0.03)


def test_rls_finds_the_minimum_kernel_time_of_the_simulator():
    """Half the kernels of a small decode graph sit on the simulator's floor: their time
    does not scale with the clock, and the model must not believe it does."""
    import dataclasses

    from turboinfer_llama.control.model import node_times
    from turboinfer_llama.devices.sim import SimGpu

    # the model's memory term does not depend on the level; the simulator's GPU-DDR
    # coupling does (issue 13 teaches the model the coupling): identify it uncoupled
    prof = dataclasses.replace(SimGpu().profile, bus_coupling=0.0)
    rng = np.random.default_rng(1)
    flops = np.concatenate([rng.uniform(1e3, 1e5, 40), rng.uniform(1e6, 5e7, 40)])
    bytes_ = np.concatenate([rng.uniform(1e2, 1e4, 40), rng.uniform(1e5, 5e6, 40)])
    c, m = node_times(flops, bytes_)
    ln = np.ones(len(c))
    levels = [int(h) for h in prof.levels_hz]
    model = PhaseModel(levels[-1])
    for i in range(60):
        f = levels[i % len(levels)]
        y = sum(prof.kernel_ns(a, b, f) for a, b in zip(flops, bytes_, strict=True))
        model.update(model.features(c, m, ln, float(f)), y)
    got, _ = model.level_times(c, m, ln, np.array(levels, dtype=float))
    want = [
        sum(prof.kernel_ns(a, b, f) for a, b in zip(flops, bytes_, strict=True)) for f in levels
    ]
    np.testing.assert_allclose(got.sum(axis=0), want, rtol=0.01)


def test_compute_bound_fraction_rises_as_the_clock_drops():
    wm = WorkloadModel(PowerTable.assumed(LEVELS))
    c, m, ln = np.full(10, 5e3), np.full(10, 8e3), np.ones(10)
    frac = wm.compute_bound_fraction("decode", c, m, ln)
    assert frac[0] > frac[-1]
    assert np.all((frac >= 0) & (frac <= 1))


def test_sweet_spot_is_low_for_memory_bound_and_high_for_compute_bound_work():
    power = PowerTable.assumed(LEVELS)
    wm = WorkloadModel(power)
    n = np.ones(10)
    mem_bound = wm.sweet_spot_hz("decode", np.full(10, 1e3), np.full(10, 2e4), n)
    # compute-bound work at a table where static power dominates: racing wins
    hot = PowerTable(
        power.levels_hz, power.busy_w * 0 + 5.0 + 1e-10 * power.levels_hz, power.idle_w, 0.0, "test"
    )
    compute_bound = WorkloadModel(hot).sweet_spot_hz(
        "decode", np.full(10, 2e4), np.full(10, 1e3), n
    )
    assert mem_bound == LEVELS[0]
    assert compute_bound == LEVELS[-1]


def test_intensity_from_pmu_and_busy_fallback():
    it = Intensity()
    assert it.update(Counters(0, 0, 0, 0, 500_000_000)) is None
    ipc = it.update(Counters(1_000_000, 500_000, 1_000_000, 250_000, 500_000_000))
    assert ipc == pytest.approx(250_000 / (1e-3 * 500e6))
    assert it.source == "pmu"
    nopmu = Intensity()
    nopmu.update(Counters(0, 0, 0, None, 1))
    assert nopmu.update(Counters(10, 3, 10, None, 1)) == pytest.approx(0.3)
    assert nopmu.source == "busy"


def test_an_intensity_jump_reopens_the_estimator():
    wm = WorkloadModel(PowerTable.assumed(LEVELS))
    pm = wm.phases["decode"]
    pm.P = pm.P * 0.01
    for i in range(1, 6):
        wm.observe_counters(
            Counters(i * 10**6, i * 5 * 10**5, i * 10**6, i * 10**5, 10**9), "decode"
        )
    assert wm.reopened == 0
    wm.observe_counters(Counters(7 * 10**6, 4 * 10**6, 7 * 10**6, 9 * 10**5, 10**9), "decode")
    assert wm.reopened == 1
    np.testing.assert_allclose(pm.P, pm._p0)


def test_power_table_from_the_simulator():
    from turboinfer_llama.devices.sim import SimGpu

    dev = SimGpu()
    pt = PowerTable.from_device(dev)
    assert list(pt.levels_hz) == dev.frequencies_hz()
    assert np.all(np.diff(pt.busy_w) > 0) and np.all(pt.idle_w < pt.busy_w)
    assert "simulated" in pt.source


def _fit_graph(c, m, ln, f_hz, busy_ns):
    """A graph run at one clock throughout, as tmpc keeps it for a refit."""
    from turboinfer_llama.control.model import FitGraph

    ends = np.cumsum(np.maximum(c, m))
    starts = np.concatenate(([0.0], ends[:-1]))
    return FitGraph(
        c, m, ln, starts, ends, np.array([0.0, ends[-1] + 1.0]), np.array([f_hz]), busy_ns
    )


@pytest.mark.parametrize("compute_scale", [1.0, 0.25])
def test_a_refit_lands_on_the_simulated_mali_roofline(compute_scale):
    """The simulated Mali-G76 computes 3.4x slower than the reference machine the prior
    is set from, so its matrix-vector products start judged memory-bound. With the refit
    run as tmpc runs it (when due, before each update) the model ends within 5% of the
    simulator at every level, and the refit has run (tmpc's own trap, where the RLS alone
    never leaves the wrong side: ``test_control_tmpc_ondemand``). At a quarter of its
    compute efficiency (13.6x slower than the prior, past the refit grid's 4x) the grid
    moves to its best on the edge (``REFIT_ROUNDS``); with one grid the model ends 5.9%
    off."""
    import dataclasses

    from turboinfer_llama.control.model import node_times
    from turboinfer_llama.devices.sim import SimGpu, load_profile
    from turboinfer_llama.engine.graph import REF_OPS_PER_S

    base = load_profile("mali-g76")
    dev = SimGpu(
        dataclasses.replace(base, compute_efficiency=base.compute_efficiency * compute_scale)
    )
    prof = dev.profile
    model = WorkloadModel(PowerTable.from_device(dev)).phases["decode"]
    rng = np.random.default_rng(3)
    # a decode graph: matrix-vector products near the reference machine's balance, and
    # small element-wise kernels
    # whose compute time at the reference machine is 0.45-0.9 of their memory time:
    # memory-bound there, compute-bound on the Mali (3.4x slower compute, 1.3x memory)
    bytes_ = np.concatenate([rng.uniform(1e5, 4e5, 60), rng.uniform(1e3, 1e4, 60)])
    _, m_ref = node_times(np.zeros(len(bytes_)), bytes_)
    share = np.concatenate([rng.uniform(0.45, 0.9, 60), rng.uniform(0.01, 0.1, 60)])
    flops = share * m_ref * 1e-9 * REF_OPS_PER_S
    c, m = node_times(flops, bytes_)
    ln = np.ones(len(c))
    levels = [int(h) for h in prof.levels_hz]

    def truth(f):
        return float(prof.kernel_ns_array(flops, bytes_, f).sum())

    clocks = [levels[-1], levels[3], levels[4], levels[2]]
    for i in range(48):
        f = clocks[i % len(clocks)]
        y = truth(f)
        if model.refit_due():
            model.refit()
        model.update(model.features(c, m, ln, float(f)), y, _fit_graph(c, m, ln, f, y))
    got = model.times_at_levels(c, m, ln, np.array(levels, dtype=float)).sum(axis=0)
    want = np.array([truth(f) for f in levels])
    assert model.refits >= 1
    np.testing.assert_allclose(got, want, rtol=0.05)


@pytest.mark.parametrize("loose", [False, True])
def test_a_right_estimate_is_not_refitted_away(loose, monkeypatch):
    """On the simulated adreno650 the prior is right (it is the reference machine), yet
    a fit can be noisy: here each graph's nodes are placed in time by cost weight alone
    (as tmpc placed them at graph granularity before stop 38, taking no account of the
    clock), and on the decision-time bench's synthetic trace the decode fit's residual
    runs near 10%. A refit triggered at 5% and taken at half the error moved the
    estimate away from the truth (th_c 1.0 -> 1.5): shown with ``loose``, so the test
    can fail. At 15% and a quarter it stays put."""
    from turboinfer_llama.control import model as model_mod
    from turboinfer_llama.control.factory import for_device, make_controller
    from turboinfer_llama.control.replay import replay
    from turboinfer_llama.control.synthetic import make_trace
    from turboinfer_llama.control.tmpc import TubeMPC
    from turboinfer_llama.devices.sim import SimGpu

    def weight_spans(self, b):
        ends = b.t_first_ns + (b.t_end_ns - b.t_first_ns) * self._weight_share(b)
        starts = np.empty(b.n)
        starts[0] = b.t_first_ns
        starts[1:] = ends[:-1]
        return starts, ends

    monkeypatch.setattr(TubeMPC, "_node_spans", weight_spans)
    if loose:
        monkeypatch.setattr(model_mod, "REFIT_RESID", 0.05)
        monkeypatch.setattr(model_mod, "REFIT_GAIN", 0.5)
    trace = make_trace(requests=2, decode_tokens=32, model="gemma-3-270m")
    dev = SimGpu()
    ctl = make_controller("tmpc", **for_device(dev))
    replay(trace, ctl, dev, seed=0, granularity="graph")
    pm = ctl.model.phases["decode"]
    if loose:
        assert pm.refits >= 1
        assert abs(pm.theta[0] - 1.0) > 0.2
    else:
        assert pm.refits == 0
        assert pm.theta[0] == pytest.approx(1.0, abs=0.05)


def test_the_simulators_power_table_carries_its_switch_energy():
    """Every applied change costs the profile's ``switch_energy_j`` in the simulator;
    the controller's table says so too (it said 0 J, written before switches cost)."""
    from turboinfer_llama.control.model import PowerTable
    from turboinfer_llama.devices.sim import SimGpu, load_profile

    p = load_profile("adreno650")
    assert p.switch_energy_j > 0
    assert PowerTable.from_device(SimGpu(p)).switch_j == p.switch_energy_j
