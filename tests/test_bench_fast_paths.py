"""The benchmark's faster paths against the code they replaced (kept here as the
reference) or the per-item path: ``accounting.phone_segments``, ``replay._blocks``,
``SimGpu``'s batch intervals, ``load_trace``; the pooled benchmark against the serial
one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from turboinfer_llama.accounting import _with_dur, phone_segments
from turboinfer_llama.control.replay import _Block, _blocks, with_graphs
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimProfile, load_profile
from turboinfer_llama.engine.events import StallKind
from turboinfer_llama.engine.graph import KernelCost, cost
from turboinfer_llama.engine.segments import Segment


def _phone_segments_reference(segments: Sequence[Segment], profile: SimProfile) -> list[Segment]:
    """``phone_segments`` as it was (one ``cost`` per kernel, a dict of gaps by id)."""
    out: list[Segment] = []
    segs = list(segments)
    i = 0
    n = len(segs)
    while i < n:
        s = segs[i]
        if s.kind == "stall":
            if s.stall is StallKind.INTER_KERNEL:
                i += 1
                continue
            if s.stall in (StallKind.SUBMIT, StallKind.SAMPLE):
                s = _with_dur(s, profile.scale_host_ns(s.dur_ns))
            out.append(s)
            i += 1
            continue
        j = i
        graph_kernels: list[Segment] = []
        while j < n and (
            (segs[j].kind == "kernel" and segs[j].graph == s.graph)
            or segs[j].stall is StallKind.INTER_KERNEL
        ):
            if segs[j].kind == "kernel":
                graph_kernels.append(segs[j])
            j += 1
        real = [k for k in graph_kernels if not cost(k.op, k.shape).is_noop]
        gaps = profile.host_gaps_ns(len(real))
        gap_of = {id(k): int(g) for k, g in zip(real, gaps, strict=True)}
        for k in graph_kernels:
            g = gap_of.get(id(k), 0)
            if g > 0:
                out.append(
                    Segment(
                        "stall",
                        k.t_ns,
                        g,
                        k.phase,
                        stall=StallKind.INTER_KERNEL,
                        request=k.request,
                        token=k.token,
                        graph=k.graph,
                    )
                )
            out.append(k)
        i = j
    return out


def _same(a: list[Segment], b: list[Segment]) -> None:
    assert a == b
    assert all(x is y for x, y in zip(a, b, strict=True) if x.kind == "kernel")


@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_phone_segments_equal_the_reference_on_a_real_recording(gemma_10tok_segments, profile):
    p = load_profile(profile)
    segs = list(gemma_10tok_segments)
    got = phone_segments(segs, p)
    _same(got, _phone_segments_reference(segs, p))
    assert sum(s.stall is StallKind.INTER_KERNEL for s in got) >= 10


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_phone_segments_equal_the_reference_on_synthetic_traces(seed, timing):
    p = load_profile("adreno650")
    segs = make_trace(seed=seed, kernel_timing=timing, requests=2, decode_tokens=4)
    _same(phone_segments(segs, p), _phone_segments_reference(segs, p))


def _record_span_reference(self, starts, gaps, durs, bytes_, hz, phase, w_idle, w_busy):
    """``SimGpu._record_span`` as the loop it replaced: ``_record`` per gap and kernel."""
    dram = self.profile.dram_energy_j_per_byte
    for k in range(len(starts)):
        self._record(starts[k], gaps[k], hz, "idle", phase, w_idle * gaps[k] * 1e-9)
        self._record(
            starts[k] + gaps[k],
            durs[k],
            hz,
            "busy",
            phase,
            w_busy * durs[k] * 1e-9 + bytes_[k] * dram,
        )


@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
@pytest.mark.parametrize("governed", [True, False])
def test_batch_intervals_equal_the_per_kernel_record_loop(
    gemma_10tok_segments, monkeypatch, profile, governed
):
    from turboinfer_llama.accounting import PhoneTrace, Switches, applied_energy, default_shadow
    from turboinfer_llama.devices.sim import SimGpu

    p = load_profile(profile)
    trace = PhoneTrace.build(phone_segments(list(gemma_10tok_segments), p), p, host_model=False)
    levels = p.levels_hz
    switches = Switches.at_times(
        [0, 2_000_000, 9_000_000, 30_000_000], [levels[-1], levels[1], levels[-2], levels[0]]
    )

    def run() -> SimGpu:
        dev = SimGpu(p, governor="default" if governed else None)
        dev.record_intervals = True
        if governed:
            default_shadow(trace, dev)
        else:
            applied_energy(trace, dev, switches)
        return dev

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(SimGpu, "_record_span", _record_span_reference)
        ref = run()
    assert fast.intervals == ref.intervals
    assert len(fast.intervals) > 100
    assert fast.energy_j == ref.energy_j


def test_load_trace_equals_event_from_json_and_shares_each_distinct_shape(tmp_path):
    import gzip
    import json
    from pathlib import Path

    from turboinfer_llama.engine.events import Event
    from turboinfer_llama.trace.record import load_trace

    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    raw = json.loads(path.read_text())["events"]
    events, _ = load_trace(path)
    assert events == [Event.from_json(d) for d in raw]
    by_value: dict = {}
    for e in events:
        if e.shape is not None:
            assert by_value.setdefault(e.shape, e.shape) is e.shape  # one object per value
    assert 10 < len(by_value) < len(events) // 10


def test_pooled_and_serial_benchmarks_agree_and_the_collector_is_restored(tmp_path):
    """The trace is built with the cyclic collector paused and frozen for the replays
    (forked workers never walk it); afterwards the collector is as it was, and the
    figures are those of the serial run."""
    import gc
    import gzip
    from pathlib import Path

    from turboinfer_llama.bench.runner import ALL_CONTROLLERS, BenchConfig, run_bench

    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    reports = []
    for workers in (1, 2):
        cfg = BenchConfig(
            controllers=list(ALL_CONTROLLERS), replay=str(path), timing=False, workers=workers
        )
        assert gc.isenabled() and gc.get_freeze_count() == 0
        out = run_bench(cfg, live=False)
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert not out.interrupted
        reports.append(out.report)
    assert reports[0] == reports[1]
    assert reports[0]["accounting"]["max_rel_error_vs_replay"]["energy"] < 1e-6


def test_the_reported_llama_cpp_version_is_the_module_s_loaded_or_not(monkeypatch):
    import sys

    import llama_cpp

    from turboinfer_llama.bench.runner import _llama_cpp_version

    assert _llama_cpp_version() == llama_cpp.__version__
    monkeypatch.delitem(sys.modules, "llama_cpp")  # as in a replay: never imported
    assert _llama_cpp_version() == llama_cpp.__version__


# ---- replay's per-graph blocks ----------------------------------------------------


def _blocks_reference(
    segments: Sequence[Segment], gran: str, submission_ns: int
) -> dict[int, tuple[_Block, int]]:
    """``replay._blocks`` as it was (a dict of lists per open block)."""
    costs: dict[tuple[str, int], KernelCost] = {}  # by (op, id(shape)): shapes are shared
    shapes: list[Any] = []  # keeps every keyed shape alive while the ids are keys
    per_graph: dict[int, int] = {}  # kernels of each graph seen so far (ordinals)
    out: dict[int, tuple[_Block, int]] = {}
    kernel_gran = gran == "kernel"
    cur: dict[str, Any] | None = None
    start = -1  # first segment of the pending item
    pend_gap = 0

    def close() -> None:
        nonlocal cur
        if cur is not None and cur["first"]:
            blk = _Block(
                cur["graph"],
                cur["phase"],
                cur["request"],
                cur["first"],
                cur["kseg"],
                np.asarray(cur["gap"], dtype=np.int64),
                np.asarray(cur["f"], dtype=np.float64),
                np.asarray(cur["b"], dtype=np.float64),
                np.asarray(cur["noop"], dtype=bool),
                np.asarray(cur["slow"], dtype=bool),
                np.asarray(cur["ord"], dtype=np.int64),
            )
            for j, s in enumerate(blk.first):
                out[s] = (blk, j)
        cur = None

    for i, s in enumerate(segments):
        if s.kind == "kernel":
            ordn = per_graph.get(s.graph, 0)
            per_graph[s.graph] = ordn + 1
            if cur is None or (cur["graph"], cur["phase"], cur["request"]) != (
                s.graph,
                s.phase,
                s.request,
            ):
                close()
                cur = {
                    "graph": s.graph,
                    "phase": s.phase,
                    "request": s.request,
                    **{k: [] for k in ("first", "kseg", "gap", "f", "b", "noop", "slow", "ord")},
                }
            key = (s.op, id(s.shape))
            c = costs.get(key)
            if c is None:
                c = costs[key] = cost(s.op, s.shape)
                shapes.append(s.shape)
            if not kernel_gran and c.is_noop:
                continue  # its stalls join the next launched kernel's gap
            gap = pend_gap + (0 if c.is_noop or (kernel_gran and s.timed) else submission_ns)
            cur["first"].append(start if start >= 0 else i)
            cur["kseg"].append(i)
            cur["gap"].append(gap)
            cur["f"].append(c.flops)
            cur["b"].append(c.bytes)
            cur["noop"].append(c.is_noop)
            cur["slow"].append(kernel_gran and ((c.is_noop and gap > 0) or not s.timed))
            cur["ord"].append(ordn)
            start, pend_gap = -1, 0
            continue
        if s.stall is StallKind.INTER_KERNEL and (
            cur is None or (cur["phase"], cur["request"]) == (s.phase, s.request)
        ):
            if start < 0:
                start = i
            pend_gap += int(s.dur_ns)
            continue
        close()
        start, pend_gap = -1, 0
    close()
    return out


def _same_blocks(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        (x, i), (y, j) = a[k], b[k]
        assert i == j
        for f in ("graph", "phase", "request", "first", "kseg"):
            assert getattr(x, f) == getattr(y, f)
        for f in ("gap", "f", "b", "noop", "slow", "ordinal", "real", "next_slow"):
            u, v = getattr(x, f), getattr(y, f)
            assert u.dtype == v.dtype and np.array_equal(u, v)


@pytest.mark.parametrize("gran", ["kernel", "graph"])
@pytest.mark.parametrize("submission_ns", [0, 4_000])
def test_blocks_equal_the_reference_on_a_real_recording(gemma_10tok_segments, gran, submission_ns):
    p = load_profile("adreno650")
    for segs in (list(gemma_10tok_segments), phone_segments(list(gemma_10tok_segments), p)):
        g = with_graphs(segs)
        got = _blocks(g, gran, submission_ns)
        assert len(got) > 100
        _same_blocks(got, _blocks_reference(g, gran, submission_ns))


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("gran", ["kernel", "graph"])
def test_blocks_equal_the_reference_on_synthetic_traces(timing, gran):
    segs = with_graphs(make_trace(seed=2, kernel_timing=timing, requests=2, decode_tokens=3))
    _same_blocks(_blocks(segs, gran, 3_000), _blocks_reference(segs, gran, 3_000))


def _device_state(dev) -> tuple:
    return (
        dev.now_ns(),
        dev.energy_j,
        dict(dev.energy_by_phase_j),
        dict(dev.time_by_phase_ns),
        dict(dev.gap_ns_by_kind),
        dev.busy_ns,
        dev.busy_cycles,
        dev.kernels,
        dev.switches,
        list(dev.switch_log),
        dev.dram_bytes,
        dev.dram_energy_j,
        dev._instructions,
        list(dev.intervals),
        dev.current_hz(),
        dev.governor_decisions,
    )


@pytest.mark.parametrize("noise", [0.0, 0.01])
@pytest.mark.parametrize("governor", [None, "default", "simple_ondemand"])
@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_small_spans_in_python_equal_the_numpy_span(monkeypatch, governor, profile, noise):
    """``SimGpu._small_span`` (a batch's last few kernels in Python numbers) against
    ``_bulk_span``'s numpy path: the same device state after random batches of 1-12
    kernels with stops, switches, long gaps, intervals and PMU noise."""
    import random

    from turboinfer_llama.devices import sim

    p = load_profile(profile)

    def run() -> tuple:
        rng = random.Random(7)
        dev = sim.SimGpu(p, governor=governor, pmu_noise=noise, seed=3)
        dev.record_intervals = True
        for step in range(400):
            n = rng.randint(1, 32)
            f = np.array([rng.choice([0.0, rng.uniform(1e3, 5e8)]) for _ in range(n)])
            b = np.array([rng.uniform(0, 2e7) for _ in range(n)])
            g = np.array(
                [
                    rng.choice(
                        [0, 0, rng.randint(1, 30_000), rng.randint(0, 3 * p.idle_timeout_ns)]
                    )
                    for _ in range(n)
                ],
                dtype=np.int64,
            )
            stop = dev.now_ns() + rng.randint(0, 400_000) if rng.random() < 0.4 else None
            if governor is None and rng.random() < 0.2:
                dev.set_hz(rng.choice(p.levels_hz))
            dev.run_batch(f, b, g, phase=rng.choice(["prefill", "decode"]), stop_at_ns=stop)
            if step % 50 == 0:
                dev.run_gap(rng.randint(0, 2 * p.idle_timeout_ns), kind="sample", phase="decode")
        return _device_state(dev)

    fast = run()
    monkeypatch.setattr(sim, "_SMALL_SPAN", 0)  # every span through numpy
    assert fast == run()
    assert fast[7] > 1000  # kernels run


def test_np_sum_adds_as_numpy_does_to_the_bit():
    from turboinfer_llama.devices.sim import _np_sum

    rng = np.random.default_rng(5)
    pool = rng.random(4000) * 10.0 ** rng.integers(-6, 14, 4000)
    for n in range(0, 200):
        for off in (0, 1, 3, 7):
            xs = pool[off : off + n]
            assert _np_sum(xs.tolist()) == float(xs.sum())


@pytest.mark.parametrize("share", [0.0, 0.3])
def test_drift_windows_in_python_equal_the_numpy_windows(gemma_10tok_segments, monkeypatch, share):
    """``accounting._drift_window`` (``drift_end``'s short windows in Python numbers)
    against its numpy lines: the oracle's schedule played to the same figures, with
    other apps' DRAM load the schedule did not plan for (the run drifts: windows hit)."""
    import dataclasses

    from turboinfer_llama import accounting
    from turboinfer_llama.control.factory import for_device, make_controller
    from turboinfer_llama.devices.sim import SimGpu

    p = load_profile("adreno650")
    segs = phone_segments(list(gemma_10tok_segments), p)
    oracle = make_controller(
        "oracle", **for_device(SimGpu(p)), trace=segs, device_factory=lambda: SimGpu(p)
    )
    schedule = oracle.plan_schedule()
    trace = accounting.PhoneTrace.build(segs, p, host_model=False)
    calls = {"n": 0}
    window = accounting._drift_window

    def counted(*a):
        calls["n"] += 1
        return window(*a)

    def run():
        acc = accounting.scheduled_energy(trace, p, schedule, background_share=share)
        return {k: v for k, v in dataclasses.asdict(acc).items() if k != "cpu_ms"}

    monkeypatch.setattr(accounting, "_drift_window", counted)
    fast = run()
    assert calls["n"] > 10
    monkeypatch.setattr(accounting, "DRIFT_PY_MAX", 0)  # every window through numpy
    assert run() == fast


def _drift_window_reference(p, hz, share, f, b, g, kns, t, t_start, offset, tol):
    """``drift_end``'s numpy lines for one window (kernels ``0..len(f)-1`` of it)."""
    dur = np.rint(p.kernel_ns_array(f, b, hz, share))
    reach = t + np.cumsum(g[:-1] + dur[:-1])
    off = reach - t_start - kns[1:]
    over = np.abs(off - offset) > tol
    if bool(over.any()):
        return int(np.argmax(over)), float(reach[int(np.argmax(over))])
    return -1, float(reach[-1])


@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_drift_window_equals_the_numpy_lines(profile):
    from turboinfer_llama.accounting import _drift_window

    p = load_profile(profile)
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(3000):
        n = int(rng.integers(2, 26))
        f = rng.random(n) * 10.0 ** rng.integers(2, 9, n)
        f[rng.random(n) < 0.2] = 0.0
        b = rng.random(n) * 10.0 ** rng.integers(2, 8, n)
        g = rng.integers(0, 20_000, n) * (rng.random(n) < 0.5)
        hz = int(rng.choice(p.levels_hz))
        share = float(rng.choice([1.0, 0.7, 1.0 - 0.3]))
        t = float(rng.integers(0, 10**12))
        t_start = int(rng.integers(0, 10**9))
        # predictions near the run's own times, off by up to a few tolerances
        durs = np.rint(p.kernel_ns_array(f, b, hz, share))
        truth = t + np.cumsum(g[:-1] + durs[:-1]) - t_start
        kns = np.concatenate(([0.0], truth + rng.normal(0, 3_000, n - 1)))
        offset = float(rng.normal(0, 500))
        ref = _drift_window_reference(p, hz, share, f, b, g, kns, t, t_start, offset, 2_000)
        got = _drift_window(
            p.kernel_ns_coefs(hz, share),
            f[:-1].tolist(),
            b[:-1].tolist(),
            g[:-1].tolist(),
            kns[1:].tolist(),
            t,
            t_start,
            offset,
            2_000,
        )
        assert got == ref
        hits += got[0] >= 0
    assert 300 < hits < 2900


def test_the_bench_replays_the_controllers_at_the_live_loops_granularity(tmp_path, monkeypatch):
    """A figure describes the loop a user runs: the causal controllers are replayed at
    ``PowerSettings``' default granularity unless another is asked for, and the JSON
    says which (the recording stays at kernel granularity)."""
    import gzip
    from pathlib import Path

    import turboinfer_llama.bench.runner as runner
    from turboinfer_llama.settings import PowerSettings

    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    seen: list[str] = []
    real = runner.replay

    def spy(*args, **kwargs):
        seen.append(kwargs["granularity"])
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "replay", spy)
    live = PowerSettings().granularity
    assert runner.BenchConfig().granularity == live == "graph"
    reports = {}
    for gran in (None, "kernel"):
        extra = {} if gran is None else {"granularity": gran}
        cfg = runner.BenchConfig(
            controllers=["default", "tmpc"], replay=str(path), timing=False, workers=1, **extra
        )
        seen.clear()
        reports[gran] = runner.run_bench(cfg, live=False).report
        assert seen == [gran or live]  # tmpc, replayed; default is accounted
        assert reports[gran]["granularity"] == (gran or live)
    # the two loops differ: at kernel granularity the executor also acts on completions
    assert reports[None]["controllers"]["tmpc"] != reports["kernel"]["controllers"]["tmpc"]
