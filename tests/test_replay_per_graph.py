"""The per-graph replay (numpy over the kernels between switch points) against the
per-kernel reference path (``replay(..., reference=True)``), for every closed-loop
controller: the same run, on a recorded trace and on synthetic ones, at graph and
kernel granularity, on two profiles. Figures are simulated."""

import pytest

from turboinfer_llama.accounting import phone_segments
from turboinfer_llama.bench.runner import BenchConfig, replay_all
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimGpu

CLOSED_LOOP = ("tmpc", "max", "reactive", "ztt", "default")
PROFILES = ("adreno650", "mali-g76")
TOL = 0.005  # the bound; measured: equal to 1e-13 (float summation order)


def _run(segments, name, profile, *, reference, granularity="auto"):
    dev = SimGpu(profile)
    ctl = make_controller(name, **for_device(dev))
    return replay(segments, ctl, dev, granularity=granularity, reference=reference)


def _check(ref, fast):
    assert fast.tokens == ref.tokens and fast.granularity == ref.granularity
    for field in ("energy_j", "tpot_ms", "ttft_ms"):
        a, b = getattr(ref, field), getattr(fast, field)
        assert abs(b / a - 1) <= TOL, (field, a, b)
    # the controller saw the same run: same plans, same switches at the same instants
    assert fast.plans == ref.plans and fast.late_plans == ref.late_plans
    assert [(x.t_ns, x.level, x.source) for x in fast.applied] == [
        (x.t_ns, x.level, x.source) for x in ref.applied
    ]
    assert fast.switches == ref.switches


@pytest.fixture(scope="module")
def synthetic():
    return {
        kt: make_trace(
            requests=2, decode_tokens=4, prompt_tokens=8, idle_ms=60.0, seed=3, kernel_timing=kt
        )
        for kt in (True, False)
    }


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("timed", [True, False], ids=["kernel", "graph"])
@pytest.mark.parametrize("name", CLOSED_LOOP)
def test_per_graph_matches_per_kernel_on_synthetic_phone_traces(synthetic, profile, timed, name):
    segs = phone_segments(synthetic[timed], SimGpu(profile).profile)
    ref = _run(segs, name, profile, reference=True)
    assert ref.granularity == ("kernel" if timed else "graph")
    _check(ref, _run(segs, name, profile, reference=False))


@pytest.mark.parametrize("name", ["tmpc", "reactive"])
def test_per_graph_matches_per_kernel_on_raw_synthetic_traces(synthetic, name):
    # as recorded (no phone host model): no-op kernels with a host gap before them,
    # which the per-graph path hands to the per-kernel one
    for timed in (True, False):
        segs = synthetic[timed]
        _check(
            _run(segs, name, "adreno650", reference=True),
            _run(segs, name, "adreno650", reference=False),
        )


@pytest.mark.parametrize("granularity", ["kernel", "graph"])
@pytest.mark.parametrize("name", ["tmpc", "ztt"])
def test_per_graph_matches_per_kernel_at_a_forced_granularity(synthetic, name, granularity):
    segs = phone_segments(synthetic[True], SimGpu("mali-g76").profile)
    ref = _run(segs, name, "mali-g76", reference=True, granularity=granularity)
    _check(ref, _run(segs, name, "mali-g76", reference=False, granularity=granularity))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", CLOSED_LOOP)
def test_per_graph_matches_per_kernel_on_the_recorded_trace(gemma_10tok_segments, profile, name):
    segs = phone_segments(list(gemma_10tok_segments), SimGpu(profile).profile)
    ref = _run(segs, name, profile, reference=True)
    assert ref.granularity == "kernel"
    _check(ref, _run(segs, name, profile, reference=False))


def test_the_per_graph_path_runs_fewer_python_steps(synthetic, monkeypatch):
    # what makes it fast: the simulator runs batches, not one kernel per call
    segs = phone_segments(synthetic[True], SimGpu("adreno650").profile)
    calls = {"kernel": 0, "batch": 0}
    run_kernel, run_batch = SimGpu.run_kernel, SimGpu.run_batch

    def kernel(self, *a, **k):
        calls["kernel"] += 1
        return run_kernel(self, *a, **k)

    def batch(self, *a, **k):
        calls["batch"] += 1
        return run_batch(self, *a, **k)

    monkeypatch.setattr(SimGpu, "run_kernel", kernel)
    monkeypatch.setattr(SimGpu, "run_batch", batch)
    _run(segs, "tmpc", "adreno650", reference=True)
    per_kernel = dict(calls)
    calls.update(kernel=0, batch=0)
    _run(segs, "tmpc", "adreno650", reference=False)
    kernels = sum(1 for s in segs if s.kind == "kernel")
    assert per_kernel["batch"] == 0 and per_kernel["kernel"] > kernels / 2
    assert calls["kernel"] + calls["batch"] < per_kernel["kernel"] / 10


def test_bench_workers_give_the_same_figures_as_one_process(synthetic):
    segs = phone_segments(synthetic[True], SimGpu("adreno650").profile)
    out = {}
    for workers in (1, 2):
        cfg = BenchConfig(controllers=["default", "tmpc", "reactive", "phase"], workers=workers)
        results, intervals, acc = {}, {}, {}
        replay_all(cfg, segs, results, intervals, accounting=acc)
        out[workers] = (results, intervals, acc)
    (r1, i1, a1), (r2, i2, a2) = out[1], out[2]
    assert list(r1) == list(r2) == ["default", "tmpc", "reactive", "phase"]
    for name in r1:
        assert r1[name].energy_j == r2[name].energy_j and r1[name].tpot_ms == r2[name].tpot_ms
    assert sorted(i1) == sorted(i2) == ["default", "tmpc"]
    assert a1["max_rel_error_vs_replay"] == a2["max_rel_error_vs_replay"]


def test_short_accounting_batches_run_as_run_batch_does():
    # accounting._small_batch stands in for SimGpu.run_batch on a few kernels: the same
    # stops, splits and switch landings (one due at the very start of a kernel too)
    import numpy as np

    from turboinfer_llama.accounting import _small_batch

    rng = np.random.default_rng(7)
    levels = SimGpu("adreno650").frequencies_hz()
    for _ in range(300):
        n = int(rng.integers(1, 5))
        f = rng.uniform(1e5, 5e8, n)
        b = rng.uniform(1e3, 2e7, n)
        g = rng.integers(0, 3, n) * rng.integers(0, 40_000, n)
        hz = int(rng.choice(levels))
        lead_ns = int(rng.integers(0, 600_000))
        exact = rng.random() < 0.3  # the switch lands just as the batch begins
        if exact:
            g[0] = 0
        stop_ns = int(rng.integers(0, 3_000_000)) if rng.random() < 0.8 else None
        out = []
        for small in (False, True):
            dev = SimGpu("adreno650", governor=None)
            dev.run_kernel("x", 1e7, 1e5, phase="decode")
            dev.set_hz(hz)  # lands after the switch latency: maybe inside the batch
            if exact and dev.next_switch is not None:
                # a compute-bound kernel that ends right at the landing (not landed yet)
                p, now_hz = dev.profile, dev.current_hz()
                dur = dev.next_switch[0] - dev.now_ns()
                ops = dur * p.peak_ops_per_cycle * p.compute_efficiency * now_hz / 1e9
                dev.run_kernel("x", ops, 0.0, phase="decode")
                assert dev.next_switch is not None and dev.next_switch[0] == dev.now_ns()
            else:
                dev.run_kernel("x", 1e7 * lead_ns / 1e6, 1e3, phase="decode")
            stop = None if stop_ns is None else dev.now_ns() + stop_ns
            if small:
                r = _small_batch(dev, f, b, g, 0, n, "decode", stop)
            else:
                r = dev.run_batch(f, b, g, phase="decode", stop_at_ns=stop)
            out.append((r.n_done, r.gap_left_ns, r.work_left, dev.now_ns(), dev.current_hz()))
            out.append(dev.energy_j)
        a, ea, c, ec = out
        assert a[:3] == c[:3] and a[3] == c[3] and a[4] == c[4], (a, c)
        assert abs(ea - ec) <= 1e-12 * ea
