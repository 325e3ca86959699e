"""Node records as arrays (``NodeBlock``, ``Timeline.extend_block``) against the
per-event path (``decode_raw`` events, ``Timeline(reference=True)``): the same segments,
events, totals and window, on synthetic streams (every granularity, cut anywhere, with
window eviction), on a real recording, and on a live gemma run through the native hook;
and the accounting's store fed arrays (``SegmentStore.extend_columns``) holding what it
holds when fed the objects."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import numpy as np
import pytest
from test_timeline_fast import _state, _synthetic

from turboinfer_llama.engine.blocks import NodeBlock, NodeTable
from turboinfer_llama.engine.events import Event, EventKind
from turboinfer_llama.engine.segment_store import SegmentColumns, SegmentStore
from turboinfer_llama.engine.timeline import Timeline, expand
from turboinfer_llama.trace.record import load_trace

K = EventKind
NODE_KINDS = (K.NODE_ASK, K.NODE_DONE)


class _Blocks:
    """Node events to ``NodeBlock``s over one table (as a hook's decoder builds them)."""

    def __init__(self) -> None:
        self.table = NodeTable()
        self._codes: dict[tuple, int] = {}
        self._last: np.ndarray | None = None

    def block(self, events: list[Event]) -> NodeBlock:
        codes = []
        for e in events:
            key = (e.op, e.name, e.layer, id(e.shape))
            c = self._codes.get(key)
            if c is None:
                c = self._codes[key] = self.table.add(e.op, e.name, e.layer, e.shape)
            codes.append(c)
        code = np.asarray(codes, dtype=np.int64)
        if self._last is not None and np.array_equal(code, self._last):
            code = self._last  # the same array while the nodes repeat, as the decoder
        self._last = code
        return NodeBlock(
            np.asarray([e.t_ns for e in events], dtype=np.int64),
            np.asarray([e.graph for e in events], dtype=np.int64),
            np.asarray([e.node for e in events], dtype=np.int64),
            np.asarray([e.kind is K.NODE_DONE for e in events], dtype=bool),
            code,
            self.table,
        )


def _feed(tl: Timeline, events: list[Event], rng: random.Random | None = None) -> list:
    """Node records as blocks (runs of them, cut at random when ``rng``), the rest as
    events; returns what ``extend_lazy`` derived."""
    blocks = _Blocks()
    out: list = []
    i = 0
    while i < len(events):
        j = i
        if events[i].kind in NODE_KINDS:
            while j < len(events) and events[j].kind in NODE_KINDS:
                j += 1
            run = events[i:j]
            step = len(run) if rng is None else rng.choice([1, 3, 50, len(run)])
            for k in range(0, len(run), step):
                tl.extend_block(blocks.block(run[k : k + step]))
        else:
            j = i + 1
            out += tl.extend_lazy(events[i:j])
        i = j
    return out


def _same(a: Timeline, b: Timeline) -> None:
    sa, sb = _state(a), _state(b)
    for x, y in zip(sa, sb, strict=True):
        assert x == y
    assert all(x.shape is y.shape for x, y in zip(sa[0], sb[0], strict=True))


@pytest.mark.parametrize("granularity", ["kernel", "layer", "graph", "mixed"])
@pytest.mark.parametrize("seed", range(6))
def test_blocks_derive_what_events_derive(granularity, seed):
    events = _synthetic(seed, granularity)
    ref = Timeline.from_events(events, reference=True)
    tl = Timeline(max_events=None)
    got = _feed(tl, events, random.Random(seed))
    assert any(isinstance(x, SegmentColumns) for x in got)
    assert expand(got) == ref.segments()
    _same(tl, ref)


@pytest.mark.parametrize(
    ("max_events", "window_ns"), [(50, None), (None, 60_000), (300, 200_000), (1, None)]
)
@pytest.mark.parametrize("granularity", ["kernel", "graph"])
def test_blocks_evict_the_same_window(max_events, window_ns, granularity):
    events = _synthetic(3, granularity)
    ref = Timeline(max_events=max_events, window_ns=window_ns, reference=True)
    tl = Timeline(max_events=max_events, window_ns=window_ns)
    rng = random.Random(7)
    for k in range(0, len(events), 13):
        ref.extend(events[k : k + 13])
    _feed(tl, events, rng)
    # eviction runs at every extend: compare at the end, and the drop counters
    assert tl.dropped == ref.dropped > 0 and tl.segments_dropped == ref.segments_dropped > 0
    _same(tl, ref)


@pytest.mark.parametrize("max_events", [None, 4, 7])
def test_the_window_boundary_is_the_same(max_events):
    """Records exactly at the window's edge stay; older ones leave (by count too)."""
    kw = dict(op="ADD", name="a-0", layer=0)
    events = [Event(K.REQUEST_BEGIN, 0), Event(K.DECODE_BEGIN, 0, graph=1)]
    events += [Event(K.NODE_ASK, t, graph=1, node=i, **kw) for i, t in enumerate(range(0, 250, 50))]
    events += [Event(K.DECODE_END, 200, graph=1)]  # the window: from 100 on
    ref = Timeline(max_events=max_events, window_ns=100, reference=True)
    tl = Timeline(max_events=max_events, window_ns=100)
    for e in events:
        ref.extend([e])
    _feed(tl, events)
    assert tl.dropped == ref.dropped > 0
    _same(tl, ref)
    assert tl.events()[0].t_ns == 100


def test_a_real_recording_as_blocks_derives_the_same(tmp_path):
    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    events, _ = load_trace(path)
    ref = Timeline.from_events(events, reference=True)
    tl = Timeline(max_events=None)
    got = _feed(tl, events)
    assert expand(got) == ref.segments()
    _same(tl, ref)
    assert tl.kernel_count > 1000


def test_the_store_fed_arrays_holds_what_it_holds_fed_objects(tmp_path):
    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    events, _ = load_trace(path)
    got = _feed(Timeline(max_events=None), events)
    objects, arrays = SegmentStore(block_rows=1000), SegmentStore(block_rows=1000)
    for x in got:
        segs = x.segments() if isinstance(x, SegmentColumns) else [x]
        objects.extend(segs)
        if isinstance(x, SegmentColumns):
            arrays.extend_columns(x)
        else:
            arrays.extend([x])
    assert arrays.end == objects.end > 1000
    a, b = arrays.columns(0, arrays.end), objects.columns(0, objects.end)
    for f in ("t_ns", "dur_ns", "request", "token", "graph", "node", "layer", "meta"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.table == b.table
    assert arrays.segments(0, arrays.end) == objects.segments(0, objects.end)
    # after a drop to empty, the table starts over and arrays translate afresh
    arrays.drop_before(arrays.end)
    objects.drop_before(objects.end)
    last = next(x for x in reversed(got) if isinstance(x, SegmentColumns))
    arrays.extend_columns(last)
    objects.extend(last.segments())
    assert arrays.segments(arrays.start, arrays.end) == objects.segments(objects.start, objects.end)
    assert arrays.table_size == objects.table_size


@pytest.mark.parametrize("granularity", ["graph", "layer", "kernel"])
def test_a_live_run_derives_the_same_as_the_per_record_decoder(gemma_gguf, granularity):
    """The hook's own records from a short live run: the session derives them as arrays;
    the per-record decoder (``decode_raw``) and the per-event timeline give the same
    events, segments, totals and simulated figures."""
    from turboinfer_llama import Llama
    from turboinfer_llama.engine.hooks import NATIVE_AVAILABLE

    if not NATIVE_AVAILABLE:
        pytest.skip("the native hook was not built")
    llm = Llama(
        model_path=str(gemma_gguf),
        n_ctx=256,
        verbose=False,
        power={"granularity": granularity, "device": "sim", "controller": "tmpc"},
    )
    try:
        power = llm.power
        items: list = []
        push = power._push

        def keep(item, n_records=0):
            items.append(item.copy() if isinstance(item, np.ndarray) else item)
            push(item, n_records)

        power._push = keep  # type: ignore[method-assign]
        published: list = []
        power.add_segment_sink(published.extend)
        for prompt in ("The lighthouse keeper", "Once upon a time"):
            llm(prompt, max_tokens=6, temperature=0.0)
        tl = power.timeline
        ref = Timeline(tl.max_events, reference=True)
        for item in items:
            if isinstance(item, Event):
                ref.extend([item])
            else:
                ref.extend(power.hook.decode_raw(item))
        assert any(isinstance(x, np.ndarray) and len(x) for x in items)
        assert tl.kernel_count > 500
        assert published == ref.segments() == tl.segments()
        st_a, st_b = _state(tl), _state(ref)
        for x, y in zip(st_a, st_b, strict=True):
            assert x == y
        stats = power.stats()
        assert stats["energy"]["accounting"]["settled"]
    finally:
        llm.close()


def test_odd_graphs_derive_the_same():
    """A node done twice (the last DONE counts), a DONE of a node never asked, a graph
    of DONE records only, and node records outside any graph."""
    ev = Event
    events = [
        ev(K.NODE_ASK, 5, graph=9, node=0, op="ADD"),  # outside a graph
        ev(K.REQUEST_BEGIN, 10, n_tokens=3),
        ev(K.DECODE_BEGIN, 20, graph=1, n_tokens=3),
        ev(K.NODE_ASK, 30, graph=1, node=0, op="MUL_MAT", name="a-0", layer=0),
        ev(K.NODE_DONE, 40, graph=1, node=0, op="MUL_MAT", name="a-0", layer=0),
        ev(K.NODE_ASK, 45, graph=1, node=1, op="ADD", name="b-0", layer=0),
        ev(K.NODE_ASK, 50, graph=1, node=2, op="ADD", name="c-0", layer=0),
        ev(K.NODE_DONE, 70, graph=1, node=2, op="ADD", name="c-0", layer=0),
        ev(K.NODE_DONE, 90, graph=1, node=2, op="ADD", name="c-0", layer=0),
        ev(K.NODE_DONE, 95, graph=1, node=7, op="ADD", name="x-0", layer=0),
        ev(K.NODE_ASK, 99, graph=1, node=3, op="ADD", name="d-0", layer=0),
        ev(K.NODE_ASK, 99, graph=1, node=4, op="MUL_MAT", name="e-0", layer=0),
        ev(K.DECODE_END, 120, graph=1),
        ev(K.TOKEN, 130, token=0),
        ev(K.DECODE_BEGIN, 140, graph=2, n_tokens=1),
        ev(K.NODE_DONE, 150, graph=2, node=0, op="ADD", name="a-0", layer=0),
        ev(K.DECODE_END, 160, graph=2),
        ev(K.REQUEST_END, 170),
    ]
    ref = Timeline.from_events(events, reference=True)
    tl = Timeline(max_events=None)
    got = _feed(tl, events)
    assert expand(got) == ref.segments()
    _same(tl, ref)
    durs = [s.dur_ns for s in ref.segments() if s.kind == "kernel"]
    assert durs[0] == 10 and durs[1] + durs[2] == 90 - 45  # node 2's last DONE: 90


def test_a_trace_saved_gzipped_loads_the_same(tmp_path):
    """A trace path ending in .gz is written gzipped (the same bytes for the same
    events) and read back whatever its name."""
    from turboinfer_llama.trace.record import save_trace

    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        (tmp_path / "trace.json").write_bytes(f.read())
    events, meta = load_trace(tmp_path / "trace.json")
    a = save_trace(tmp_path / "a.json.gz", events, meta)
    b = save_trace(tmp_path / "b.json.gz", events, meta)
    assert a.read_bytes()[:2] == b"\x1f\x8b"
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size < (tmp_path / "trace.json").stat().st_size / 5
    renamed = tmp_path / "plain-name.json"
    renamed.write_bytes(a.read_bytes())
    for p in (a, renamed):
        got, got_meta = load_trace(p)
        assert got_meta == meta
        assert [e.to_json() for e in got] == [e.to_json() for e in events]
