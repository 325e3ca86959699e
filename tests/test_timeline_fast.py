"""The timeline's per-graph derivation (``Timeline.extend``) against its per-event
reference (``reference=True``): the same segments, in the same order, sharing the same
shape objects, and the same totals (key order included), on a real recording and on
synthetic streams that hit every branch (layer and graph granularity, a graph without
nodes, a node done before its ask, node records outside a graph, a stream cut into
pieces anywhere as a live producer appends it)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from turboinfer_llama.engine.events import Event, EventKind, NodeShape
from turboinfer_llama.engine.timeline import Timeline
from turboinfer_llama.trace.record import load_trace

K = EventKind
SHAPES = [
    NodeShape((64, 1, 1, 1), 0, (64, 64, 1, 1), 0, (64, 1, 1, 1), 0, 256),
    NodeShape((128, 4, 1, 1), 0, (128, 64, 1, 1), 1, (64, 4, 1, 1), 0, 2048),
    None,
]
OPS = ["MUL_MAT", "ADD", "RMS_NORM", "VIEW", "GET_ROWS"]


def _state(tl: Timeline) -> tuple:
    return (
        tl.segments(),
        list(tl.counts.items()),
        list(tl.stall_ns.items()),
        list(tl.stall_count.items()),
        tl.kernel_ns,
        tl.kernel_count,
        tl.totals(),
        tl.window(),
        tl.events(),
    )


def _same(a: Timeline, b: Timeline) -> None:
    sa, sb = _state(a), _state(b)
    assert sa == sb
    assert all(x.shape is y.shape for x, y in zip(sa[0], sb[0], strict=True))


def _synthetic(seed: int, granularity: str) -> list[Event]:
    """Requests of graphs; ``granularity``: which nodes get a DONE record."""
    rng = random.Random(seed)
    t = 1_000
    out: list[Event] = []
    graph = 0

    def ev(kind: EventKind, **kw: object) -> None:
        out.append(Event(kind, t, **kw))  # type: ignore[arg-type]

    ev(K.NODE_ASK, graph=99, node=0, op="ADD")  # outside any graph: ignored
    for _req in range(3):
        t += rng.randrange(0, 50_000)
        ev(K.REQUEST_BEGIN, n_tokens=5)
        ev(K.KV_EDIT, detail="reset")
        for tok in range(rng.randrange(1, 5)):
            prefill = tok == 0
            if prefill:
                ev(K.PREFILL_BEGIN, n_tokens=5)
            t += rng.choice([0, rng.randrange(1, 9_000)])
            graph += 1
            ev(K.DECODE_BEGIN, graph=graph, n_tokens=5 if prefill else 1)
            n_nodes = 0 if rng.random() < 0.1 else rng.randrange(1, 30)
            for node in range(n_nodes):
                t += rng.choice([0, rng.randrange(1, 3_000)])
                layer = node // 4
                op = rng.choice(OPS)
                kw = dict(graph=graph, node=node, op=op, name=f"n-{layer}", layer=layer)
                shape = rng.choice(SHAPES)
                ev(K.NODE_ASK, shape=shape, **kw)
                done = (
                    granularity == "kernel"
                    or (granularity == "layer" and node % 4 == 3)
                    or (granularity == "mixed" and rng.random() < 0.5)
                )
                if done:
                    dt = rng.randrange(-500, 20_000)  # a done before its ask: span 0
                    out.append(Event(K.NODE_DONE, t + dt, shape=shape, **kw))  # type: ignore[arg-type]
                    t += max(dt, 0)
            t += rng.randrange(0, 5_000)
            ev(K.DECODE_END, graph=graph)
            if prefill:
                ev(K.PREFILL_END)
            t += rng.randrange(0, 40_000)
            ev(K.SAMPLE_BEGIN)
            ev(K.SAMPLE_END)
            ev(K.TOKEN, token=tok)
        ev(K.REQUEST_END)
        ev(K.IDLE)
    ev(K.DECODE_END, graph=graph)  # no graph open: nothing
    return out


@pytest.mark.parametrize("granularity", ["kernel", "layer", "graph", "mixed"])
@pytest.mark.parametrize("seed", range(6))
def test_per_graph_derivation_equals_the_per_event_reference(granularity, seed):
    events = _synthetic(seed, granularity)
    _same(Timeline.from_events(events), Timeline.from_events(events, reference=True))


@pytest.mark.parametrize("seed", range(4))
def test_a_stream_cut_into_pieces_anywhere_derives_the_same(seed):
    events = _synthetic(seed, "mixed")
    rng = random.Random(seed)
    whole = Timeline(max_events=None, reference=True)
    whole.extend(events)
    fast = Timeline(max_events=None)
    ref = Timeline(max_events=None, reference=True)
    i = 0
    got_fast: list = []
    got_ref: list = []
    while i < len(events):
        j = min(len(events), i + rng.choice([1, 2, 7, 40]))
        piece = events[i:j]
        got_fast += fast.extend(iter(piece))  # any iterable, as a producer hands it
        got_ref += ref.extend(piece)
        i = j
    assert got_fast == got_ref == whole.segments()
    _same(fast, ref)
    _same(fast, whole)


def test_the_window_evicts_the_same_either_way():
    events = _synthetic(3, "kernel")
    a = Timeline(max_events=50)
    b = Timeline(max_events=50, reference=True)
    for k in range(0, len(events), 13):
        a.extend(events[k : k + 13])
        b.extend(events[k : k + 13])
    _same(a, b)
    assert a.dropped == b.dropped > 0 and a.segments_dropped == b.segments_dropped > 0


def test_a_real_recording_derives_the_same_segments(tmp_path):
    path = tmp_path / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    events, _ = load_trace(path)
    fast = Timeline.from_events(events)
    ref = Timeline.from_events(events, reference=True)
    _same(fast, ref)
    assert fast.kernel_count > 1000
