"""Reactive: lower the clock on a detected stall, raise it on detected compute.

The ablation that shows what forecasting buys: the same two levels a stall-aware
policy would use, but no forecast and no lead, so every switch lands one switch
latency after the boundary that triggered it. A stall is detected when a graph ends
(or a request ends); compute when the next graph's first kernel is reached. Live,
only the executor sees that first kernel, so the policy is a plan: the high level at
the graph's first ask, the low level at its end.
"""

from __future__ import annotations

from ...engine.events import Event, EventKind
from ..base import ControllerDefaults, Decision
from ..plan import Plan

_STALL = (EventKind.DECODE_END, EventKind.REQUEST_END, EventKind.IDLE)


class Reactive(ControllerDefaults):
    name = "reactive"
    event_kinds = frozenset({EventKind.DECODE_BEGIN, *_STALL})

    def __init__(
        self, levels_hz: list[int], *, high_hz: int | None = None, low_hz: int | None = None
    ) -> None:
        levels = sorted(levels_hz)
        self.levels = [int(h) for h in levels]
        self.high_hz = int(high_hz if high_hz is not None else levels[-1])
        self.low_hz = int(low_hz if low_hz is not None else levels[0])
        self._level: int | None = None
        self._in_compute = False

    def _set(self, hz: int, t_ns: int) -> Decision | None:
        if hz == self._level:
            return None
        self._level = hz
        return Decision(hz, t_ns, "reactive")

    def on_event(self, event: Event) -> Decision | Plan | None:
        if event.kind is EventKind.DECODE_BEGIN:
            hi = self.levels.index(self.high_hz)
            lo = self.levels.index(self.low_hz)
            self._level = None
            return Plan(first_level=hi, end_level=lo, fallback_level=hi)
        if event.kind in _STALL:
            self._in_compute = False
            return self._set(self.low_hz, event.t_ns)
        return None

    def plan(self, now_ns: int) -> list[Decision]:
        return []
