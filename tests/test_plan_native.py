"""The planner's C passes (hooks/ti_plan.c) against their numpy twins.

The twins are the reference: each C pass must give the same numbers (to rounding of
the sums) and the same discrete choices, on random graphs and on tmpc's own inputs, and
a whole tmpc replay must make the same switches with either.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turboinfer_llama.control import plan_native as pn
from turboinfer_llama.control import tmpc_solver as solver
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimGpu

pytestmark = pytest.mark.skipif(not pn.NATIVE, reason="hook library not built")

LEVELS = np.array([257e6, 345e6, 427e6, 499e6, 585e6, 670e6])


def _graph(seed: int, n: int, strided: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cmx = np.empty((n, 3))
    cmx[:, 0] = rng.lognormal(8, 2, n) * (rng.random(n) > 0.2)
    cmx[:, 1] = rng.lognormal(8, 2, n) * (rng.random(n) > 0.1)
    cmx[:, 2] = (rng.random(n) > 0.3).astype(float)
    if strided:  # the ingest hands out columns of one read-only (n, 3) array
        cmx.setflags(write=False)
        return cmx[:, 0], cmx[:, 1], cmx[:, 2]
    return cmx[:, 0].copy(), cmx[:, 1].copy(), cmx[:, 2].copy()


def _spans(seed: int, n: int, zero_share: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    dur = rng.lognormal(9, 1, n) * (rng.random(n) > zero_share)
    ends = 1e9 + np.cumsum(dur)
    starts = np.empty(n)
    starts[0] = 1e9
    starts[1:] = ends[:-1]
    return starts, ends


def _segments(seed: int, starts: np.ndarray, ends: np.ndarray, n_sw: int):
    rng = np.random.default_rng(seed + 2)
    t0, t1 = float(starts.min()), float(ends.max())
    inner = np.sort(rng.uniform(t0, t1, n_sw))
    if n_sw > 1:  # a switch exactly on a node boundary, and two landing together
        inner[0] = starts[len(starts) // 2]
        inner[1] = inner[0]
        inner.sort()
    seg_t = np.array([t0, *inner, t1 + 1.0])
    seg_hz = LEVELS[rng.integers(0, len(LEVELS), n_sw + 1)]
    return seg_t, seg_hz


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 900),
    n_sw=st.integers(0, 12),
    strided=st.booleans(),
    coupled=st.booleans(),
    zero_share=st.sampled_from([0.0, 0.05, 0.5]),
)
def test_observe_matches_numpy(seed, n, n_sw, strided, coupled, zero_share):
    c, m, launch = _graph(seed, n, strided)
    starts, ends = _spans(seed, n, zero_share)
    seg_t, seg_hz = _segments(seed, starts, ends, n_sw)
    theta = np.random.default_rng(seed).uniform([0.3, 0.3, 0.05, 0.5, 0], [3, 3, 1, 8, 2])
    extra = np.linspace(0.8, 0.0, len(LEVELS)) if coupled else None
    lv = LEVELS if coupled else None
    args = (c, m, launch, starts, ends, seg_t, seg_hz, theta, LEVELS[-1], LEVELS, lv, extra)
    got = pn.observe(*args, native=True)
    ref = pn.observe(*args, native=False)
    np.testing.assert_allclose(got.x, ref.x, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(got.level_ns, ref.level_ns, rtol=1e-9, atol=1e-6)
    assert got.min_hz == pytest.approx(ref.min_hz, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 900),
    strided=st.booleans(),
    time_scale=st.floats(0.3, 3.0),
    host_ns=st.floats(0.0, 5e6),
    placed=st.booleans(),
)
def test_tabulate_matches_numpy(seed, n, strided, time_scale, host_ns, placed):
    c, m, launch = _graph(seed, n, strided)
    rng = np.random.default_rng(seed)
    theta = rng.uniform([0.3, 0.3, 0.05, 0.5, 0], [3, 3, 1, 8, 2])
    ratio = LEVELS[-1] / LEVELS
    coupling = np.linspace(0.8, 0.0, len(LEVELS))
    busy, idle = np.linspace(0.5, 3.0, len(LEVELS)), np.linspace(0.2, 0.6, len(LEVELS))
    edges = solver._edges(n)
    host_node = None
    if placed:  # the host time at measured gaps (a few nodes), not shared by launches
        host_node = np.where(rng.random(n) < 0.05, rng.random(n), 0.0)
        host_node *= host_ns / max(float(host_node.sum()), 1e-9)
        edges = solver._gap_edges(n, host_node)
    seen = seed % len(LEVELS)  # levels below it at their worst case (0: none)
    worst = LEVELS[-1] / LEVELS
    args = (c, m, launch, theta, ratio, coupling, busy, idle, time_scale, host_ns, edges, host_node)
    got = pn.tabulate(*args, worst, seen, native=True)
    ref = pn.tabulate(*args, worst, seen, native=False)
    # the worst case never undercuts the model, and is the model from `seen` up
    assert (ref.safe_block_ns >= ref.block_ns - 1e-6).all()
    np.testing.assert_array_equal(ref.safe_block_ns[:, seen:], ref.block_ns[:, seen:])
    if seen:
        top_kernel = np.add.reduceat(ref.kernel_ns[:, -1], edges[:-1])
        host_b = ref.block_ns[:, -1] - top_kernel
        np.testing.assert_allclose(
            ref.safe_block_ns[:, :seen] - host_b[:, None],
            np.maximum(
                ref.block_ns[:, :seen] - host_b[:, None], top_kernel[:, None] * worst[:seen]
            ),
            rtol=1e-9,
            atol=1e-6,
        )
    if host_node is not None and host_ns > 0:
        # each block carries its own nodes' host time, at every level
        per_block = np.add.reduceat(host_node, edges[:-1])
        np.testing.assert_allclose(
            ref.block_ns - np.add.reduceat(ref.kernel_ns, edges[:-1], axis=0),
            np.repeat(per_block[:, None], len(LEVELS), axis=1),
            rtol=1e-9,
            atol=1e-6,
        )
    for name in (
        "kernel_ns", "graph_ns", "energy", "block_ns", "block_energy",
        "safe_graph_ns", "safe_energy", "safe_block_ns", "safe_block_energy",
    ):  # fmt: skip
        np.testing.assert_allclose(
            getattr(got, name), getattr(ref, name), rtol=1e-9, atol=1e-6, err_msg=name
        )


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), n_seg=st.integers(1, 4), n_lv=st.integers(1, 9))
def test_horizon_matches_numpy(seed, n_seg, n_lv):
    rng = np.random.default_rng(seed)
    energy, time_ns = rng.random((n_seg, n_lv)), rng.random((n_seg, n_lv))
    combos, _ = solver.level_combinations(n_lv, n_seg)
    penalty = rng.random(len(combos)) * 0.05
    budget = rng.uniform(0.2, 1.0) * n_seg
    first = None if seed % 2 else rng.uniform(0.1, 1.0)
    got = solver.solve_horizon(energy, time_ns, budget, penalty, combos, first, native=True)
    ref = solver.solve_horizon(energy, time_ns, budget, penalty, combos, first, native=False)
    assert list(got.levels) == list(ref.levels)
    assert got.feasible == ref.feasible
    assert got.used_ns == pytest.approx(ref.used_ns, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), nb=st.integers(1, 30), n_lv=st.integers(1, 9))
def test_block_levels_matches_numpy(seed, nb, n_lv):
    rng = np.random.default_rng(seed)
    block_e, block_t = rng.random((nb, n_lv)), rng.random((nb, n_lv))
    cap = rng.uniform(0.2, 1.0) * nb
    got = solver.block_levels(block_e, block_t, cap, native=True)
    ref = solver.block_levels(block_e, block_t, cap, native=False)
    assert (got is None) == (ref is None)
    if got is not None and ref is not None:
        assert list(got[0]) == list(ref[0])
        assert got[1] == pytest.approx(ref[1], rel=1e-9)


def test_rejects_bad_sizes():
    c, m, launch = _graph(0, 10, False)
    edges = np.array([0, 4, 3, 10])  # not ascending
    with pytest.raises(ValueError, match="ti_plan_tabulate"):
        pn.tabulate(
            c, m, launch, np.ones(5), np.ones(2), np.zeros(2), np.ones(2), np.ones(2),
            1.0, 0.0, edges, native=True,
        )  # fmt: skip


@pytest.mark.parametrize("granularity", ["graph", "kernel"])
@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_tmpc_replay_same_with_either(monkeypatch, granularity, profile):
    """A whole tmpc replay issues the same switches, energy and latency with the C
    passes as with the numpy twins (the comparisons inside the plan see values equal
    to rounding)."""
    trace = make_trace(requests=2, decode_tokens=24, model="gemma-3-270m")

    def run():
        dev = SimGpu(profile)
        ctl = make_controller("tmpc", **for_device(dev))
        res = replay(trace, ctl, dev, seed=0, granularity=granularity)
        return res, ctl

    native, ctl_c = run()
    monkeypatch.setattr(pn, "NATIVE", False)
    numpy_, ctl_np = run()
    assert ctl_c.solves == ctl_np.solves > 0
    assert native.switches == numpy_.switches
    assert native.switches > 0  # the loop steered: a comparison that cannot pass empty
    assert native.energy_j == pytest.approx(numpy_.energy_j, rel=1e-9)
    assert native.tpot_ms == pytest.approx(numpy_.tpot_ms, rel=1e-9)
    assert native.ttft_ms == pytest.approx(numpy_.ttft_ms, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), forget=st.floats(0.8, 1.0))
def test_rls_matches_numpy_over_a_run(seed, forget):
    """Fifty steps from the same prior stay equal to rounding (the residual, the
    bounded estimate and the trace-bounded covariance)."""
    rng = np.random.default_rng(seed)
    th_min = np.array([0.05, 0.05, 0.05, 0.05, 0.0])
    p0 = np.diag([0.5, 0.5, 0.05, 0.5, 0.1])
    state = {nat: (np.array([1.0, 1.0, 0.2, 3.0, 0.0]), p0.copy()) for nat in (True, False)}
    for _ in range(50):
        x = rng.lognormal(12, 1.5, 5) * (rng.random(5) > 0.2)
        y = float(x @ rng.uniform(0.2, 4.0, 5)) * rng.lognormal(0, 0.1) + 1.0
        out = {}
        for nat, (theta, P) in state.items():
            out[nat] = pn.rls_step(theta, P, x, y, forget, th_min, 20.0, 1.65, native=nat)
        np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-7, atol=1e-12)
        assert out[True][2] == pytest.approx(out[False][2], rel=1e-7, abs=1e-12)
        state = {nat: (o[0], o[1]) for nat, o in out.items()}
    theta = state[True][0]
    assert (theta >= th_min).all() and (theta <= 20.0).all()
    assert np.trace(state[True][1]) <= 1.65 + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    nb=st.integers(1, 40),
    n_lv=st.integers(1, 12),
    min_ns=st.floats(0.0, 3e6),
)
def test_dwell_matches_python(seed, nb, n_lv, min_ns):
    rng = np.random.default_rng(seed)
    block_ns = np.sort(rng.uniform(0.01e6, 1.5e6, (nb, n_lv)), axis=1)[:, ::-1].copy()
    levels = rng.integers(0, n_lv, nb)
    got = solver.dwell_merge(levels, block_ns, min_ns, native=True)
    ref = solver.dwell_merge(levels, block_ns, min_ns, native=False)
    assert list(got) == list(ref)


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    n=st.integers(1, 900),
    n_lv=st.integers(1, 12),
    share=st.booleans(),
)
def test_layout_matches_numpy(seed, n, n_lv, share):
    """A block plan laid out over its graph: the blocks' ends and the nodes' shares are
    the numpy twin's to the last bit (one running sum, left to right, either way)."""
    rng = np.random.default_rng(seed)
    edges = solver._edges(n)
    kernel_ns = rng.lognormal(9, 1.5, (n, n_lv)) * (rng.random((n, 1)) > 0.1)
    host_ns = rng.lognormal(7, 2, n) * (rng.random(n) > 0.7)
    block_ns = np.add.reduceat(kernel_ns + host_ns[:, None], edges[:-1], axis=0)
    levels = rng.integers(0, n_lv, len(edges) - 1)
    got = pn.layout(kernel_ns, host_ns, block_ns, edges, levels, share, native=True)
    ref = pn.layout(kernel_ns, host_ns, block_ns, edges, levels, share, native=False)
    assert got[0].tolist() == ref[0].tolist()
    assert (got[1] is None) == (ref[1] is None) == (not share)
    if share:
        assert got[1].tolist() == ref[1].tolist()
        assert got[1][-1] == pytest.approx(1.0) or not host_ns.sum() + kernel_ns.sum()


def test_layout_rejects_bad_levels():
    edges = solver._edges(10)
    block_ns = np.ones((len(edges) - 1, 3))
    bad = np.full(len(edges) - 1, 3)  # a level past the table
    with pytest.raises(ValueError, match="ti_plan_layout"):
        pn.layout(np.ones((10, 3)), np.zeros(10), block_ns, edges, bad, True, native=True)
