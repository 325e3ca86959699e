"""Replay a recorded trace through a controller and the simulator, deterministically.

The replay rebuilds, on the simulator's virtual clock, the events a live engine would
have emitted (request, prefill, decode, node, sample, token ...) and hands them to
the controller in time order, so a controller cannot see anything before it happens.
Kernels are re-timed by the simulator at its current clock; stalls keep their
recorded duration. Decisions land through ``set_hz`` at their ``at_ns``: stalls are
split at decision times, and so are kernels (the simulator's kernel time is linear in
the kernel's work above its floor; a kernel that short runs whole), as a live driver
call lands while a kernel runs. Submit and sample stalls are attributed to their graph
(``with_graphs``), as the live engine's events are. Every controller
call is timed with ``time.perf_counter_ns``.

Event placement: at ``kernel`` granularity (recorded with per-kernel timing) every
kernel gets ``NODE_ASK`` before and ``NODE_DONE`` after it; at ``graph`` granularity
all ``NODE_ASK``s of a graph come at its start (the scheduler's scan), no
``NODE_DONE``, and the simulator's host submission cost precedes each kernel.
``DECODE_END`` is at the last kernel's end, ``SAMPLE_BEGIN`` right after it, and
``SAMPLE_END`` + ``TOKEN`` at the end of the sample stall. As live, a controller is
given the kinds its ``event_kinds`` names only (``control.base``; sample and token
events to offline controllers only). ``plan(now)`` is polled
at graph start, graph end, request end and every ``timer_ns`` inside stalls; its
result replaces the decisions of the previous poll.

Two paths, one run. The per-kernel path (``reference=True``) hands every kernel to
``SimGpu.run_kernel`` and makes every ask and done call. The per-graph path (the
default for closed-loop controllers on the simulator, at kernel or graph granularity)
runs the kernels between two points where something can happen -- a due point of the
runner (a decision, an executor timer, a graph delivery, a plan set), an ask the
executor acts on (``ExecutorModel.ask_cut``: a node switch, a node-count mismatch),
a node done its feedback acts on (``ExecutorModel.feedback_from_ns``) -- with
``SimGpu.run_batch`` (numpy over the nodes), and notes the asks and dones in between
at the times the per-kernel path has them (they would do nothing else); what does
act goes through the per-kernel code. The controller sees the same events, graph
records and feedback at the same virtual times: ``tests/test_replay_per_graph.py``
checks the switch logs equal and the figures within 0.5% (measured: equal to float
summation order).
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.events import Event, EventKind, StallKind
from ..engine.graph import KernelCost, cost
from ..engine.latency import RequestLatency, per_request, pooled_ms
from ..engine.segments import Segment
from .base import Controller, Decision
from .executor_model import ExecutorModel
from .graph_batch import GraphBatch, NodeCosts, none_done
from .plan import HOLD_FOR_ENGINE, Applied, Plan, after

GRANULARITIES = ("auto", "kernel", "layer", "graph")
TIMINGS = ("sim", "recorded")
# ASSUMPTION: a graph's records reach the controller 300 us after its decode returns
# (worker wake-up, numpy ingest, plan solve); measured on the build host by
# ``python -m turboinfer_llama.bench.decision_time`` (ingest + solve) plus a wake-up.
PLAN_DELAY_NS = 300_000
# a replayed timer deadline and a live one are the same when this close (ns): both are
# a graph's first ask + the same offset, or the same TIME key, on clocks a whole ns apart
TIMER_MATCH_NS = 1_000
LAYER_OUT_PREFIX_STR = "l_out-"


@dataclass(frozen=True)
class ReplayResult:
    """Figures of one replay. Everything here is simulated."""

    controller: str
    device: str
    tokens: int
    requests: int
    energy_j: float
    energy_per_token_j: float
    duration_s: float
    ttft_ms: float
    tpot_ms: float
    tokens_per_s: float
    switches: int
    switches_per_s: float
    decisions: int
    decision_us_median: float
    decision_us_p99: float
    energy_by_phase_j: dict[str, float] = field(default_factory=dict)
    time_by_phase_ns: dict[str, int] = field(default_factory=dict)
    decision_us: tuple[float, ...] = ()
    granularity: str = "kernel"
    simulated: bool = True
    applied: tuple[Applied, ...] = ()  # switches the executor model applied
    plans: int = 0
    late_plans: int = 0
    mismatches: int = 0
    graph_us_median: float = 0.0  # per-graph ingest + plan solve (controller's worker)
    graph_begin_ns: dict[int, int] = field(default_factory=dict)  # DECODE_BEGIN, virtual
    # each graph's compute time, first ask to DECODE_END (``GraphBatch.compute_ns``), ns
    graph_compute_ns: dict[int, int] = field(default_factory=dict)
    # each request's tokens, TTFT and TPOT (``engine.latency``), in request order
    requests_latency: tuple[RequestLatency, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The headline figures (no per-decision list), for printing or JSON."""
        return {
            "controller": self.controller,
            "device": self.device,
            "simulated": self.simulated,
            "tokens": self.tokens,
            "energy_per_token_mj": round(self.energy_per_token_j * 1e3, 4),
            "ttft_ms": round(self.ttft_ms, 3),
            "tpot_ms": round(self.tpot_ms, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "switches_per_s": round(self.switches_per_s, 2),
            "decision_us_median": round(self.decision_us_median, 2),
            "decision_us_p99": round(self.decision_us_p99, 2),
        }


class _Runner:
    """Virtual-time driver: events to the controller, plans to the executor model, the
    executor's switches and the controller's timed decisions to the device."""

    def __init__(
        self, controller: Controller, device: Any, timer_ns: int, *, recorded: bool
    ) -> None:
        self.ctl = controller
        self.dev = device
        self.timer_ns = timer_ns
        self.recorded = recorded  # pass-through timing: recorded durations, no re-timing
        self.times_ns: list[int] = []
        self.graph_times_ns: list[int] = []
        self.event_q: list[tuple[int, int, Decision]] = []  # from on_event
        self.plan_q: list[tuple[int, int, Decision]] = []  # from the latest plan()
        self._seq = 0
        self.token_times: dict[int, list[int]] = {}
        self.request_begin: dict[int, int] = {}
        self.on_counters = controller.on_counters
        self.on_graph = controller.on_graph
        self.on_applied = controller.on_applied
        self.node_events = controller.offline
        # what on_event is given (control.base): live, the governor gives the same
        self.event_kinds = frozenset(controller.event_kinds)
        self.levels = sorted(int(h) for h in device.frequencies_hz())
        cur = device.current_hz()
        init = self.levels.index(cur) if cur in self.levels else -1
        self.ex = ExecutorModel(self.levels, initial_level=init, fail_at=self._actuate)
        # (due: the controller gets it, seq, batch, plan set this long after its end)
        self.graph_q: list[tuple[int, int, GraphBatch, int]] = []
        # (due, seq, plan, its graph, the graph's end): solved, not set yet
        self.set_q: list[tuple[int, int, Plan, int, int]] = []
        self._boundary_ns = -1  # last request boundary event (begin, end, idle)
        self._dropped_live: set[int] | None = None
        # graphs the live run planned no next graph for (its request ended first): held
        # until the request's end reaches the controller, as it did live
        self._held: set[int] = set()
        self._planned_live: set[int] | None = None
        self._log_seen = 0
        self.plans = 0
        self.graph_begin_ns: dict[int, int] = {}
        self.graph_compute_ns: dict[int, int] = {}
        self._live_log: list[Applied] | None = None
        self._live_begin: Mapping[int, int] = {}
        self._live_cutoff: Mapping[int, int] = {}
        # graph -> sorted (deadline - DECODE_BEGIN, how late the live timer fired)
        self._live_late: dict[int, list[tuple[int, int]]] = {}
        # graph -> its end-of-graph switch's offset from DECODE_BEGIN, live
        self._live_end: dict[int, int] = {}
        self._end_due: int | None = None  # a graph end the live engine called late
        # graphs held for the planner until the engine enters its next one-token
        # decode (``hold``): (batch, plan delay from then, the request's last graph)
        self.hold = False
        self.begun_graph = -1  # the last graph begun (DECODE_BEGIN)
        # counters sampled at each graph's end, when graphs are held (as the Governor)
        self._end_counters: dict[int, Any] = {}
        self.mark_after = False  # plans solved after a graph say so (``plan.after``)
        self._stash: list[tuple[GraphBatch, int, bool]] = []

    def _actuate(self, level: int) -> int:
        """The executor model's actuator: the simulator's clock (errno 0: never fails)."""
        self.dev.set_hz(self.levels[level])
        return 0

    # -- controller calls, timed --
    def _result(self, res: Any, now: int) -> None:
        if isinstance(res, Plan):
            self.plans += 1
            self.ex.set_plan(res, now)
        elif res is not None:
            self._queue(self.event_q, res)

    def emit(self, kind: EventKind, **kw: Any) -> None:
        """Deliver one event, if the controller takes its kind (``event_kinds``, as
        live). A returned decision may have changed the controller's timed plan, so the
        plan is polled in the same (timed) call."""
        self.deliver_graphs()
        now = self.dev.now_ns()
        if kind in (EventKind.REQUEST_BEGIN, EventKind.REQUEST_END, EventKind.IDLE):
            self._boundary_ns = now
        if kind not in self.event_kinds:
            return
        ev = Event(kind, now, **kw)
        t0 = time.perf_counter_ns()
        d = self.ctl.on_event(ev)
        plan = self.ctl.plan(now) if isinstance(d, Decision) else None
        self.times_ns.append(time.perf_counter_ns() - t0)
        self._result(d, now)
        if plan is not None:
            self._replace_plan(plan)

    def ask(self, graph: int, node: Segment) -> None:
        """The scheduler reaching ``node`` (cb_eval ask): offline controllers only."""
        if not self.node_events:
            return
        self.emit(
            EventKind.NODE_ASK,
            graph=graph,
            node=node.node,
            op=node.op,
            name=node.name,
            layer=node.layer,
            shape=node.shape,
        )

    def graph_done(
        self, batch: GraphBatch, delay_ns: int, input_ns: int | None = None, *, last: bool = False
    ) -> None:
        """The graph's records reach the controller ``input_ns`` after the decode
        returned, and its plan reaches the executor ``delay_ns`` after it (live: the
        worker wakes, ingests and solves meanwhile; ``input_ns`` None: both at once).
        ``last``: the request's last graph."""
        if self.on_graph is None:
            return
        if self.hold and input_ns is None:
            self._stash.append((batch, delay_ns, last))
            return
        self._plan_from_now(batch, delay_ns, input_ns, last)

    def _plan_from_now(
        self, batch: GraphBatch, delay_ns: int, input_ns: int | None, last: bool
    ) -> None:
        """Queue ``batch`` for the controller ``input_ns`` from now (or ``delay_ns``),
        its plan for the executor ``delay_ns`` from now."""
        self._seq += 1
        now = self.dev.now_ns()
        given = min(input_ns, delay_ns) if input_ns is not None else delay_ns
        if last and self._planned_live is not None and batch.graph not in self._planned_live:
            self._held.add(batch.graph)
        bisect.insort(self.graph_q, (now + given, self._seq, batch, now + delay_ns))

    def entering_decode(self, n_tokens: int) -> None:
        """The engine enters ``llama_decode`` (after DECODE_BEGIN): a one-token decode
        wakes the planner for the held graphs, each planned ``delay`` from now, as
        live (``Governor.entering_decode``; a prompt batch computes on every core and
        wakes nothing)."""
        if n_tokens > 1 or not self._stash:
            return
        held, self._stash = self._stash, []
        for batch, delay_ns, last in held:
            self._plan_from_now(batch, delay_ns, None, last)

    def wait_idle(self) -> None:
        """The end of the run: the held graphs are planned now (live, reading the
        figures waits for the planner: ``Governor.wait_idle``)."""
        held, self._stash = self._stash, []
        for batch, _, last in held:
            self._plan_from_now(batch, 0, None, last)
        self.deliver_graphs()

    def request_ended(self, ended: bool) -> None:
        """Around REQUEST_END: before it (``ended`` False), hand the controller the
        graphs the live run planned a next graph for (it did so before it saw the end);
        after it, release those it planned none for (it saw the end first)."""
        if ended:
            self._held.clear()
            self.deliver_graphs()
            return
        while self.graph_q and self.graph_q[0][2].graph not in self._held:
            item = self.graph_q.pop(0)
            self._deliver(item[2], item[3])

    def use_live_log(
        self, log: list[Applied], begin_ns: Mapping[int, int], cutoff_ns: Mapping[int, int]
    ) -> None:
        self._live_log = log
        self._live_begin = begin_ns
        self._live_cutoff = cutoff_ns
        late: dict[int, list[tuple[int, int]]] = {}
        for a in log:
            l0 = begin_ns.get(a.graph)
            if a.source == "timer" and a.due_ns >= 0 and l0 is not None:
                late.setdefault(a.graph, []).append((a.due_ns - l0, max(0, a.t_ns - a.due_ns)))
            elif a.source == "end" and l0 is not None:
                self._live_end[a.graph] = a.t_ns - l0
        self._live_late = {g: sorted(v) for g, v in late.items()}

    def graph_end(self, graph: int, now: int) -> None:
        """The engine's end of graph (``llama_decode`` returned): the executor's
        end-of-graph switch now, or, replaying a live run, as late as the live engine
        thread made it (it runs Python between the decode's return and the native
        call, and on a busy host it may wait there for the GIL or a core: the live log
        has that switch's time). Until then the graph is still running for the
        executor, as it was live."""
        if self.on_counters is not None and self.mark_after:
            self._end_counters[graph] = self.dev.read_counters()
        off = self._live_end.get(graph)
        v0 = self.graph_begin_ns.get(graph)
        due = v0 + off if off is not None and v0 is not None else now
        if due <= now:
            self.ex.graph_end(now)
        else:
            self._end_due = due

    def _fire_end(self, now: int) -> None:
        """The late graph end, once due (or before the next graph begins)."""
        due = self._end_due
        if due is not None and due <= now:
            self._end_due = None
            self.ex.graph_end(due)

    def graph_begin(self, graph: int, now: int) -> None:
        self.begun_graph = graph
        self._fire_end(self._end_due if self._end_due is not None else now)
        self.ex.graph_begin(graph, now)

    def _timer_wake(self) -> int | None:
        """When the executor's timer thread wakes for its next deadline: at the
        deadline, or, replaying a live run, as late as the live timer thread fired the
        switch with the same deadline (same graph, same offset from DECODE_BEGIN; only
        a switch the replay's own plan put at that very deadline is delayed)."""
        due = self.ex.due()
        if due is None or not self._live_late:
            return due
        g = self.ex.graph_seq
        v0, lates = self.graph_begin_ns.get(g), self._live_late.get(g)
        if v0 is None or not lates:
            return due
        off = due - v0
        i = bisect.bisect_left(lates, (off - TIMER_MATCH_NS, -1))
        if i < len(lates) and abs(lates[i][0] - off) <= TIMER_MATCH_NS:
            return due + lates[i][1]
        return due

    def _applied_since(self, now: int) -> list[tuple[int, int]]:
        """Switches applied since the last call: the replay executor's, or the live
        run's placed on this clock (graph by graph, by DECODE_BEGIN)."""
        if self._live_log is None:
            new = self.ex.log[self._log_seen :]
            self._log_seen = len(self.ex.log)
            return [(a.t_ns, a.level) for a in new]
        out = []
        log = self._live_log
        while self._log_seen < len(log):
            a = log[self._log_seen]
            g = a.graph
            if g not in self._live_begin:  # before the first graph: place it by the next
                g = min((k for k in self._live_begin if k > g), default=g)
            v0, l0 = self.graph_begin_ns.get(g), self._live_begin.get(g)
            if v0 is None or l0 is None:
                break
            t = a.t_ns - l0 + v0
            if t > now:
                break
            out.append((t, a.level))
            self._log_seen += 1
        return out

    def deliver_graphs(self) -> None:
        now = self.dev.now_ns()
        while self.graph_q and self.graph_q[0][0] <= now:
            if self.graph_q[0][2].graph in self._held:
                break
            item = self.graph_q.pop(0)
            self._deliver(item[2], item[3])
        while self.set_q and self.set_q[0][0] <= now:
            _, _, plan, graph, t_end = self.set_q.pop(0)
            self._set(plan, graph, t_end, now)

    def _set(self, plan: Plan, graph: int, t_end: int, now: int) -> None:
        """Set a solved plan, unless its request has ended meanwhile (as the live
        governor drops it: it would replace the plan the request's end, or the next
        request's begin, answered with); replaying a live run, as it did."""
        dropped = self._dropped_live
        if (graph in dropped) if dropped is not None else self._boundary_ns > t_end:
            return
        self.ex.set_plan(plan, now)

    def _deliver(self, batch: GraphBatch, set_due: int) -> None:
        now = self.dev.now_ns()
        t0 = time.perf_counter_ns()
        if self.on_applied is not None:
            cut = self._live_cutoff.get(batch.graph) if self._live_log is not None else None
            upto = batch.t_end_ns + cut if cut is not None else now
            self.on_applied(self._applied_since(min(upto, now)))
        if self.on_counters is not None:
            # as the Governor: sampled at the graph's end when graphs are held, else now
            c = self._end_counters.pop(batch.graph, None)
            for k in [k for k in self._end_counters if k < batch.graph]:
                del self._end_counters[k]  # graphs that gave no batch
            self.on_counters(c if c is not None else self.dev.read_counters())
        if self.mark_after and self.begun_graph > batch.graph:
            batch.ahead = 2  # as the Governor: its plan goes past the graph computing
        plan = self.on_graph(batch) if self.on_graph is not None else None
        self.graph_times_ns.append(time.perf_counter_ns() - t0)
        if plan is not None:
            if self.mark_after:  # as the Governor, holding graphs
                plan = after(plan, batch.graph, batch.t_first_ns)
            self.plans += 1
            if set_due > now:
                self._seq += 1
                bisect.insort(self.set_q, (set_due, self._seq, plan, batch.graph, batch.t_end_ns))
            else:
                self._set(plan, batch.graph, batch.t_end_ns, now)

    def _replace_plan(self, plan: list[Decision]) -> None:
        self.plan_q = []
        for d in plan:
            self._seq += 1
            bisect.insort(self.plan_q, (d.at_ns, self._seq, d))
        self.apply_due()

    def poll(self) -> None:
        now = self.dev.now_ns()
        t0 = time.perf_counter_ns()
        plan = self.ctl.plan(now)
        self.times_ns.append(time.perf_counter_ns() - t0)
        self._replace_plan(plan)

    def _queue(self, q: list[tuple[int, int, Decision]], d: Decision) -> None:
        self._seq += 1
        bisect.insort(q, (d.at_ns, self._seq, d))
        self.apply_due()

    def next_due(self) -> int | None:
        heads = [q[0][0] for q in (self.event_q, self.plan_q, self.set_q) if q]
        if self._end_due is not None:
            heads.append(self._end_due)
        if self.graph_q and self.graph_q[0][2].graph not in self._held:
            heads.append(self.graph_q[0][0])
        ex = self._timer_wake()
        if ex is not None:
            heads.append(ex)
        return min(heads) if heads else None

    def apply_due(self) -> None:
        now = self.dev.now_ns()
        self.deliver_graphs()
        wake = self._timer_wake()
        if wake is not None and wake <= now:  # the timer thread, awake: fires what is due
            if self._end_due is not None and self._end_due < wake:
                self._fire_end(now)
            self.ex.advance(now)
        self._fire_end(now)
        while True:
            heads = [q for q in (self.event_q, self.plan_q) if q and q[0][0] <= now]
            if not heads:
                return
            q = min(heads, key=lambda q: (q[0][0], q[0][1]))
            _, _, d = q.pop(0)
            # through the executor, as live (Governor._apply_due): logged, so the
            # controller's on_applied sees its own timed decisions
            level = min(bisect.bisect_left(self.levels, d.freq_hz), len(self.levels) - 1)
            self.ex.switch_now(level, now)

    # -- device work --
    def _advance(self, dur_ns: int, kind: str, phase: str, *, timer: bool, busy: bool) -> None:
        """Advance ``dur_ns``, stopping at every due point (decisions, executor timer,
        graph deliveries) and, with ``timer``, every ``timer_ns`` to poll ``plan()``."""
        end = self.dev.now_ns() + int(dur_ns)
        self.apply_due()
        first = True
        while True:
            now = self.dev.now_ns()
            stop = end
            due = self.next_due()
            if due is not None and now < due < stop:
                stop = due
            tick = now + self.timer_ns if timer else None
            if tick is not None and tick < stop:
                stop = tick
            if busy:
                self.dev.run_busy(stop - now, phase=phase)
            elif first:
                self.dev.run_gap(stop - now, kind=kind, phase=phase)
            else:
                self.dev.advance_to(stop, phase=phase)
            first = False
            if stop >= end:
                self.apply_due()
                return
            if tick is not None and stop == tick:
                self.poll()
            self.apply_due()

    def gap(self, dur_ns: int, kind: str, phase: str, *, timer: bool = False) -> None:
        self._advance(dur_ns, kind, phase, timer=timer, busy=False)

    def kernel(self, seg: Segment, c: KernelCost, add_submission: bool) -> None:
        """Run one kernel. A decision due while it runs is applied at its instant: the
        kernel is split there (the simulator's kernel time is linear in its work)."""
        if self.recorded:
            if seg.dur_ns > 0:
                self._advance(seg.dur_ns, "kernel", seg.phase, timer=False, busy=True)
            return
        if c.is_noop:
            return
        if add_submission:
            self.gap(self.dev.profile.host_submission_ns, "inter_kernel", seg.phase)
        self.apply_due()
        left = 1.0
        while left > 0:
            now = self.dev.now_ns()
            full_ns = self.dev.kernel_ns(c.flops * left, c.bytes * left)
            due = self.next_due()
            # split only where time is linear in work: not under the kernel floor
            floor = self.dev.profile.kernel_floor_ns
            if due is not None and now + floor < due < now + full_ns - max(1_000, floor):
                frac = left * (due - now) / full_ns
                self.dev.run_kernel(c.op, c.flops * frac, c.bytes * frac, phase=seg.phase)
                left -= frac
            else:
                self.dev.run_kernel(c.op, c.flops * left, c.bytes * left, phase=seg.phase)
                left = 0.0
            self.apply_due()


def with_graphs(segments: Sequence[Segment]) -> list[Segment]:
    """The segments with each submit/sample stall carrying its graph id.

    The engine's timeline leaves stalls without a graph (``graph=-1``): a submit
    stall belongs to the graph whose first kernel follows it, a sample stall to the
    graph whose last kernel precedes it. Replay and oracle key events on graph ids,
    so they fill them in here (the recorded segments are not modified)."""
    out = list(segments)
    nxt = -1
    for i in range(len(out) - 1, -1, -1):
        s = out[i]
        if s.kind == "kernel":
            nxt = s.graph
        elif s.stall is StallKind.SUBMIT and s.graph < 0 and nxt >= 0:
            out[i] = dataclasses.replace(s, graph=nxt)
    prev = -1
    for i, s in enumerate(out):
        if s.kind == "kernel":
            prev = s.graph
        elif s.stall is StallKind.SAMPLE and s.graph < 0 and prev >= 0:
            out[i] = dataclasses.replace(s, graph=prev)
        elif s.stall is StallKind.IDLE:
            prev = -1
    return out


def _graphs(segments: Sequence[Segment]) -> dict[int, list[Segment]]:
    out: dict[int, list[Segment]] = {}
    for s in segments:
        if s.kind == "kernel":
            out.setdefault(s.graph, []).append(s)
    return out


def replay(
    segments: Sequence[Segment],
    controller: Controller,
    device: Any,
    *,
    seed: int = 0,
    granularity: str = "auto",
    timer_ns: int = 1_000_000,
    timing: str = "sim",
    plan_delay_ns: int = PLAN_DELAY_NS,
    plan_delays_ns: Mapping[int, int] | None = None,
    counters: bool = True,
    live_applied: Sequence[Applied] | None = None,
    live_begin_ns: Mapping[int, int] | None = None,
    live_log_cutoff_ns: Mapping[int, int] | None = None,
    graph_inputs_ns: Mapping[int, int] | None = None,
    plans_dropped: Collection[int] | None = None,
    reference: bool = False,
    hold: bool | None = None,
) -> ReplayResult:
    """Run ``segments`` through ``controller`` on ``device`` (a ``SimGpu``).

    Controllers other than ``default`` (``uses_device_governor``) run the device in
    userspace mode (its governor off). ``seed`` reseeds controllers that learn with
    randomness (``reseed(seed)``). ``granularity`` is ``auto`` (kernel when the trace
    has per-kernel timing), ``kernel``, ``layer`` or ``graph``: where the eval
    callback sees node boundaries, as live. ``timing``: ``sim`` re-times kernels on
    the simulator at the clock in effect; ``recorded`` keeps every recorded duration
    (pass-through, for comparing a replay with the live run it was recorded from).
    ``plan_delay_ns``: how long the planner takes from its wake-up to the plan (its
    ingest and solve). ``hold`` (default ``plan.HOLD_FOR_ENGINE``, as live, True): a
    graph's records wake the planner when the engine enters its next one-token
    decode, not at the graph's end, the counters it gets are read at its end, and each
    plan goes to the graph after the last one begun when it is set (``plan.retarget``;
    with ``plan_delays_ns`` only the latter, as the live run measured when it
    planned); False: at the graph's end, and a plan later than the next graph's first
    kernel is late.
    ``plan_delays_ns``: per graph id, the delay a live run measured from the graph's
    end (``PowerSession.record`` saves them), used instead where known.
    ``counters``: hand the controller the device's counters after each graph; False
    when the live run it is compared with had none (the simulated device's live loop
    runs on engine timing alone).
    ``live_applied`` + ``live_begin_ns`` (pass-through replays of a live recording):
    hand the controller the switches the live executor applied (placed on the
    replay's clock by each graph's DECODE_BEGIN) instead of the replay executor's own,
    so the controller sees exactly what it saw live; the replay executor's switches
    are still what the result reports, for comparing the two.
    ``live_log_cutoff_ns``: per graph, how long after its end the live planner read
    the executor's log (switches after that reach the controller with the next graph).
    ``graph_inputs_ns`` (with ``plan_delays_ns``): per graph, how long after its end
    the live planner handed it to the controller (its plan is set ``plan_delays_ns``
    after the end); a graph the live run planned no next graph for (its request's end
    reached the controller first) is handed over after REQUEST_END, one it planned for
    before it: the side of that race the live run was on. A plan solved after its
    request ended is dropped (never set), as the live governor does: those
    ``plans_dropped`` when given, else those whose request's end came before the set.
    With ``live_applied``, the replay's timer thread also wakes as late as the live one
    did for a deadline both executors had (same graph, same offset from DECODE_BEGIN):
    the live log carries each timer switch's deadline (``Applied.due_ns``); a deadline
    only the replay has fires on time. With ``timing="recorded"``, time the recording
    covers without a segment (a request's last sampling, its preparation) passes too.
    ``reference``: the per-kernel path throughout (see the module docstring); else the
    per-graph path where it applies (simulator timing on a simulator, kernel or graph
    granularity, no per-node events, no live log to follow). A segments list replayed
    again is recognised by identity (its prepared blocks are reused): do not modify
    it in between.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}")
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}")
    if not segments:
        raise ValueError("replay needs at least one segment")
    given_segments = segments
    segments = _shared_graphs(segments)
    if controller.reseed is not None:
        controller.reseed(seed)
    if not controller.uses_device_governor:
        device.governor = None
    timed, graphs = _shared_kernels(given_segments, segments)
    # each request's prompt tokens, which the live REQUEST_BEGIN carries
    prompt_tokens: dict[int, int] = {}
    for nodes in graphs.values():
        if nodes and nodes[0].phase == "prefill" and nodes[0].request >= 0:
            req = nodes[0].request
            prompt_tokens[req] = prompt_tokens.get(req, 0) + _batch_of(nodes)
    gran = ("kernel" if timed else "graph") if granularity == "auto" else granularity
    recorded = timing == "recorded"
    costs = NodeCosts()
    node_info = _shared_node_info(given_segments, segments)
    node_ids = _shared_node_ids(given_segments, segments)
    r = _Runner(controller, device, timer_ns, recorded=recorded)
    if not counters:
        r.on_counters = None
    if live_applied is not None:
        if live_begin_ns is None:
            raise ValueError("live_applied needs live_begin_ns (DECODE_BEGIN per graph)")
        r.use_live_log(list(live_applied), live_begin_ns, live_log_cutoff_ns or {})
    if graph_inputs_ns is not None and plan_delays_ns is not None:
        r._planned_live = set(plan_delays_ns) | set(plans_dropped or ())
    if plans_dropped is not None:
        r._dropped_live = set(plans_dropped)
    # the planner's timing, as live: graphs held until the next one-token decode
    # (``plan.HOLD_FOR_ENGINE``), unless the live run's measured delays are given
    r.mark_after = HOLD_FOR_ENGINE if hold is None else hold
    r.hold = r.mark_after and plan_delays_ns is None
    # the per-graph path: simulator timing on a simulator, no per-node events (offline
    # controllers), no live log to follow; ``reference`` keeps the per-kernel path
    per_graph = (
        not reference
        and not recorded
        and gran in ("kernel", "graph")
        and not r.node_events
        and live_applied is None
        and callable(getattr(device, "run_batch", None))
    )
    t_start = device.now_ns()
    e_start = device.energy_j
    sw_start = device.switches
    phase_start = dict(device.time_by_phase_ns)

    request = -1
    graph = -1
    in_graph = False
    prefill_open = False
    started = -1  # graph whose compute has started
    t_begin = 0
    ask_ns: list[int] = []
    done_ns: list[int] = []
    ordinal = 0

    def end_graph(last: bool = False) -> None:
        nonlocal in_graph, prefill_open
        if not in_graph:
            return
        in_graph = False
        now = device.now_ns()
        r.graph_end(graph, now)
        r.emit(EventKind.DECODE_END, graph=graph)
        if prefill_open:
            r.emit(EventKind.PREFILL_END, graph=graph)
            prefill_open = False
        nodes = graphs.get(graph, [])
        if started == graph and ask_ns:
            r.graph_compute_ns[graph] = now - ask_ns[0]
        if started == graph and nodes and ask_ns and r.on_graph is not None:
            info = node_info.get(graph)
            if info is None:
                info = node_info[graph] = _node_info(nodes, costs, node_ids)
            batch = _batch(graph, nodes, info, gran, t_begin, ask_ns, done_ns, now)
            delay = plan_delays_ns.get(graph, plan_delay_ns) if plan_delays_ns else plan_delay_ns
            given = graph_inputs_ns.get(graph) if graph_inputs_ns is not None else None
            r.graph_done(batch, delay, given, last=last)
        r.poll()

    def end_request() -> None:
        nonlocal request
        if request >= 0:
            end_graph(last=True)
            r.request_ended(False)
            r.emit(EventKind.REQUEST_END, detail=str(request))
            r.request_ended(True)
            r.poll()
            request = -1

    def begin_graph(seg: Segment) -> None:
        nonlocal graph, in_graph, prefill_open, t_begin, ordinal
        end_graph()
        graph, in_graph = seg.graph, True
        nodes = graphs.get(seg.graph, [])
        n_tokens = _batch_of(nodes)
        ask_ns.clear()
        done_ns.clear()
        ordinal = 0
        if seg.phase == "prefill":
            prefill_open = True
            r.emit(EventKind.PREFILL_BEGIN, graph=graph, n_tokens=n_tokens)
        r.graph_begin(graph, device.now_ns())
        t_begin = device.now_ns()
        r.graph_begin_ns[graph] = t_begin
        r.emit(EventKind.DECODE_BEGIN, graph=graph, n_tokens=n_tokens)
        r.entering_decode(n_tokens)

    def ask(nd: Segment) -> None:
        nonlocal ordinal
        now = device.now_ns()
        ask_ns.append(now)
        done_ns.append(-1)
        r.ex.on_node(ordinal, True, now)
        ordinal += 1
        r.ask(graph, nd)
        r.apply_due()

    def done() -> None:
        now = device.now_ns()
        done_ns[-1] = now
        r.ex.on_node(ordinal - 1, False, now)
        if r.node_events:
            r.emit(EventKind.NODE_DONE, graph=graph, node=ordinal - 1)
        r.apply_due()

    # ---- the per-graph path: the kernels between two points where something can
    # happen (a due point of the runner, an ask the executor acts on, a node done its
    # feedback acts on) run at once on the simulator (``SimGpu.run_batch``); the asks
    # and dones in between are noted, not called (they would do nothing). Everything
    # else goes through the per-kernel path above, so both give the same run.
    kg = gran == "kernel"

    def noted(
        blk: _Block,
        p: int,
        upto: int,
        t0: int,
        idx: np.ndarray,
        gaps: np.ndarray,
        ends: np.ndarray,
        p_asked: bool,
        ask_last: bool,
    ) -> None:
        """Items ``p..upto-1`` ran in the batch that began at ``t0`` (launched kernels
        ``idx``, gaps ``gaps``, completed ones ending at ``ends``): their asks and dones
        at the times the per-kernel path has them. ``p_asked``: item p was asked before.
        ``ask_last``: the last one is asked, not done (its done comes next)."""
        nonlocal ordinal
        if upto <= p:
            return
        js = np.arange(p, upto)
        m = np.searchsorted(idx, js)  # launched kernels before each item
        ends_x = np.concatenate(([t0], ends, [-1, -1]))
        prev = ends_x[m]
        real = ~blk.noop[p:upto]
        g = np.concatenate((gaps, [0]))[m]
        a = np.where(real, prev + g, prev)
        d = np.where(real, ends_x[np.minimum(m + 1, len(ends) + 1)], prev)
        if len(ends) < len(idx):  # the launched kernel at index len(ends) is not done
            d = np.where(real & (m >= len(ends)), -1, d)
        if ask_last:
            d[-1] = -1
        a_l, d_l = a.tolist(), d.tolist()
        if p_asked:
            done_ns[-1] = d_l[0]
            a_l, d_l = a_l[1:], d_l[1:]
        ask_ns.extend(a_l)
        done_ns.extend(d_l)
        last = int(blk.ordinal[upto - 1])
        ordinal = last + 1
        r.ex.note_asks(last)

    def fast(blk: _Block, p: int) -> int:
        """Run items ``p..`` of ``blk``; returns the segment index to go on from."""
        n = len(blk.first)
        phase = blk.phase
        f_p, b_p, g_p = float(blk.f[p]), float(blk.b[p]), int(blk.gap[p])
        asked = False  # item p was asked (its kernel is part way)
        while p < n:
            r.apply_due()
            now = device.now_ns()
            due = r.next_due()
            cut = r.ex.ask_cut() if kg else None
            fb = r.ex.feedback_from_ns() if kg else None
            fb_now = fb is not None and fb <= now
            if not asked and (
                blk.slow[p]
                or (cut is not None and blk.ordinal[p] >= cut)
                or (blk.noop[p] and fb_now)
            ):
                if g_p == int(blk.gap[p]):
                    return blk.first[p]
                r.gap(g_p, StallKind.INTER_KERNEL.value, phase)  # the rest of its stalls
                return blk.kseg[p]
            if due is not None and due <= now:
                raise AssertionError(f"replay: due point {due} left behind at {now}")
            if fb_now or (asked and fb is not None):
                q = p + 1
            else:
                q = int(blk.next_slow[p])
                if cut is not None:
                    q = p + int(np.searchsorted(blk.ordinal[p:q], cut))
                q = max(q, p + 1)
            stop = due
            if fb is not None and fb > now:
                stop = fb if stop is None else min(stop, fb)
            idx = blk.real[np.searchsorted(blk.real, p) : np.searchsorted(blk.real, q)]
            gaps = blk.gap[idx]
            if len(idx) == 0:
                noted(blk, p, q, now, idx, gaps, gaps, asked, False)
                p = q
                if p < n:
                    f_p, b_p, g_p = float(blk.f[p]), float(blk.b[p]), int(blk.gap[p])
                asked = False
                continue
            fs, bs = blk.f[idx], blk.b[idx]
            if idx[0] == p:
                fs, bs, gaps = fs.copy(), bs.copy(), gaps.copy()
                fs[0], bs[0], gaps[0] = f_p, b_p, g_p
            res = device.run_batch(fs, bs, gaps, phase=phase, stop_at_ns=stop)
            nd = res.n_done
            ends = np.asarray(res.end_ns[:nd], dtype=np.int64)
            partial = nd < len(idx)
            k = int(idx[nd]) if partial else q  # the first item not run through
            end = int(ends[-1]) if nd else None
            if end is not None and (
                (stop is not None and end >= stop) or (fb is not None and end >= fb)
            ):
                # its done (and what is due first) can act: the per-kernel path for it,
                # and for the no-ops after it
                last = int(idx[nd - 1])
                if kg:
                    noted(blk, p, last + 1, now, idx, gaps, ends, asked, True)
                r.apply_due()
                if kg:
                    done()
                    for j in range(last + 1, k):
                        ask(segments[blk.kseg[j]])
                        done()
                p, asked = k, False
                if p < n:
                    f_p, b_p, g_p = float(blk.f[p]), float(blk.b[p]), int(blk.gap[p])
                continue
            if not partial:
                if kg:
                    noted(blk, p, q, now, idx, gaps, ends, asked, False)
                p, asked = q, False
                if p < n:
                    f_p, b_p, g_p = float(blk.f[p]), float(blk.b[p]), int(blk.gap[p])
                continue
            started_k = res.work_left < 1.0
            if kg:
                noted(blk, p, k + (1 if started_k else 0), now, idx, gaps, ends, asked, started_k)
            f_k, b_k = float(fs[nd]), float(bs[nd])
            if started_k:
                f_p, b_p, g_p = f_k * res.work_left, b_k * res.work_left, 0
            else:
                f_p, b_p, g_p = f_k, b_k, int(res.gap_left_ns)
            asked = started_k or (asked and k == p)
            p = k
        return blk.kseg[n - 1] + 1

    entry = (
        _shared_blocks(
            given_segments,
            segments,
            gran,
            int(getattr(getattr(device, "profile", None), "host_submission_ns", 0) or 0),
        )
        if per_graph
        else {}
    )

    rec_end: int | None = None  # recorded end of the previous segment
    si = 0
    n_segs = len(segments)
    while si < n_segs:
        seg = segments[si]
        at = entry.get(si)
        if at is not None:
            blk, j = at
            if (
                in_graph
                and graph == blk.graph == started
                and (blk.request < 0 or blk.request == request)
                and (not kg or ordinal == blk.ordinal[j])
            ):
                nxt = fast(blk, j)
                if nxt != si:  # else item j goes through the per-kernel path
                    si = nxt
                    continue
        si += 1
        if seg.request >= 0 and seg.request != request and seg.stall is not StallKind.IDLE:
            end_request()
            request = seg.request
            r.request_begin[request] = device.now_ns()
            r.token_times[request] = []
            r.emit(
                EventKind.REQUEST_BEGIN, detail=str(request), n_tokens=prompt_tokens.get(request, 0)
            )
        hole = seg.t_ns - rec_end if recorded and rec_end is not None else 0
        rec_end = seg.t_ns + seg.dur_ns
        if hole > 0:
            # time the recording covers with no segment: a request's last sampling
            # (decode end to REQUEST_END) and its preparation (REQUEST_BEGIN to its first
            # decode). Pass-through keeps it, so REQUEST_END and REQUEST_BEGIN (and the
            # plans they answer with) reach the controller when they did live.
            end_graph(last=seg.stall is StallKind.IDLE)
            r.gap(hole, StallKind.SAMPLE.value, seg.phase, timer=True)
        if seg.kind == "stall":
            kind = seg.stall or StallKind.IDLE
            if kind is StallKind.IDLE:
                end_request()
                r.emit(EventKind.IDLE)
                r.gap(seg.dur_ns, kind.value, seg.phase, timer=True)
            elif kind is StallKind.SUBMIT:
                begin_graph(seg)
                r.gap(seg.dur_ns, kind.value, seg.phase)
            elif kind is StallKind.INTER_KERNEL:  # the recording's (or the phone's) host gap
                r.gap(seg.dur_ns, kind.value, seg.phase)
            else:  # SAMPLE
                end_graph()
                r.emit(EventKind.SAMPLE_BEGIN, graph=graph, token=seg.token)
                r.gap(seg.dur_ns, kind.value, seg.phase, timer=True)
                r.emit(EventKind.SAMPLE_END, graph=graph, token=seg.token)
                r.emit(EventKind.TOKEN, graph=graph, token=seg.token)
                if request >= 0:
                    r.token_times[request].append(device.now_ns())
            continue
        if not in_graph or seg.graph != graph:
            begin_graph(seg)
        nodes = graphs.get(seg.graph, [])
        if started != seg.graph:
            started = seg.graph
            if gran == "graph":  # the scheduler's scan: every ask at compute start
                for nd in nodes:
                    ask(nd)
            r.poll()
        if gran == "kernel":
            ask(seg)
        elif gran == "layer" and (ordinal == 0 or _is_layer_out(nodes[ordinal - 1].name)):
            # the scan up to and including the next layer output, then its compute
            i = ordinal
            while i < len(nodes):
                ask(nodes[i])
                i += 1
                if _is_layer_out(nodes[i - 1].name):
                    break
        c = cost(seg.op, seg.shape)
        r.kernel(seg, c, add_submission=gran != "kernel" or not seg.timed)
        if gran == "kernel" or (gran == "layer" and _is_layer_out(seg.name)):
            done()
    end_request()
    r.deliver_graphs()
    r.wait_idle()
    res = _result(controller, device, r, gran, t_start, e_start, sw_start)
    res.time_by_phase_ns.update(
        {ph: ns - phase_start.get(ph, 0) for ph, ns in device.time_by_phase_ns.items()}
    )
    return res


@dataclass
class _Block:
    """A run of one graph's kernels (and the inter-kernel stalls between them) that the
    per-graph path can run with ``SimGpu.run_batch``. Item ``j`` is one kernel with the
    host gap before it: at kernel granularity every kernel (no-ops too: they are asked
    and done), at graph granularity the launched ones only (the asks came with the
    scan; a no-op's stalls join the next kernel's gap, as does the simulator's host
    submission cost)."""

    graph: int
    phase: str
    request: int
    first: list[int]  # segment index where item j's segments begin (its stalls)
    kseg: list[int]  # segment index of item j's kernel
    gap: np.ndarray  # int64: host gap before item j's kernel
    f: np.ndarray
    b: np.ndarray
    noop: np.ndarray  # bool
    slow: np.ndarray  # bool: item j goes through the per-kernel path
    ordinal: np.ndarray  # int64: item j's node ordinal in its graph (kernel granularity)
    real: np.ndarray = field(init=False)  # indices of the launched kernels
    next_slow: np.ndarray = field(init=False)  # first slow item at or after j (n: none)

    def __post_init__(self) -> None:
        n = len(self.first)
        self.real = np.flatnonzero(~self.noop)
        idx = np.where(self.slow, np.arange(n), n)
        self.next_slow = np.minimum.accumulate(idx[::-1])[::-1] if n else idx


# the last trace replayed (the benchmark replays one trace through every controller):
# (the caller's segments list, ``with_graphs`` of it, {(granularity, submission): blocks})
_SHARED: tuple[Sequence[Segment], list[Segment], dict[Any, Any]] | None = None


def _shared_graphs(segments: Sequence[Segment]) -> list[Segment]:
    """``with_graphs(segments)``, kept for the last segments list given (matched by
    identity: do not modify a list after replaying it)."""
    global _SHARED
    if _SHARED is None or _SHARED[0] is not segments:
        _SHARED = (segments, with_graphs(segments), {})
    return _SHARED[1]


def _shared_node_info(given: Sequence[Segment], segments: list[Segment]) -> dict[int, _NodeInfo]:
    """Per graph of the last segments list given: ``_node_info``, filled as replays
    reach each graph (a fresh dict for another list)."""
    if _SHARED is None or _SHARED[0] is not given or _SHARED[1] is not segments:
        return {}
    return _SHARED[2].setdefault("node_info", {})  # type: ignore[no-any-return]


def _shared_kernels(
    given: Sequence[Segment], segments: list[Segment]
) -> tuple[bool, dict[int, list[Segment]]]:
    """Whether every kernel is timed, and each graph's kernels (``_graphs``), of the
    last segments list given (read-only: shared by its replays); built afresh for
    another."""
    if _SHARED is None or _SHARED[0] is not given or _SHARED[1] is not segments:
        return _timed_and_graphs(segments)
    cache = _SHARED[2]
    if "kernels" not in cache:
        cache["kernels"] = _timed_and_graphs(segments)
    return cache["kernels"]  # type: ignore[no-any-return]


def _timed_and_graphs(segments: Sequence[Segment]) -> tuple[bool, dict[int, list[Segment]]]:
    return all(s.timed for s in segments if s.kind == "kernel"), _graphs(segments)


def _shared_node_ids(given: Sequence[Segment], segments: list[Segment]) -> dict[tuple, Any]:
    """``_node_info``'s cache by the nodes' (op, shape object, name) for the last
    segments list given (it holds every keyed shape alive); a fresh dict for another."""
    if _SHARED is None or _SHARED[0] is not given or _SHARED[1] is not segments:
        return {}
    return _SHARED[2].setdefault("node_ids", {})  # type: ignore[no-any-return]


def _shared_blocks(
    given: Sequence[Segment], segments: list[Segment], gran: str, submission_ns: int
) -> dict[int, tuple[_Block, int]]:
    """``_blocks`` of the last segments list given, once per granularity."""
    if _SHARED is None or _SHARED[0] is not given or _SHARED[1] is not segments:
        return _blocks(segments, gran, submission_ns)
    cache = _SHARED[2]
    key = (gran, submission_ns)
    if key not in cache:
        cache[key] = _blocks(segments, gran, submission_ns)
    return cache[key]  # type: ignore[no-any-return]


def prepare(segments: Sequence[Segment], device: Any, granularity: str = "auto") -> None:
    """Build what ``replay(segments, ..., device)`` at ``granularity`` shares between
    runs of the same trace (its per-graph blocks, every graph's node costs), e.g.
    before forking workers."""
    segs = _shared_graphs(segments)
    timed, graphs = _shared_kernels(segments, segs)
    gran = granularity
    if gran == "auto":
        gran = "kernel" if timed else "graph"
    if gran in ("kernel", "graph"):
        sub = int(getattr(getattr(device, "profile", None), "host_submission_ns", 0) or 0)
        _shared_blocks(segments, segs, gran, sub)
    # every graph's node costs, in trace order, as the first replay would fill them
    node_info = _shared_node_info(segments, segs)
    node_ids = _shared_node_ids(segments, segs)
    costs = NodeCosts()
    for graph, nodes in graphs.items():
        if graph not in node_info:
            node_info[graph] = _node_info(nodes, costs, node_ids)


def _blocks(
    segments: Sequence[Segment], gran: str, submission_ns: int
) -> dict[int, tuple[_Block, int]]:
    """Every batchable item by the segment index its segments begin at."""
    costs: dict[tuple[str, int], KernelCost] = {}  # by (op, id(shape)): shapes are shared
    shapes: list[Any] = []  # keeps every keyed shape alive while the ids are keys
    per_graph: dict[int, int] = {}  # kernels of each graph seen so far (ordinals)
    out: dict[int, tuple[_Block, int]] = {}
    kernel_gran = gran == "kernel"
    inter = StallKind.INTER_KERNEL
    # the open block: its (graph, phase, request) and its items' columns
    cur: tuple[int, str, int] | None = None
    first: list[int] = []
    kseg: list[int] = []
    gaps: list[int] = []
    fl: list[float] = []
    by: list[float] = []
    noops: list[bool] = []
    slows: list[bool] = []
    ords: list[int] = []
    start = -1  # first segment of the pending item
    pend_gap = 0

    def close() -> None:
        nonlocal cur, first, kseg, gaps, fl, by, noops, slows, ords
        if cur is not None and first:
            blk = _Block(
                cur[0],
                cur[1],
                cur[2],
                first,
                kseg,
                np.asarray(gaps, dtype=np.int64),
                np.asarray(fl, dtype=np.float64),
                np.asarray(by, dtype=np.float64),
                np.asarray(noops, dtype=bool),
                np.asarray(slows, dtype=bool),
                np.asarray(ords, dtype=np.int64),
            )
            for j, s in enumerate(first):
                out[s] = (blk, j)
        cur = None
        first, kseg, gaps, fl, by, noops, slows, ords = [], [], [], [], [], [], [], []

    for i, s in enumerate(segments):
        if s.kind == "kernel":
            g = s.graph
            ordn = per_graph.get(g, 0)
            per_graph[g] = ordn + 1
            if cur is None or cur[0] != g or cur[1] != s.phase or cur[2] != s.request:
                close()
                cur = (g, s.phase, s.request)
            key = (s.op, id(s.shape))
            c = costs.get(key)
            if c is None:
                c = costs[key] = cost(s.op, s.shape)
                shapes.append(s.shape)
            is_noop = c.is_noop
            if not kernel_gran and is_noop:
                continue  # its stalls join the next launched kernel's gap
            gap = pend_gap + (0 if is_noop or (kernel_gran and s.timed) else submission_ns)
            first.append(start if start >= 0 else i)
            kseg.append(i)
            gaps.append(gap)
            fl.append(c.flops)
            by.append(c.bytes)
            noops.append(is_noop)
            slows.append(kernel_gran and ((is_noop and gap > 0) or not s.timed))
            ords.append(ordn)
            start, pend_gap = -1, 0
            continue
        if s.stall is inter and (cur is None or (cur[1] == s.phase and cur[2] == s.request)):
            if start < 0:
                start = i
            pend_gap += int(s.dur_ns)
            continue
        close()
        start, pend_gap = -1, 0
    close()
    return out


def _is_layer_out(name: str) -> bool:
    return name.startswith(LAYER_OUT_PREFIX_STR)


_NodeInfo = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]


def _node_info(
    nodes: list[Segment], costs: NodeCosts, by_ids: dict[tuple, Any] | None = None
) -> _NodeInfo:
    """A graph's node costs (compute ns, memory ns, launch), its layer outputs and its
    batch size: the same in every replay of the trace (read-only: shared by them).
    Graphs of one shape share the very same arrays, as the live ingest hands them out
    (the planner keys its per-shape work on their identity). ``by_ids``: a cache by
    each node's (op, shape object, name), which a recording's shared shapes make
    cheap to key (the caller keeps the keyed shapes alive); equal keys there mean
    equal keys by value, so the same arrays."""
    ids = None
    if by_ids is not None:
        ids = tuple([(nd.op, id(nd.shape), nd.name) for nd in nodes])
        hit = by_ids.get(ids)
        if hit is not None:
            return (*hit, _batch_of(nodes))
    key = tuple((nd.op, nd.shape, _is_layer_out(nd.name)) for nd in nodes)
    got = costs.by_nodes.get(key)
    if got is None:
        cmx = np.array([costs.of(op, shape) for op, shape, _ in key], dtype=np.float64)
        layer_out = np.array([out for _, _, out in key], dtype=bool)
        c, m, launch = (np.ascontiguousarray(cmx[:, j]) for j in range(3))
        got = (c, m, launch, layer_out)
        for a in got:
            a.setflags(write=False)
        if len(costs.by_nodes) < 4096:
            costs.by_nodes[key] = got
    if ids is not None and len(by_ids) < 4096:  # type: ignore[arg-type]
        by_ids[ids] = got  # type: ignore[index]
    return (*got, _batch_of(nodes))


def _batch(
    graph: int,
    nodes: list[Segment],
    info: _NodeInfo,
    gran: str,
    t_begin: int,
    ask_ns: list[int],
    done_ns: list[int],
    t_end: int,
) -> GraphBatch:
    c_ns, m_ns, launch, layer_out, n_tokens = info
    n = len(ask_ns)
    if n != len(c_ns):  # a graph cut short: its asked nodes only
        c_ns, m_ns, launch, layer_out = c_ns[:n], m_ns[:n], launch[:n], layer_out[:n]
    return GraphBatch(
        graph=graph,
        phase="prefill" if nodes[0].phase == "prefill" else "decode",
        n_tokens=n_tokens,
        granularity=gran,
        t_begin_ns=t_begin,
        t_first_ns=ask_ns[0],
        t_end_ns=t_end,
        ask_ns=np.asarray(ask_ns, dtype=np.int64),
        # no completion seen (``graph`` granularity): the ingest's own shared array, as
        # live, so the planner skips the same pass over it
        done_ns=(
            none_done(n)
            if gran == "graph" and max(done_ns, default=-1) < 0
            else np.asarray(done_ns, dtype=np.int64)
        ),
        c_ns=c_ns,
        m_ns=m_ns,
        launch=launch,
        layer_out=layer_out,
    )


def _batch_of(nodes: list[Segment]) -> int:
    """Tokens in a graph's batch, as the live DECODE_BEGIN gives them: the columns of
    its first matrix multiply's input, summed over the micro-batches the batch was
    split into (each runs that multiply once: a 968-token prompt in micro-batches of
    512 is 512 + 456)."""
    first = None
    total = 0
    for nd in nodes:
        if nd.op.upper() == "MUL_MAT" and nd.shape is not None and nd.shape.src1_ne:
            if first is None:
                first = nd.name
            if nd.name == first:
                total += int(nd.shape.src1_ne[1])
    return max(total, 1)


def _result(
    controller: Controller, device: Any, r: _Runner, gran: str, t0: int, e0: float, sw0: int
) -> ReplayResult:
    duration_s = (device.now_ns() - t0) * 1e-9
    energy = device.energy_j - e0
    latency = per_request(r.token_times, r.request_begin)
    ttft_ms, tpot_ms = pooled_ms(latency)
    tokens = sum(len(t) for t in r.token_times.values())
    us = tuple(t / 1e3 for t in r.times_ns)
    switches = device.switches - sw0
    ordered = sorted(us)
    return ReplayResult(
        controller=getattr(controller, "name", type(controller).__name__),
        device=device.name,
        tokens=tokens,
        requests=len(r.token_times),
        energy_j=energy,
        energy_per_token_j=energy / tokens if tokens else float("nan"),
        duration_s=duration_s,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        tokens_per_s=tokens / duration_s if duration_s > 0 else float("nan"),
        switches=switches,
        switches_per_s=switches / duration_s if duration_s > 0 else 0.0,
        decisions=len(us),
        decision_us_median=statistics.median(us) if us else 0.0,
        decision_us_p99=ordered[int(0.99 * (len(ordered) - 1))] if us else 0.0,
        energy_by_phase_j=dict(device.energy_by_phase_j),
        decision_us=us,
        granularity=gran,
        applied=tuple(r.ex.log),
        plans=r.plans,
        late_plans=r.ex.status.late_plans,
        mismatches=r.ex.status.mismatches,
        graph_us_median=statistics.median(r.graph_times_ns) / 1e3 if r.graph_times_ns else 0.0,
        graph_begin_ns=dict(r.graph_begin_ns),
        graph_compute_ns=dict(r.graph_compute_ns),
        requests_latency=latency,
    )
