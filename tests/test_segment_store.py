"""The accounting's backlog as arrays (``engine.segment_store``, issue 14's memory bound):
segments come back equal field by field; settling from the arrays gives the figures
of settling the Segment objects themselves, to the bit; and a backlog holds no
Segment objects (a backlog of small objects fragmented pymalloc's arenas for good)."""

from __future__ import annotations

import dataclasses
import gc
import random

import numpy as np
import pytest
from test_accounting import _issued_across

from turboinfer_llama import Llama
from turboinfer_llama.devices.sim import SimGpu, load_profile
from turboinfer_llama.engine.events import StallKind
from turboinfer_llama.engine.segment_store import SegmentStore
from turboinfer_llama.engine.segments import Segment
from turboinfer_llama.live import SimulatedAccount
from turboinfer_llama.settings import PowerSettings

REQUESTS = 3
IDLE_NS = 40_000_000


def _split_requests(segments: list[Segment]) -> list[list[Segment]]:
    """The former ``live._split_requests`` (on objects): split at idle stalls, each
    part keeping its leading idle gap."""
    parts: list[list[Segment]] = [[]]
    for s in segments:
        if s.stall is StallKind.IDLE and parts[-1]:
            parts.append([])
        parts[-1].append(s)
    return [p for p in parts if p]


@pytest.fixture(scope="module")
def runs(gemma_10tok_segments) -> list[Segment]:
    """The recorded gemma request three times in a row, an idle stall before the 2nd
    and the 3rd (as the timeline derives one between requests)."""
    raw = list(gemma_10tok_segments)
    t0 = raw[0].t_ns
    span = raw[-1].t_ns + raw[-1].dur_ns - t0
    out: list[Segment] = []
    for r in range(REQUESTS):
        shift = r * (span + IDLE_NS)
        if r:
            out.append(Segment("stall", t0 + shift - IDLE_NS, IDLE_NS, "idle", StallKind.IDLE, r))
        for s in raw:
            req = r if s.request >= 0 else s.request
            out.append(dataclasses.replace(s, t_ns=s.t_ns + shift, request=req))
    return out


def _account() -> SimulatedAccount:
    settings = PowerSettings(device="sim:adreno650", controller="tmpc", native_hooks=False)
    return SimulatedAccount(settings, SimGpu("adreno650"), replay_check=False)


def test_round_trip_keeps_every_field_and_object(runs):
    store = SegmentStore(block_rows=1000)  # several blocks, ranges across them
    for i in range(0, len(runs), 777):
        store.extend(runs[i : i + 777])
    assert len(store) == len(runs) and store.end == len(runs)
    lo, hi = 123, len(runs) - 456
    back = store.segments(lo, hi)
    assert back == runs[lo:hi]
    for a, b in zip(back, runs[lo:hi], strict=True):
        assert a.shape is b.shape and a.stall is b.stall and type(a.t_ns) is int
    store.drop_before(2500)
    assert store.start == 2500 and len(store._blocks) == -(-len(runs) // 1000) - 2
    assert store.segments(2500, 2600) == runs[2500:2600]
    with pytest.raises(IndexError):
        store.segments(2499, 2600)
    store.drop_before(len(runs))
    assert len(store) == 0 and store.nbytes == 0 and store.table_size == 0
    store.extend(runs[:10])  # absolute indices go on
    assert store.segments(len(runs), len(runs) + 10) == runs[:10]


def test_a_number_that_is_not_an_integer_is_refused(runs):
    store = SegmentStore()
    with pytest.raises(TypeError):
        store.extend([dataclasses.replace(runs[0], dur_ns=1.5)])  # type: ignore[arg-type]


def _settle_objects(acct: SimulatedAccount, segments: list[Segment]) -> None:
    """The former flush, on the Segment objects."""
    acct.received = len(segments)
    parts = _split_requests(segments)
    for i, part in enumerate(parts):
        if any(s.kind == "kernel" for s in part):
            nxt = parts[i + 1][0].t_ns if i + 1 < len(parts) else None
            end = part[-1].t_ns + max(part[-1].dur_ns, 0) if nxt is None else nxt
            acct._settle_one(part, acct._issued_until(end), None)
    acct.settled_upto = len(segments)


@pytest.mark.parametrize("stop_after", [None, 1])
def test_settling_from_the_arrays_is_settling_the_objects(runs, stop_after):
    p = load_profile("adreno650")
    issued = _issued_across(runs, p, 90, seed=5)
    got, ref = _account(), _account()
    rec_got: list[dict] = []
    rec_ref: list[dict] = []
    try:
        for acct, sink in ((got, rec_got), (ref, rec_ref)):
            levels = acct.loop.levels_hz
            acct.loop.applied_log.extend((t, levels.index(hz)) for t, hz in issued)
            acct.add_settled_sink(sink.append)
        for i in range(0, len(runs), 500):  # as the timeline hands them over
            got.add(runs[i : i + 500])
        got.request_done()
        if stop_after is not None:  # a request starts: the rest waits, then resumes
            asked = iter(range(10**6))
            assert got.flush(stop=lambda: next(asked) >= stop_after) is False
            assert len(rec_got) == stop_after and got.unsettled_segments > 0
        assert got.flush()
        _settle_objects(ref, runs)
        a, b = got.summary(settle=False), ref.summary(settle=False)
    finally:
        got.close(settle=False)
        ref.close(settle=False)
    assert len(rec_got) == REQUESTS and rec_got == rec_ref  # every figure, exactly
    for k in ("energy_j", "default_energy_j", "tokens", "switches", "virtual_time_s"):
        assert a[k] == b[k], k
    assert a["accounting"]["unsettled_segments"] == 0
    assert a["accounting"]["switches_issued"] == len(issued)
    assert len(got._store) == 0 and got._store.nbytes == 0


def _live_segments() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Segment)


def test_the_backlog_holds_no_segment_objects(runs):
    acct = _account()
    try:
        before = _live_segments()
        for i in range(0, len(runs), 500):
            acct.add([dataclasses.replace(s) for s in runs[i : i + 500]])  # new objects
        acct.request_done()
        assert acct.unsettled_segments == len(runs)
        assert _live_segments() == before  # the backlog: arrays, not objects
        assert acct._store.nbytes < 100 * len(runs) + 2 * acct._store.block_rows * 64
    finally:
        acct.close(settle=False)


def test_a_server_backlog_is_bounded_by_the_window_in_objects(tiny_gguf):
    """Segments a session has derived and not settled: held by the accounting as
    arrays; the Segment objects alive stay within the timeline's window."""
    cap = 300
    with Llama(
        model_path=str(tiny_gguf),
        n_ctx=256,
        verbose=False,
        power={"device": "sim", "timeline_max_events": cap},
    ) as llm:
        power = llm.power
        assert power is not None
        power.SETTLE_QUIET_NS = 3600 * 10**9  # hold the worker off: nothing settles
        before = _live_segments()
        for i in range(4):
            llm.create_completion(f"hello {i}", max_tokens=16, temperature=0.0)
        power.materialize()  # derive everything, settle nothing
        win = power.stats(settle=False)["timeline"]
        assert win["unsettled_segments"] == win["total_segments"] > 3 * cap
        assert win["segments"] <= cap
        assert _live_segments() - before <= cap + 64  # + a graph in the making
        st = power.stats()  # settles: the figures from the arrays
        assert st["timeline"]["unsettled_segments"] == 0
        assert st["energy"]["accounting"]["settled_requests"] == 4
        assert len(st["energy"]["recent_requests"]) == 4


def _same_trace(a, b) -> None:
    from turboinfer_llama.accounting import _Graph

    assert (a.profile_name, a.n_kernels, a.tokens) == (b.profile_name, b.n_kernels, b.tokens)
    assert a.request_begin == b.request_begin
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps, strict=True):
        assert type(x) is type(y)
        if isinstance(x, _Graph):
            assert (x.graph, x.phase, x.first_kernel) == (y.graph, y.phase, y.first_kernel)
            for f in ("flops", "bytes_", "gaps_ns", "node_ids", "layers"):
                u, v = getattr(x, f), getattr(y, f)
                assert u.dtype == v.dtype and np.array_equal(u, v), f
        else:
            assert x == y
    for f in ("_seg_t_ns", "_seg_dur_ns", "_seg_step", "_seg_at_step", "_seg_at_kernel"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def _random_segments(rng: random.Random, n: int) -> list[Segment]:
    """Every shape of run build walks: kernels of one graph split by inter-kernel
    stalls, graphs back to back, no-op kernels (alone too), stalls with and without a
    graph, idle stalls between requests, a stall without a kind, segments outside any
    request, untimed kernels."""
    ops = ["MUL_MAT", "ADD", "VIEW", "RESHAPE", "GET_ROWS"]
    kinds = [StallKind.SUBMIT, StallKind.INTER_KERNEL, StallKind.SAMPLE, StallKind.IDLE, None]
    out: list[Segment] = []
    t, graph, req = 1_000, 0, rng.choice([-1, 0])
    for _ in range(n):
        t += rng.randrange(1, 5000)
        dur = rng.randrange(0, 9000)
        r = rng.random()
        if r < 0.6:
            if rng.random() < 0.15:
                graph += 1
            out.append(
                Segment(
                    "kernel",
                    t,
                    dur,
                    rng.choice(["prefill", "decode"]),
                    None,
                    req,
                    rng.randrange(-1, 4),
                    graph,
                    rng.randrange(0, 400),
                    rng.randrange(-1, 3),
                    rng.choice(ops),
                    "n",
                    None,
                    rng.random() < 0.8,
                )
            )
        else:
            kind = rng.choices(kinds, weights=[3, 6, 3, 1, 0.3])[0]
            if kind is StallKind.IDLE:
                req = req + 1 if rng.random() < 0.9 else -1
            g = rng.choice([-1, -1, graph])
            out.append(Segment("stall", t, dur, "decode", kind, req, rng.randrange(-1, 4), g))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_build_from_the_arrays_is_build_from_the_objects(seed):
    from turboinfer_llama.accounting import PhoneTrace

    rng = random.Random(seed)
    segs = _random_segments(rng, rng.randrange(1, 400))
    store = SegmentStore(block_rows=64)
    store.extend(segs)
    p = load_profile(rng.choice(["adreno650", "mali-g76"]))
    paused: list[int] = []
    got = PhoneTrace.build_columns(store.columns(0, len(segs)), p, pause=lambda: paused.append(1))
    ref = PhoneTrace.build(segs, p)
    _same_trace(got, ref)
    assert len(paused) >= len(segs) // 256 - 1  # the settle worker's pause point
    for s in ref.steps:  # kernel_index from the steps, as build's dict
        if hasattr(s, "node_ids"):
            for node in s.node_ids.tolist():
                assert got.kernel_index(s.graph, node) == ref.kernel_index(s.graph, node)


def test_build_from_the_arrays_on_the_recording(runs):
    from turboinfer_llama.accounting import PhoneTrace

    store = SegmentStore()
    store.extend(runs)
    for name in ("adreno650", "mali-g76"):
        p = load_profile(name)
        _same_trace(
            PhoneTrace.build_columns(store.columns(0, len(runs)), p), PhoneTrace.build(runs, p)
        )
