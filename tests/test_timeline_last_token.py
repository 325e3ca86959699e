"""A request's last token is timed like every other one: the sampling after its last
graph (that graph's end to REQUEST_END) is a sample stall, so replay and the arrays
accounting count the token and TPOT covers the last graph. Before, that sampling fell
between segments: the last graph of each request was timed by no token, and the
oracle ran it at the bottom level for free (sim adreno640, gemma recording, 2% slack:
17 mJ a request, 0.5 point of its saving)."""

from __future__ import annotations

import pytest

from turboinfer_llama.engine.events import Event, EventKind, StallKind
from turboinfer_llama.engine.timeline import Timeline

K = EventKind


def _request(t0: int, graphs: int, *, last_token: bool) -> list[Event]:
    """One request: a prompt graph then ``graphs - 1`` decode graphs of two timed
    nodes each, each graph followed by its sampling and its token, but for the last
    graph where ``last_token`` is False (the request ends on it, no token: an end of
    sequence)."""
    out: list[Event] = []
    t = t0

    def ev(kind: EventKind, dt: int = 0, **kw: object) -> None:
        nonlocal t
        t += dt
        out.append(Event(kind, t, **kw))  # type: ignore[arg-type]

    ev(K.REQUEST_BEGIN, n_tokens=4)
    for g in range(graphs):
        if g == 0:
            ev(K.PREFILL_BEGIN, n_tokens=4)
        ev(K.DECODE_BEGIN, 50_000, graph=g + 1, n_tokens=4 if g == 0 else 1)
        for node in range(2):
            kw = dict(graph=g + 1, node=node, op="MUL_MAT", name=f"n{node}", layer=0)
            ev(K.NODE_ASK, 10_000, **kw)
            ev(K.NODE_DONE, 2_000_000, **kw)
        ev(K.DECODE_END, 20_000, graph=g + 1)
        if g == 0:
            ev(K.PREFILL_END)
        if g < graphs - 1 or last_token:
            ev(K.SAMPLE_BEGIN, 30_000)
            ev(K.SAMPLE_END, 400_000)
            ev(K.TOKEN, 5_000, token=g)
    ev(K.REQUEST_END, 70_000, n_tokens=graphs)
    ev(K.IDLE)
    return out


@pytest.mark.parametrize("reference", [False, True])
def test_the_sampling_after_a_requests_last_graph_is_a_sample_stall(reference) -> None:
    events = _request(1_000, 3, last_token=True) + _request(50_000_000, 2, last_token=True)
    segs = Timeline.from_events(events, reference=reference).segments()
    samples = [s for s in segs if s.stall is StallKind.SAMPLE]
    assert [(s.request, s.token) for s in samples] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    # each request's last: from its last kernel's end to REQUEST_END
    ends = [e.t_ns for e in events if e.kind is K.REQUEST_END]
    for req, end in enumerate(ends):
        last_kernel = max(
            s.t_ns + s.dur_ns for s in segs if s.kind == "kernel" and s.request == req
        )
        last = [s for s in samples if s.request == req][-1]
        assert (last.t_ns, last.t_ns + last.dur_ns) == (last_kernel, end)
    # and the idle gap between the requests starts where it ended
    idle = [s for s in segs if s.stall is StallKind.IDLE]
    assert [(s.t_ns, s.t_ns + s.dur_ns) for s in idle] == [(ends[0], _begin(events, 1))]


def _begin(events: list[Event], request: int) -> int:
    return [e.t_ns for e in events if e.kind is K.REQUEST_BEGIN][request]


@pytest.mark.parametrize("reference", [False, True])
def test_a_request_that_ends_with_no_token_after_its_last_graph_has_no_last_sample(
    reference,
) -> None:
    events = _request(1_000, 3, last_token=False)
    segs = Timeline.from_events(events, reference=reference).segments()
    samples = [s for s in segs if s.stall is StallKind.SAMPLE]
    assert [s.token for s in samples] == [0, 1]  # the sampling after graphs 1 and 2 only
