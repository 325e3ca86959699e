"""The plan executor's semantics in Python, driven with explicit times.

Replay drives it on virtual time, so a plan executes in replay exactly as the native
executor (``hooks/ti_exec.c``) executes it inside ``llama_decode``; tests drive both
with the same synthetic callbacks and compare their logs. The semantics are written
once, in ``control/plan.py``; this module and the C code implement them.

Calls mirror the native API: ``graph_begin`` (before ``llama_decode``), ``on_node``
(the eval callback's ask/done), ``graph_end`` (after ``llama_decode``), ``set_plan``,
``switch_now``; ``next_due``/``advance`` stand for the timer thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .plan import Anchor, Applied, Plan, Switch

Actuate = Callable[[int, int], None]  # (t_ns, level)


class ExecutorModel:
    """See the module docstring. ``actuate(t_ns, level)`` is called for every applied
    switch (replay sets the simulator's clock there)."""

    def __init__(self, levels_hz: list[int], actuate: Actuate | None = None) -> None:
        self.levels_hz = [int(h) for h in levels_hz]
        self.top = len(self.levels_hz) - 1
        self._actuate = actuate
        self.log: list[Applied] = []
        self.level = -1  # in effect (as requested); -1 = never set
        self.pending: Plan | None = None
        self.active: Plan | None = None
        self._last_plan: Plan | None = None
        self.graph = 0
        self._started = False  # the current graph's first ask was seen
        self.t0 = 0
        self._next_node = 0  # index into the active plan's NODE switches
        self._node_sw: list[Switch] = []
        self._offset_sw: list[tuple[int, Switch]] = []  # (due time, switch), ascending
        self._time_sw: list[tuple[int, Switch]] = []
        self._checks: list[Switch] = []
        self._next_check = 0
        self._floor = -1
        self._mismatched = False
        self.mismatches = 0
        self.late_plans = 0
        self.applied = 0
        self.failed = 0

    # ---- applying ----------------------------------------------------------------------

    def _apply(self, t_ns: int, level: int, source: str, node: int = -1) -> None:
        if level < 0 or level == self.level:
            return
        level = min(level, self.top)
        self.level = level
        self.applied += 1
        self.log.append(Applied(t_ns, level, self.levels_hz[level], 0, source, self.graph, node))
        if self._actuate is not None:
            self._actuate(t_ns, level)

    def _floored(self, level: int) -> int:
        return max(level, self._floor) if self._floor >= 0 else level

    # ---- plans -------------------------------------------------------------------------

    def set_plan(self, plan: Plan, t_ns: int) -> None:
        """Store ``plan`` as pending (or adopt it at once when its graph already runs:
        a late plan). Its TIME switches are armed now."""
        self._time_sw = sorted(
            ((s.key, s) for s in plan.switches if s.anchor is Anchor.TIME), key=lambda x: x[0]
        )
        running = self._started and self.active is None and plan.graph in (0, self.graph)
        if running:
            self.late_plans += 1
            self._activate(plan, self.t0, late_at=t_ns)
        else:
            self.pending = plan
        self.advance(t_ns)

    def _activate(self, plan: Plan, t0: int, *, late_at: int | None = None) -> None:
        self.active = plan
        self._last_plan = plan
        self.t0 = t0
        self._floor = -1
        self._mismatched = False
        self._node_sw = sorted(
            (s for s in plan.switches if s.anchor is Anchor.NODE and s.level >= 0),
            key=lambda s: s.key,
        )
        self._checks = sorted(
            (s for s in plan.switches if s.anchor is Anchor.NODE and s.level < 0),
            key=lambda s: s.key,
        )
        self._next_node = self._next_check = 0
        self._offset_sw = sorted(
            ((t0 + s.key, s) for s in plan.switches if s.anchor is Anchor.OFFSET),
            key=lambda x: x[0],
        )
        if late_at is None:
            self._apply(t0, plan.first_level, "first")
            return
        # late: collapse what has passed into one switch, applied at once
        passed = [(t, s.level) for t, s in self._offset_sw if t <= late_at]
        self._offset_sw = [(t, s) for t, s in self._offset_sw if t > late_at]
        seen = self._node_count
        while self._next_node < len(self._node_sw) and self._node_sw[self._next_node].key < seen:
            s = self._node_sw[self._next_node]
            passed.append((t0 + max(s.expect_ns, 0), s.level))
            self._next_node += 1
        while self._next_check < len(self._checks) and self._checks[self._next_check].key < seen:
            self._next_check += 1
        level = max(passed)[1] if passed else plan.first_level
        self._apply(late_at, level, "late")

    # ---- engine callbacks ------------------------------------------------------------

    def graph_begin(self, seq: int) -> None:
        """Before ``llama_decode``: a new graph number; its first ask activates."""
        self.graph = seq
        self._started = False
        self.active = None
        self._node_count = 0

    _node_count = 0

    def on_node(self, ordinal: int, ask: bool, t_ns: int) -> None:
        """The eval callback: ``ordinal`` counts asks since ``graph_begin`` from 0."""
        self.advance(t_ns)
        if ask:
            self._node_count = ordinal + 1
            if not self._started:
                self._started = True
                plan = self.pending
                if plan is not None and plan.graph in (0, self.graph):
                    self.pending = None
                    self._activate(plan, t_ns)
                else:
                    fb = -1
                    if self._last_plan is not None:
                        self.late_plans += 1
                        fb = self._last_plan.fallback_level
                    self.t0 = t_ns
                    self._apply(t_ns, fb, "fallback")
            plan = self.active
            if plan is None:
                return
            if plan.n_nodes and ordinal >= plan.n_nodes and not self._mismatched:
                self._fall_back_to_time(t_ns)
            if self._mismatched:
                return
            while (
                self._next_node < len(self._node_sw)
                and self._node_sw[self._next_node].key <= ordinal
            ):
                s = self._node_sw[self._next_node]
                self._next_node += 1
                self._apply(t_ns, self._floored(s.level), "node", ordinal)
            return
        self._feedback(ordinal, t_ns)

    def _fall_back_to_time(self, t_ns: int) -> None:
        """A graph with more nodes than planned: remaining NODE switches by time."""
        self.mismatches += 1
        self._mismatched = True
        rest = self._node_sw[self._next_node :]
        self._next_node = len(self._node_sw)
        extra = [(self.t0 + s.expect_ns, s) for s in rest if s.expect_ns >= 0]
        self._offset_sw = sorted(self._offset_sw + extra, key=lambda x: x[0])
        self.advance(t_ns)

    def _planned_level(self, ordinal: int) -> int:
        lv = self.active.first_level if self.active else self.level
        for s in self._node_sw:
            if s.key > ordinal:
                break
            lv = s.level
        return lv

    def _feedback(self, ordinal: int, t_ns: int) -> None:
        plan = self.active
        if plan is None or plan.gain <= 0 or self._mismatched:
            return
        chk = None
        while (
            self._next_check < len(self._checks) and self._checks[self._next_check].key <= ordinal
        ):
            chk = self._checks[self._next_check]
            self._next_check += 1
        if chk is None:
            return
        err = (t_ns - self.t0) - chk.expect_ns - plan.margin_ns
        if err <= 0:
            return
        planned = self._planned_level(ordinal)
        new = min(self.top, planned + math.ceil(plan.gain * err / max(plan.predicted_ns, 1)))
        if new > self.level:
            self._floor = new
            self._apply(t_ns, new, "feedback", ordinal)

    def graph_end(self, t_ns: int) -> None:
        """After ``llama_decode``: ``end_level``; NODE/OFFSET switches are dropped."""
        self.advance(t_ns)
        plan = self.active
        if self._started and plan is not None:
            if plan.n_nodes and self._node_count < plan.n_nodes:
                self.mismatches += 1
            if plan.end_level >= 0:
                self._apply(t_ns, plan.end_level, "end")
        self.active = None
        self._offset_sw = []
        self._node_sw = []
        self._checks = []
        self._floor = -1
        self._started = False

    def switch_now(self, level: int, t_ns: int) -> None:
        self._apply(t_ns, level, "now")

    # ---- the timer thread --------------------------------------------------------------

    def next_due(self) -> int | None:
        """When the timer thread would next fire (virtual ns), or None."""
        heads = [q[0][0] for q in (self._offset_sw, self._time_sw) if q]
        return min(heads) if heads else None

    def advance(self, now_ns: int) -> None:
        """Fire every OFFSET/TIME switch due at or before ``now_ns``, in time order."""
        while True:
            due = self.next_due()
            if due is None or due > now_ns:
                return
            if self._offset_sw and self._offset_sw[0][0] == due:
                _, s = self._offset_sw.pop(0)
                self._apply(due, self._floored(s.level), "timer")
            else:
                _, s = self._time_sw.pop(0)
                self._apply(due, s.level, "timer")
