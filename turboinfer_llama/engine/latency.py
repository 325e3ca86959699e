"""Each request's own TTFT and TPOT, beside the run's pooled figures.

A run's mean TTFT and TPOT can hide where a controller spends its latency: on sim
mali-g76 the default governor stays at its 260 MHz initial level through the whole
first request, and tmpc's first request came out 21% under the default's TPOT while
the later ones sat 0.3-1.7% over it (stop 37, gemma recording). One definition serves
the replay, the accounting and live runs, so their per-request figures compare.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from .events import Event, EventKind


class RequestLatency(NamedTuple):
    """One request's tokens, time to its first token (ns) and mean gap between its
    tokens (ns; NaN with a single token)."""

    tokens: int
    ttft_ns: int
    tpot_ns: float


def per_request(
    token_ns: Mapping[int, Sequence[int]], begin_ns: Mapping[int, int]
) -> tuple[RequestLatency, ...]:
    """Requests in order of their index, each with at least one token and a begin."""
    out = []
    for req in sorted(token_ns):
        times = token_ns[req]
        if not times or req not in begin_ns:
            continue
        gaps = [y - x for x, y in itertools.pairwise(times)]
        tpot = sum(gaps) / len(gaps) if gaps else float("nan")
        out.append(RequestLatency(len(times), int(times[0] - begin_ns[req]), tpot))
    return tuple(out)


def per_request_of_events(events: Iterable[Event]) -> tuple[RequestLatency, ...]:
    """:func:`per_request` of a live run's events: a request is a REQUEST_BEGIN and the
    TOKEN events up to the next one."""
    token_ns: dict[int, list[int]] = {}
    begin_ns: dict[int, int] = {}
    req = -1
    for e in events:
        if e.kind is EventKind.REQUEST_BEGIN:
            req += 1
            begin_ns[req] = e.t_ns
            token_ns[req] = []
        elif e.kind is EventKind.TOKEN and req >= 0:
            token_ns[req].append(e.t_ns)
    return per_request(token_ns, begin_ns)
