"""How closely two switch logs agree: the live loop's against a replay of its recording.

A switch is (graph, level, time since that graph's DECODE_BEGIN). Two logs are walked
in order; a switch matches when the other log's next unmatched switch of the same
graph has the same level and lands within ``tolerance_ns`` (one switch latency) of
it -- or, for node-keyed switches, at the same node ordinal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .plan import Applied


@dataclass(frozen=True)
class SwitchAgreement:
    matched: int
    live: int
    replay: int

    @property
    def fraction(self) -> float:
        """Matched switches over the longer log (1.0 when both are empty)."""
        n = max(self.live, self.replay)
        return self.matched / n if n else 1.0


def _rel(log: Sequence[Applied], begin_ns: Mapping[int, int]) -> list[tuple[int, int, int, int]]:
    out = []
    for a in log:
        t0 = begin_ns.get(a.graph)
        if t0 is None:
            continue
        out.append((a.graph, a.level, a.t_ns - t0, a.node))
    return out


def compare_switch_logs(
    live: Sequence[Applied],
    live_begin_ns: Mapping[int, int],
    replay: Sequence[Applied],
    replay_begin_ns: Mapping[int, int],
    *,
    tolerance_ns: int,
    window: int = 8,
) -> SwitchAgreement:
    """Greedy in-order matching (each replay switch used once, looking ``window``
    switches ahead so one extra switch on either side does not desynchronise)."""
    a = _rel(live, live_begin_ns)
    b = _rel(replay, replay_begin_ns)
    j = matched = 0
    for g, lv, t, node in a:
        for k in range(j, min(j + window, len(b))):
            g2, lv2, t2, node2 = b[k]
            same_place = abs(t - t2) <= tolerance_ns or (node >= 0 and node == node2)
            if g2 == g and lv2 == lv and same_place:
                matched += 1
                j = k + 1
                break
    return SwitchAgreement(matched, len(a), len(b))
