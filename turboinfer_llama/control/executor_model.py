"""The plan executor of ``hooks/ti_exec.c`` as a pure-Python state machine.

Why a model: replay must execute plans exactly as the native executor does, on virtual
time, and the live path needs the same behaviour when the C library is not built. The
model is driven by explicit calls with explicit times; it has no thread: the caller
asks ``due(now)`` for the next timer deadline and calls ``advance(t)`` to fire what is
due, where the native timer thread would have woken.

The rules are control/plan.py's, with these details shared with the C code:

* Every entry point first fires the timer switches due at its time, then does its own
  work, then fires what became due (so the order of switches depends only on the order
  of the inputs). Timer switches fire earliest first, then in the order they were armed.
* ``TIME`` switches are armed when their plan is set and stay armed until they fire or
  their plan is dropped: replaced while pending, or superseded when a newer plan
  becomes active. ``OFFSET`` switches (and ``NODE`` switches re-timed after a node-count
  mismatch) are armed at the graph's first ask and dropped at its end.
* A late plan's passed switches collapse to the last of them in the plan's order
  (plans list switches chronologically); that switch is logged with source ``first``.
* A pending plan for a graph that is already gone (``graph`` below the current
  sequence) is discarded at the next graph's first ask. Graphs without a plan count as
  late only once some plan has been set.
* The feedback base is the plan's level in effect (the last planned switch), or the
  level in effect when the plan set none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .plan import Anchor, Applied, Plan, Switch, moved, retarget

SOURCES = ("first", "node", "timer", "feedback", "end", "fallback", "now")
"""Source names by the native ``enum ti_source`` code."""


@dataclass(slots=True)
class _Timer:
    due_ns: int
    expect_ns: int
    seq: int
    gen: int
    level: int
    graph_bound: bool


@dataclass(slots=True)
class _Slot:
    plan: Plan
    gen: int
    nodes: list[Switch]  # NODE switches by key, stable


@dataclass(slots=True)
class ModelStatus:
    """Mirrors ``struct ti_exec_status`` (without the native-only hand-over counters)."""

    applied: int = 0
    skipped: int = 0
    mismatches: int = 0
    late_plans: int = 0
    plans_set: int = 0
    failed_errno: int = 0
    cur_level: int = -1
    stopped: bool = False


class ExecutorModel:
    """One executor over ``levels_hz`` (ascending). ``initial_level``: the level in
    effect at creation (-1 unknown). ``log`` holds every applied switch, oldest first;
    each is logged at the time of the call that fired it, as the native executor logs
    its clock at the actuator call: a timer switch at the ``advance`` (the timer
    thread's wake-up) or entry point that fired it, with its deadline in ``due_ns`` (a
    timer that wakes late, or a ``TIME`` switch already past when its plan is set,
    lands after its deadline). ``fail_at``: test hook, a callable ``level -> errno``
    (0 = ok) standing in for the actuator."""

    def __init__(
        self,
        levels_hz: list[int] | tuple[int, ...],
        *,
        initial_level: int = -1,
        fail_at: object | None = None,
    ) -> None:
        if not levels_hz or list(levels_hz) != sorted(set(levels_hz)):
            raise ValueError("levels_hz must be ascending, distinct and non-empty")
        if not -1 <= initial_level < len(levels_hz):
            raise ValueError(f"initial_level {initial_level} outside -1..{len(levels_hz) - 1}")
        self.levels_hz = tuple(int(h) for h in levels_hz)
        self.status = ModelStatus(cur_level=initial_level)
        self.log: list[Applied] = []
        self._actuate = fail_at
        self._pending: _Slot | None = None
        self._claimed: _Slot | None = None  # a plan for the begun graph, behind a later one
        self._active: _Slot | None = None
        self._act_gen = 0
        self._last_fallback = -1
        self._seq = 0
        self._awaiting_first = True
        self._in_graph = False
        self._graph_active = False
        self._mismatched = False
        self._t0 = 0  # the first ask of the last graph that started
        self._started_seq = 0  # that graph's sequence (0: none yet)
        self._max_ask = -1
        self._cursor = 0
        self._fb_floor = -1
        self._ref_expect = -1
        self._planned = -1
        self._timers: list[_Timer] = []
        self._timer_seq = 0
        self._ends: dict[int, int] = {}  # graph_end times of the last graphs, by sequence
        # the pending plan's TIME switches, waiting for the end of the graph it was
        # retargeted past (``plan.retarget``), and the end they were solved after
        # (gen, the graph, the end, switches)
        self._deferred: tuple[int, int, int, list[Switch]] | None = None

    # ---- the native API ----------------------------------------------------------

    def set_plan(self, plan: Plan, t_ns: int) -> None:
        self._check_plan(plan)
        self._fire_due(t_ns)
        after_end = self._ends.get(plan.after_graph, -1) if plan.after_graph else -1
        passed_running = bool(plan.after_graph) and self._seq > plan.after_graph
        plan_t0 = plan.after_t0_ns
        plan = retarget(plan, self._seq)
        st = self.status
        st.plans_set += 1
        slot = _Slot(
            plan,
            st.plans_set,
            sorted((s for s in plan.switches if s.anchor == Anchor.NODE), key=lambda s: s.key),
        )
        if self._in_graph and (
            plan.graph == self._seq or (plan.graph == 0 and not self._graph_active)
        ):
            self._set_late(slot, t_ns)
        else:
            pend = self._pending
            if (
                pend is not None
                and self._awaiting_first
                and pend.plan.graph == self._seq
                and plan.graph > self._seq
            ):
                # the pending plan is the begun graph's (its first ask not come yet):
                # it stays, claimed, and this one waits behind it
                if self._claimed is not None:
                    self._drop(self._claimed.gen, graph_bound_only=False)
                self._claimed = pend
            elif pend is not None:
                self._drop(pend.gen, graph_bound_only=False)
            self._pending = slot
            self._deferred = None
            timed = [sw for sw in plan.switches if sw.anchor == Anchor.TIME]
            if passed_running and after_end >= 0 and timed:
                # solved after an earlier graph's end: its stall switches are for the
                # stall after the graph it was retargeted past, timed from its end
                running_end = self._ends.get(self._seq, -1)
                if running_end < 0:
                    # armed at that graph's end
                    self._deferred = (slot.gen, self._seq, after_end, timed)
                    timed = []
                else:
                    timed = moved(timed, running_end - after_end)
            elif passed_running and timed:
                timed = moved(timed, self._t0 - plan_t0)  # its end unknown: by the starts
            for sw in timed:
                self._add(sw.key, sw.expect_ns, sw.level, slot.gen, graph_bound=False)
        self._fire_due(t_ns)

    def graph_begin(self, graph_seq: int, t_ns: int = 0) -> None:
        self._fire_due(t_ns)
        if self._in_graph:
            self._drop(0, graph_bound_only=True)
            self._in_graph = False
            self._graph_active = False
            self._fb_floor = -1
        self._seq = graph_seq
        self._awaiting_first = True

    def on_node(self, ordinal: int, ask: bool, t_ns: int) -> None:
        self._fire_due(t_ns)
        if ask:
            if self._awaiting_first:
                self._start_graph(t_ns)
            self._max_ask = max(self._max_ask, ordinal)
            slot = self._active
            if self._graph_active and slot is not None:
                p = slot.plan
                if not self._mismatched and p.n_nodes > 0 and ordinal >= p.n_nodes:
                    self._mismatch(slot)
                else:
                    while self._cursor < len(slot.nodes) and not self.status.stopped:
                        sw = slot.nodes[self._cursor]
                        if sw.key > ordinal:
                            break
                        self._cursor += 1
                        self._reach(sw.level, sw.expect_ns, slot.gen, "node", ordinal, t_ns)
        elif self._graph_active and self._in_graph and self._active is not None:
            self._feedback(self._active.plan, ordinal, t_ns)
        self._fire_due(t_ns)

    def graph_end(self, t_ns: int) -> None:
        self._fire_due(t_ns)
        if self._in_graph:
            self._in_graph = False
            self._fb_floor = -1
            if self._graph_active and self._active is not None:
                p = self._active.plan
                self._graph_active = False
                if not self._mismatched and p.n_nodes > 0 and self._max_ask + 1 < p.n_nodes:
                    self.status.mismatches += 1
                self._drop(0, graph_bound_only=True)
                self._apply(p.end_level, "end", -1, t_ns)
        self._ends[self._seq] = t_ns
        if len(self._ends) > 4:  # TI_ENDS
            del self._ends[min(self._ends)]
        d = self._deferred
        if d is not None and d[1] == self._seq:
            self._deferred = None
            if self._pending is not None and self._pending.gen == d[0]:
                for sw in moved(d[3], t_ns - d[2]):
                    self._add(sw.key, sw.expect_ns, sw.level, d[0], graph_bound=False)
        self._awaiting_first = True
        self._fire_due(t_ns)

    def switch_now(self, level: int, t_ns: int) -> None:
        if not 0 <= level < len(self.levels_hz):
            raise ValueError(f"level {level} outside 0..{len(self.levels_hz) - 1}")
        self._fire_due(t_ns)
        self._apply(level, "now", -1, t_ns)

    def due(self, now_ns: int | None = None) -> int | None:
        """The next timer deadline (ns), or None when nothing is armed or we stopped.
        ``now_ns`` is accepted for symmetry and not needed."""
        if self.status.stopped or not self._timers:
            return None
        return min(t.due_ns for t in self._timers)

    @property
    def graph_seq(self) -> int:
        """The sequence number of the current (or last) graph: what a switch fired now
        is logged with."""
        return self._seq

    def advance(self, now_ns: int) -> None:
        """Fire the timer switches due at or before ``now_ns`` (the timer thread waking
        at ``now_ns``: they are logged at ``now_ns``)."""
        self._fire_due(now_ns)

    def stop(self) -> None:
        self.status.stopped = True

    # ---- look-ahead for the per-graph replay (control/replay.py) -------------------
    # Each answers for the state as it is now, with no timer due: a caller that runs
    # many nodes at once stops at the next timer deadline (``due``) anyway.

    def ask_cut(self) -> int | None:
        """The smallest node ordinal whose ask (``on_node(o, True)``) would do more than
        note the ask: the graph's first ask, a ``NODE`` switch reached, or a node-count
        mismatch. None when no ask would."""
        if self._awaiting_first:
            return 0
        slot = self._active
        if not (self._graph_active and slot is not None):
            return None
        cut: int | None = None
        p = slot.plan
        if not self._mismatched and p.n_nodes > 0:
            cut = p.n_nodes
        if not self.status.stopped and self._cursor < len(slot.nodes):
            key = slot.nodes[self._cursor].key
            cut = key if cut is None else min(cut, key)
        return cut

    def note_asks(self, ordinal: int) -> None:
        """Asks up to ``ordinal`` happened, none of them at or past ``ask_cut()``: all
        they change is the highest ask seen (what ``on_node`` would have done)."""
        if ordinal > self._max_ask:
            self._max_ask = ordinal

    def feedback_from_ns(self) -> int | None:
        """The earliest time (ns) at which a node done (``on_node(o, False)``) would
        apply a feedback switch, were nothing else to change before; None if none
        would. The error grows with time and the target with it, so every done before
        this time does nothing."""
        slot = self._active
        st = self.status
        if not (self._graph_active and self._in_graph and slot is not None) or st.stopped:
            return None
        p = slot.plan
        if not (p.gain > 0 and p.predicted_ns > 0 and self._ref_expect >= 0):
            return None
        cur = st.cur_level
        base = self._planned if self._planned >= 0 else cur
        top = len(self.levels_hz) - 1
        if base < 0 or top <= cur:
            return None
        need = max(1, min(top, cur - base + 1))  # feedback steps that lift the level

        def ok(err: int) -> bool:  # the same float expression as _feedback
            return math.ceil(p.gain * float(err) / float(p.predicted_ns)) >= need

        err = max(1, math.floor((need - 1) * float(p.predicted_ns) / p.gain) - 2)
        while not ok(err):
            err += 1
        while err > 1 and ok(err - 1):
            err -= 1
        return int(self._t0 + self._ref_expect + p.margin_ns + err)

    # ---- internals (names follow hooks/ti_exec.c) ----------------------------------

    def _check_plan(self, plan: Plan) -> None:
        n = len(self.levels_hz)
        if plan.gain < 0 or plan.predicted_ns < 0:
            raise ValueError("gain and predicted_ns must be >= 0")
        for lv in (plan.first_level, plan.end_level, plan.fallback_level):
            if lv >= n:
                raise ValueError(f"level {lv} outside the table of {n} levels")
        for sw in plan.switches:
            if sw.level >= n:
                raise ValueError(f"switch level {sw.level} outside the table of {n} levels")
            if sw.anchor != Anchor.TIME and sw.key < 0:
                raise ValueError(f"{sw.anchor.name} switch with negative key {sw.key}")

    def _apply(self, level: int, source: str, node: int, t_ns: int, due_ns: int = -1) -> None:
        st = self.status
        if st.stopped or level < 0:
            return
        if level == st.cur_level:
            st.skipped += 1
            return
        err = int(self._actuate(level)) if callable(self._actuate) else 0
        self.log.append(
            Applied(t_ns, level, self.levels_hz[level], 0, source, self._seq, node, due_ns)
        )
        if err:
            st.stopped = True
            st.failed_errno = err
            return
        st.cur_level = level
        st.applied += 1

    def _add(self, due_ns: int, expect_ns: int, level: int, gen: int, *, graph_bound: bool) -> None:
        self._timers.append(_Timer(due_ns, expect_ns, self._timer_seq, gen, level, graph_bound))
        self._timer_seq += 1

    def _drop(self, gen: int, *, graph_bound_only: bool) -> None:
        self._timers = [
            t
            for t in self._timers
            if not ((gen == 0 or t.gen == gen) and (not graph_bound_only or t.graph_bound))
        ]

    def _reach(
        self,
        level: int,
        expect_ns: int,
        gen: int,
        source: str,
        node: int,
        t_ns: int,
        due_ns: int = -1,
    ) -> None:
        mine = self._graph_active and gen == self._act_gen
        if mine and expect_ns >= 0:
            self._ref_expect = expect_ns
        if level < 0:
            return
        if mine:
            self._planned = level
        self._apply(max(level, self._fb_floor), source, node, t_ns, due_ns)

    def _fire_due(self, now_ns: int) -> None:
        while self._timers and not self.status.stopped:
            t = min(self._timers, key=lambda x: (x.due_ns, x.seq))
            if t.due_ns > now_ns:
                return
            self._timers.remove(t)
            self._reach(t.level, t.expect_ns, t.gen, "timer", -1, now_ns, t.due_ns)

    def _mismatch(self, slot: _Slot) -> None:
        self._mismatched = True
        self.status.mismatches += 1
        for sw in slot.nodes[self._cursor :]:
            if sw.expect_ns >= 0:
                self._add(
                    self._t0 + sw.expect_ns, sw.expect_ns, sw.level, slot.gen, graph_bound=True
                )
        self._cursor = len(slot.nodes)

    def _activate(self, slot: _Slot) -> None:
        if self._active is not None and self._active.gen != slot.gen:
            self._drop(self._active.gen, graph_bound_only=False)
        self._active = slot
        self._act_gen = slot.gen
        self._graph_active = True
        self._last_fallback = slot.plan.fallback_level
        self._cursor = 0

    def _arm_offsets(self, slot: _Slot, now_ns: int, *, late: bool) -> int:
        """Arms OFFSET (and, when late, unpassed TIME) switches; returns the level the
        passed switches collapse to (late), else the first level."""
        collapsed = slot.plan.first_level
        for sw in slot.plan.switches:
            passed = False
            if sw.anchor == Anchor.OFFSET:
                passed = late and self._t0 + sw.key <= now_ns
                if not passed:
                    self._add(self._t0 + sw.key, sw.expect_ns, sw.level, slot.gen, graph_bound=True)
            elif late and sw.anchor == Anchor.NODE:
                passed = sw.key <= self._max_ask
            elif late and sw.anchor == Anchor.TIME:
                passed = sw.key <= now_ns
                if not passed:
                    self._add(sw.key, sw.expect_ns, sw.level, slot.gen, graph_bound=False)
            if passed:
                if sw.expect_ns >= 0:
                    self._ref_expect = sw.expect_ns
                if sw.level >= 0:
                    collapsed = sw.level
        if late:
            while self._cursor < len(slot.nodes) and slot.nodes[self._cursor].key <= self._max_ask:
                self._cursor += 1
        return collapsed

    def _start_graph(self, t_ns: int) -> None:
        self._awaiting_first = False
        self._in_graph = True
        self._graph_active = False
        self._mismatched = False
        self._t0 = t_ns
        self._started_seq = self._seq
        self._max_ask = -1
        self._fb_floor = -1
        self._ref_expect = -1
        self._planned = -1
        self._cursor = 0
        self._drop(0, graph_bound_only=True)
        claimed, self._claimed = self._claimed, None
        if claimed is not None:
            if claimed.plan.graph == self._seq:
                self._run_plan(claimed, t_ns)
                return
            self._drop(claimed.gen, graph_bound_only=False)
        pending = self._pending
        if pending is not None:
            p = pending.plan
            if p.graph in (0, self._seq):
                self._pending = None
                self._run_plan(pending, t_ns)
                return
            if p.graph < self._seq:
                self._drop(pending.gen, graph_bound_only=False)
                self._pending = None
        if self.status.plans_set > 0:
            self.status.late_plans += 1
        self._apply(self._last_fallback, "fallback", -1, t_ns)

    def _run_plan(self, slot: _Slot, t_ns: int) -> None:
        """``slot``'s plan runs the graph whose first ask came at ``t_ns``."""
        self._activate(slot)
        self._arm_offsets(slot, t_ns, late=False)
        self._planned = slot.plan.first_level
        self._apply(slot.plan.first_level, "first", -1, t_ns)

    def _set_late(self, slot: _Slot, t_ns: int) -> None:
        self._activate(slot)
        collapsed = self._arm_offsets(slot, t_ns, late=True)
        self._planned = collapsed
        if slot.plan.n_nodes > 0 and self._max_ask >= slot.plan.n_nodes:
            self._mismatch(slot)
        self._apply(collapsed, "first", -1, t_ns)

    def _feedback(self, p: Plan, ordinal: int, t_ns: int) -> None:
        err_ns = (t_ns - self._t0) - self._ref_expect - p.margin_ns
        base = self._planned if self._planned >= 0 else self.status.cur_level
        if not (p.gain > 0 and p.predicted_ns > 0 and self._ref_expect >= 0 and err_ns > 0):
            return
        if base < 0:
            return
        top = len(self.levels_hz) - 1
        steps = math.ceil(p.gain * float(err_ns) / float(p.predicted_ns))
        target = min(top, base + steps) if steps < top else top
        if target > self.status.cur_level:
            self._fb_floor = max(self._fb_floor, target)
            self._apply(target, "feedback", ordinal, t_ns)


__all__ = ["SOURCES", "ExecutorModel", "ModelStatus"]
