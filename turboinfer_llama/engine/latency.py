"""Each request's own TTFT and TPOT, beside the run's pooled figures.

A run's mean TTFT and TPOT can hide where a controller spends its latency: on sim
mali-g76 (at the benchmark's timer phase, see ``bench.default_phases``) the default
governor stays at its 260 MHz initial level through the whole first request, and
tmpc's first request came out 21% under the default's TPOT while the later ones sat
0.3-1.7% over it (stop 37, gemma recording, 2%; simulated). One definition serves
the replay, the accounting and live runs, so their per-request figures compare.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from .events import Event, EventKind


class RequestLatency(NamedTuple):
    """One request's tokens, time to its first token and the sum of the gaps between
    its tokens (ns)."""

    tokens: int
    ttft_ns: int
    gaps_ns: int

    @property
    def tpot_ns(self) -> float:
        """The mean gap between its tokens (ns; NaN with a single token)."""
        return self.gaps_ns / (self.tokens - 1) if self.tokens > 1 else float("nan")


def per_request(
    token_ns: Mapping[int, Sequence[int]], begin_ns: Mapping[int, int]
) -> tuple[RequestLatency, ...]:
    """Requests in order of their index, each with at least one token and a begin."""
    out = []
    for req in sorted(token_ns):
        times = token_ns[req]
        if not times or req not in begin_ns:
            continue
        gaps = sum(y - x for x, y in itertools.pairwise(times))
        out.append(RequestLatency(len(times), int(times[0] - begin_ns[req]), int(gaps)))
    return tuple(out)


def pooled_ms(requests: Sequence[RequestLatency]) -> tuple[float, float]:
    """The run's TTFT (mean over requests) and TPOT (mean over every gap between two
    tokens of a request), in ms; NaN where there is none."""
    n_gaps = sum(q.tokens - 1 for q in requests)
    ttft = sum(q.ttft_ns for q in requests) / len(requests) / 1e6 if requests else float("nan")
    tpot = sum(q.gaps_ns for q in requests) / n_gaps / 1e6 if n_gaps else float("nan")
    return ttft, tpot


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
