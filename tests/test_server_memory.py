"""Bounded memory for a long-running server: the timeline keeps a window (a number of
events, or a duration), totals keep counting, and segments that accounting has not
settled are never dropped. ``record()``/``export_trace()`` cover the retained window
and say so in their metadata."""

from __future__ import annotations

import json

import pytest

from turboinfer_llama import Llama
from turboinfer_llama.engine.events import Event, EventKind
from turboinfer_llama.engine.timeline import Timeline

NODES = 20  # nodes per synthetic graph


def _request(t_ns: int, tokens: int, graph0: int) -> list[Event]:
    """One request of ``tokens`` decode steps, 1 us apart."""
    out = [Event(EventKind.REQUEST_BEGIN, t_ns, n_tokens=4)]
    t = t_ns
    for k in range(tokens):
        g = graph0 + k
        t += 1000
        out.append(Event(EventKind.DECODE_BEGIN, t, graph=g, n_tokens=1))
        for n in range(NODES):
            t += 1000
            out.append(Event(EventKind.NODE_ASK, t, graph=g, node=n, op="MUL_MAT"))
        t += 1000
        out.append(Event(EventKind.DECODE_END, t, graph=g))
        t += 1000
        out.append(Event(EventKind.TOKEN, t, token=k))
    out.append(Event(EventKind.REQUEST_END, t + 1000, n_tokens=tokens))
    return out


def _requests(n: int, tokens: int = 10) -> list[Event]:
    events: list[Event] = []
    for r in range(n):
        events += _request(r * 10**9, tokens, r * tokens)
    return events


def test_count_window_keeps_totals():
    events = _requests(20)
    full = Timeline.from_events(events)
    tl = Timeline(max_events=500)
    for i in range(0, len(events), 37):
        tl.extend(events[i : i + 37])
    assert len(tl) == 500 and len(tl.segments()) <= 500
    assert tl.events() == events[-500:]
    assert tl.dropped == len(events) - 500
    assert tl.total_events == len(events) == full.total_events
    assert tl.totals() == full.totals()  # counters cover everything, not the window
    assert tl.total_segments == full.total_segments
    assert tl.segments() == full.segments()[-len(tl.segments()) :]
    w = tl.window()
    assert w["complete"] is False and w["events"] == 500
    assert full.window()["complete"] is True


def test_duration_window():
    events = _requests(5)  # requests 1 s apart
    tl = Timeline(max_events=None, window_ns=1_500_000_000)
    tl.extend(events)
    newest = events[-1].t_ns
    kept = tl.events()
    assert kept and all(e.t_ns >= newest - 1_500_000_000 for e in kept)
    assert len(kept) < len(events) and tl.dropped == len(events) - len(kept)
    assert {s.request for s in tl.segments() if s.kind == "kernel"} <= {3, 4}


def test_unsettled_segments_are_never_dropped():
    events = _requests(20)
    tl = Timeline(max_events=300, hold_unsettled=True)
    tl.extend(events)
    assert len(tl) == 300  # events still follow the window
    assert len(tl.segments()) == tl.total_segments == tl.unsettled > 300
    tl.mark_settled(tl.total_segments // 2)
    held = tl.segments()
    assert len(held) == tl.total_segments - tl.total_segments // 2 == tl.unsettled
    tl.mark_settled(tl.total_segments)
    assert len(tl.segments()) == 300 and tl.unsettled == 0
    with pytest.raises(ValueError):
        Timeline(max_events=0)


def test_session_window_settles_then_shrinks(tiny_gguf, tmp_path):
    cap = 400
    with Llama(
        model_path=str(tiny_gguf),
        n_ctx=256,
        verbose=False,
        power={"device": "sim", "timeline_max_events": cap},
    ) as llm:
        power = llm.power
        assert power is not None
        power.SETTLE_QUIET_NS = 3600 * 10**9  # hold the worker off
        for i in range(4):
            llm.create_completion(f"hello {i}", max_tokens=16, temperature=0.0)
        st = power.stats(settle=False)
        total = st["events"]
        win = st["timeline"]
        assert win["events"] <= cap
        # Nothing settled yet: whatever the worker derived is held.
        assert win["segments"] == win["total_segments"] - win["segments_dropped"]
        assert win["segments_dropped"] == 0
        st = power.stats()  # settles synchronously (the library call, not the server)
        win = st["timeline"]
        assert win["unsettled_segments"] == 0
        assert win["events"] <= cap and win["segments"] <= cap
        assert win["events_dropped"] > 0 and win["complete"] is False
        assert sum(st["events"].values()) == win["total_events"] >= sum(total.values())
        assert st["energy"]["accounting"]["settled"] is True
        path = power.record(tmp_path / "rec.json")
        with open(path) as f:
            doc = json.load(f)
        assert len(doc["events"]) == win["events"]
        assert doc["meta"]["window"]["complete"] is False
        assert doc["meta"]["window"]["events_dropped"] == win["events_dropped"]
