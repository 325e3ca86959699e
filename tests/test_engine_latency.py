"""Per-request TTFT and TPOT (``engine.latency``)."""

from __future__ import annotations

import math

from turboinfer_llama.engine.events import Event, EventKind
from turboinfer_llama.engine.latency import (
    RequestLatency,
    per_request,
    per_request_of_events,
    pooled_ms,
)


def test_each_request_is_figured_from_its_own_tokens_in_request_order():
    token_ns = {1: [1_000, 1_400, 2_000], 0: [500, 600], 2: [90], 3: []}
    begin_ns = {0: 100, 1: 900, 2: 50, 3: 10}
    got = per_request(token_ns, begin_ns)
    assert got[0] == RequestLatency(2, 400, 100) and got[0].tpot_ns == 100.0
    assert got[1] == RequestLatency(3, 100, 1_000) and got[1].tpot_ns == 500.0
    assert got[2] == RequestLatency(1, 40, 0) and math.isnan(got[2].tpot_ns)
    assert len(got) == 3  # a request with no token has no latency


def test_the_run_pools_ttft_over_requests_and_tpot_over_every_gap():
    reqs = (RequestLatency(2, 4_000_000, 1_000_000), RequestLatency(3, 2_000_000, 5_000_000))
    ttft_ms, tpot_ms = pooled_ms(reqs)
    assert ttft_ms == 3.0
    assert tpot_ms == 2.0  # 6 ms over 3 gaps, not the mean of the requests' 1 and 2.5
    one = pooled_ms((RequestLatency(1, 1_000_000, 0),))
    assert one[0] == 1.0 and math.isnan(one[1])
    assert all(math.isnan(x) for x in pooled_ms(()))


def test_a_request_with_no_begin_is_left_out():
    assert per_request({0: [5, 6]}, {}) == ()


def test_live_events_split_into_requests_at_each_begin():
    def ev(kind: EventKind, t_ns: int) -> Event:
        return Event(kind, t_ns)

    events = [
        ev(EventKind.TOKEN, 1),  # before any request: not counted
        ev(EventKind.REQUEST_BEGIN, 10),
        ev(EventKind.DECODE_BEGIN, 12),
        ev(EventKind.TOKEN, 30),
        ev(EventKind.TOKEN, 40),
        ev(EventKind.TOKEN, 60),
        ev(EventKind.REQUEST_BEGIN, 100),
        ev(EventKind.TOKEN, 125),
    ]
    first, second = per_request_of_events(events)
    assert first == RequestLatency(3, 20, 30) and first.tpot_ns == 15.0
    assert second == RequestLatency(1, 25, 0) and math.isnan(second.tpot_ns)
