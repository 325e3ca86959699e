"""The live loop: engine events and graph records in, plans to the executor, switches out.

Who does what, live (docs/architecture.md, "The live loop"):

* **Engine thread, inline** (``on_event``, ``on_decode_begin``, ``on_decode_end``): the
  controller sees the Python events (request, decode begin/end, sample, token, idle);
  request boundaries may answer with an immediate switch or a small plan. At the end
  of each ``llama_decode`` the executor is told the graph ended and the graph's raw
  records are queued for the worker -- no per-node Python work on the decode path.
* **Worker thread**: turns the records into a :class:`GraphBatch` (numpy), hands the
  controller the switches the executor applied and the device counters, and sets the
  plan the controller solves for the next graph. This runs during the sampling
  stall; a plan that is not ready when the next graph starts is late, and the
  executor keeps going without it (``fallback_level``).
* **Executor** (``hooks/ti_exec.c`` through ``engine.executor``, or the Python
  ``ThreadedExecutor`` when the native library is missing): fires the plan's switches
  inside ``llama_decode`` -- node-keyed from the eval callback, time-keyed from its
  timer thread -- through an actuator opened once.
* **Timer thread**: only for timed ``Decision``s of baselines that return them.

Health: if the device or the executor fails (a write error, the device gone), the
governor stops the executor, restores the snapshot it took at start (the device's
default governor and range), stops steering, keeps accepting events so generation goes
on, and reports the error in ``health()``. Missing counters degrade, they do not
disable: the controller then runs on engine timing alone (``feedback: engine-only``).
"""

from __future__ import annotations

import _thread
import bisect
import dataclasses
import logging
import statistics
import threading
import time
from collections import Counter, deque
from typing import Any

from .._clock import now_ns
from ..devices.base import DeviceError, DeviceState, GpuDevice, Unsupported
from ..engine.events import Event, EventKind
from ..engine.hooks import HookError, NativeHook
from .base import Controller, Decision
from .graph_batch import GraphBatch, NodeCosts, batch_from_records, records_array
from .live_executor import LiveExecutor, make_executor
from .plan import HOLD_FOR_ENGINE, Applied, Plan, after

log = logging.getLogger(__name__)

_PLAN_EVENTS = (EventKind.DECODE_END, EventKind.REQUEST_END, EventKind.IDLE)
_BOUNDARIES = (EventKind.REQUEST_BEGIN, EventKind.REQUEST_END, EventKind.IDLE)


class Governor:
    """Drive ``device`` with ``controller`` from live events (see module docstring).

    ``record_only``: the device is the simulator; the executor records its switches
    (for applied-energy accounting) and nothing is written anywhere."""

    # Decode graphs: True (default, ``plan.HOLD_FOR_ENGINE``) plans each while the next
    # decode runs (GIL free, another core), for the graph after the one begun
    # (``plan.retarget``: two ahead); False plans it at once after its end, in the
    # engine's stall between decodes, in time for the next graph, but there the planner
    # holds the GIL the engine's sampling needs. See ``_work``.
    HOLD_FOR_ENGINE = HOLD_FOR_ENGINE
    # A prompt batch's graph is planned in the first one-token decode after it, never
    # between the prompt and the first token (issue 14's TTFT)
    HOLD_PROMPTS = True
    # ... except where the planner's CPU per graph is at most this fraction of the
    # graph period: then its contention in the stall costs at most that much
    # throughput, and plans come in time
    EAGER_PLAN_FRACTION = 0.01
    # The stalls' CPU time is read at every this many-th stall only: a thread-CPU clock
    # read costs the engine thread ~9 us after a decode (a syscall, cold), twice per
    # stall, for a slow moving average
    STALL_CPU_EVERY = 4

    def __init__(
        self,
        controller: Controller,
        device: GpuDevice,
        *,
        timer: bool = True,
        clock: Any = now_ns,
        record_only: bool = False,
        granularity: str = "graph",
        native: bool = True,
    ) -> None:
        self.controller = controller
        self.device = device
        self._clock = clock
        # _lock: the decision queue, executor calls from Python, switch bookkeeping
        # (held briefly, also by the engine thread); _ctl_lock: controller learning
        # (on_applied, on_counters, on_graph), taken only by the planner thread
        self._lock = threading.RLock()
        self._ctl_lock = threading.Lock()
        self._pending_applied: list[tuple[int, int]] = []
        self._queue: list[tuple[int, int, Decision]] = []
        self._seq = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._use_timer = timer
        self._record_only = record_only
        self._granularity = granularity
        self._native = native
        self._snapshot: DeviceState | None = None
        self._steering = not controller.uses_device_governor
        self._on_counters = controller.on_counters
        self._on_graph = controller.on_graph
        self._on_applied = controller.on_applied
        # counters read at each decode's end on the engine thread (no on_graph to
        # take them with the graph's records)
        self._counters_inline = self._on_counters is not None and self._on_graph is None
        # the kinds on_event handles: the controller's (control.base), the request
        # boundaries (a plan solved across one is dropped) and, for inline counters,
        # each decode's end
        self._ctl_kinds = frozenset(controller.event_kinds)
        self.event_kinds = (
            self._ctl_kinds
            | frozenset(_BOUNDARIES)
            | ({EventKind.DECODE_END} if self._counters_inline else set())
        )
        self.levels_hz = sorted(int(h) for h in device.frequencies_hz())
        self.executor: LiveExecutor | None = None
        self.failed = False
        self.error: str | None = None
        self.fallback: str | None = None
        # the simulator's counters describe its own replays, not this live run
        self.feedback = "engine-only" if record_only else "counters"
        self.applied = 0
        self.events = 0
        self.graphs = 0
        self.levels_used: Counter[int] = Counter()
        self.applied_log: list[tuple[int, int]] = []  # (t_ns, level), kept for accounting
        self.applied_entries: deque[Applied] = deque(maxlen=200_000)
        # graph -> ns from its end until its plan was set (replay models the same delay)
        self.plan_delay_ns: dict[int, int] = {}
        # graph -> the last switch handed to the controller before its planning, as ns
        # from the graph's end (the log is in time order: replay hands it the same ones)
        self.log_cutoff_ns: dict[int, int] = {}
        self._drained_upto_ns: int | None = None  # t_ns of the last switch drained
        # graph -> ns from its end until the planner handed it to the controller
        self.graph_input_ns: dict[int, int] = {}
        # graphs whose plan was solved after their request ended (a request boundary
        # reached the engine thread after the graph's end): dropped, never set
        self.plans_dropped: set[int] = set()
        self._boundary_ns = -1  # t_ns of the last request boundary event seen
        self._begun_graph = -1  # the last graph the engine began (DECODE_BEGIN)
        self._decision_ns: list[int] = []
        self._graph_ns: list[int] = []  # wall time of ingest + solve
        self._graph_cpu_ns: list[int] = []  # the worker's CPU time for it
        # ... of which (the records' ingest into a GraphBatch, the controller's on_graph:
        # learning and the plan's solve), per graph: the decision time
        self._cpu_parts_ns: list[tuple[int, int]] = []
        self._plan_wait_ns: list[int] = []  # from the graph's end until the worker began
        self._costs = NodeCosts()
        # graphs waiting for the planner (appended by the engine thread, which never
        # wakes the planner at a graph's end: see _work)
        self._pending_graphs: deque[tuple[Any, int, int, int, int, Any]] = deque()
        # wakes the planner; through the native hook once bound (bind_hook)
        self._go: _Wakeup | _HookWakeup = _Wakeup()
        self._worker: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        # graphs whose planning waited for the engine to leave Python ("held"), or
        # began at their end (HOLD_FOR_ENGINE False, or stalls with room: "eager")
        self.plan_holds: Counter[str] = Counter(held=0, eager=0)
        # The engine's stalls between decodes: how long it spends in them off the CPU
        # (moving average; a phone's GPU sync or a sleeping logits processor leaves
        # the GIL free), against the planner's CPU per graph (moving average). Where
        # the stalls have room for twice the planner's work, graphs are planned at
        # once in them, in time for the next graph (see _work).
        self._stall_thread: int | None = None
        self._stall_t0 = 0
        self._stall_cpu0 = 0
        self._stall_idle_ns = 0
        self._stalls_seen = 0
        self._plan_cpu_ns = 0
        self._period_ns = 0  # graph end to graph end (moving average)
        top = len(self.levels_hz) - 1
        self._cap_level = top  # thermal cap, as a level (see _check_cap)
        self._last_plan: Plan | None = None
        obs = getattr(device, "observe_cap_hz", None)
        self._observe_cap = obs if callable(obs) and not record_only else None
        self._standin_share: float | None = None  # the clock stand-in (tests only)

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> Governor:
        if not self._record_only:
            try:
                self._snapshot = self.device.snapshot()
            except (DeviceError, OSError) as e:
                self._fail(e, restore=False)
                return self
        if not self._steering:
            return self
        try:
            self.executor = make_executor(
                self.device, self.levels_hz, record_only=self._record_only, native=self._native
            )
        except (DeviceError, OSError) as e:
            self._fail(e)
            return self
        if self._on_graph is not None:
            self._worker = threading.Thread(
                target=self._work, name="turboinfer-planner", daemon=True
            )
            self._worker.start()
        if self._use_timer:
            self._thread = threading.Thread(
                target=self._timer_loop, name="turboinfer-governor", daemon=True
            )
            self._thread.start()
        return self

    def bind_hook(self, hook: Any) -> None:
        """Let the executor see the eval callback's node boundaries (native hook and
        native executor), so node-keyed plans can run; otherwise plans are time-keyed.
        With the native hook, the planner is woken from inside the next one-token
        ``llama_decode`` (its first node) instead of by the engine thread before it."""
        if self._worker is not None and isinstance(hook, NativeHook):
            try:
                wake = _HookWakeup(hook)
            except HookError as e:
                log.info("the planner is woken by the engine thread: %s", e)
            else:
                old, self._go = self._go, wake
                old.set()  # a planner waiting on the old wake moves to the new one
        ex = self.executor
        if ex is not None and ex.attach(hook):
            return
        self._granularity = "graph"

    def close(self) -> None:
        """Stop the executor and the threads, then put the device back as found. No
        switch can land after the restore: the executor is joined first."""
        self._stop.set()
        self._wake.set()
        self._go.set()
        if self.executor is not None:
            self.executor.stop()
        for t in (self._thread, self._worker):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2.0)
        if isinstance(self._go, _HookWakeup):  # the hook is freed after us: let it go
            self._go = _Wakeup()
            self._go.set()
        self._collect_log()
        with self._lock:
            if self._snapshot is not None and not self.failed:
                try:
                    self.device.restore(self._snapshot)
                except (DeviceError, OSError) as e:
                    log.warning("could not restore %s on close: %s", self.device.name, e)
        if self.executor is not None:
            self.executor.close()

    def __enter__(self) -> Governor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- engine thread ---------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """Handle one engine event on the caller's thread. The controller's
        ``on_event`` runs without waiting for the planner: controllers keep it to
        timestamps and small decisions, and learn in ``on_graph`` (see control/base.py)."""
        kind = event.kind
        if kind not in self.event_kinds:
            return
        with self._lock:
            self.events += 1
            if kind in _BOUNDARIES:
                self._boundary_ns = max(self._boundary_ns, event.t_ns)
            if self.failed:
                return
            if self._queue:  # nothing is due from an empty queue: no clock read
                self._apply_due(self._clock())
            steering = self._steering
        counters = steering and self._counters_inline and kind is EventKind.DECODE_END
        if counters:
            self._read_counters()
        if kind not in self._ctl_kinds:  # a boundary, or a decode's end for counters
            return
        if not steering:
            self.controller.on_event(event)
            return
        t0 = time.perf_counter_ns()
        d = self.controller.on_event(event)
        timed = (
            self.controller.plan(event.t_ns)
            if isinstance(d, Decision) or event.kind in _PLAN_EVENTS
            else None
        )
        self._decision_ns.append(time.perf_counter_ns() - t0)
        if len(self._decision_ns) > 100_000:
            del self._decision_ns[:50_000]
        if d is None and not timed and not self._queue:
            return  # most events (sample, token, decode begin): nothing to hand over
        with self._lock:
            if isinstance(d, Plan):
                self._set_plan(d)
            if timed:
                self._queue = []
                for p in timed:
                    self._push(p)
            if isinstance(d, Decision):
                self._push(d)
            self._apply_due(self._clock())

    def on_decode_begin(self, graph: int) -> None:
        self._begun_graph = graph
        ex = self.executor
        if ex is not None and not self.failed:
            if self._observe_cap is not None and ex.native:
                self._check_cap(ex)
            ex.graph_begin(graph)

    def entering_decode(self, n_tokens: int = 1) -> None:
        """The engine thread calls ``llama_decode`` now (it leaves Python, the GIL is
        free until it returns): the planner may run (``_work``), unless this is a
        prompt's batch (``n_tokens`` > 1), which llama.cpp computes on
        ``n_threads_batch`` threads, every core by default: there the planner would
        take a core from it (issue 14's TTFT). Its graphs wait for the first decode."""
        if self._pending_graphs and n_tokens <= 1:
            self._go.arm()
        if self._stall_thread == threading.get_ident():
            # the stall just ended: the part of it the engine spent off the CPU (a
            # sleep, a GPU sync; also time preempted), on the same thread only
            wall = now_ns() - self._stall_t0
            idle = wall - (time.thread_time_ns() - self._stall_cpu0)
            self._stall_idle_ns += (idle - self._stall_idle_ns) // 4
        self._stall_thread = None

    def engine_idle(self) -> None:
        """The engine's request ended. Its last graphs are not planned now (a plan for
        an ended request is dropped anyway; the controller learns from them at the
        next decode): a client's next request usually follows at once, and its prompt
        batch would share the cores with the planner."""
        # the pause until the next request is neither a stall nor part of a period
        self._stall_thread = None
        self._stall_t0 = 0

    def _check_cap(self, ex: LiveExecutor) -> None:
        """A cap written into the device's own max (a thermal daemon) while the native
        executor, not the backend, does the writing: read it before each graph (one
        sysfs read) and keep every later switch at or below it."""
        cur = ex.cur_level()
        written = self.levels_hz[cur] if cur >= 0 else None
        try:
            cap_hz = self._observe_cap(written)  # type: ignore[misc]
        except (DeviceError, OSError) as e:
            with self._lock:
                self._fail(e)
            return
        cap = max(0, bisect.bisect_right(self.levels_hz, int(cap_hz)) - 1)
        if cap == self._cap_level:
            return
        with self._lock:
            self._cap_level = cap
            if self._last_plan is not None:
                self._set_plan(self._last_plan)  # re-set, clamped
            if cur > cap:
                ex.switch_now(cap)

    def enable_clock_standin(self, memory_share: float = 0.0) -> None:
        """TESTS AND BENCHMARKS ONLY (``control/clock_standin.py``): each graph then
        takes the time it would take at the levels the executor applied. The executor
        refuses it for hardware actuators (``ExecutorError``)."""
        ex = self.executor
        if ex is not None:
            ex.enable_standin(memory_share)
            self._standin_share = float(memory_share)

    def compute_begin(self) -> None:
        """Right before ``llama_decode``, on its thread: the clock stand-in's start
        (tests only)."""
        ex = self.executor
        if self._standin_share is not None and ex is not None and not self.failed:
            ex.standin_begin()

    def graph_end(self) -> int:
        """Right after ``llama_decode`` returns: the clock stand-in's wait when it is
        on (tests only), then the executor's end of graph. Returns the decode's end
        (ns, after the stand-in's wait), where the end-of-graph switch lands."""
        ex = self.executor
        if self._standin_share is not None and ex is not None and not self.failed:
            ex.standin_wait()
        t = now_ns()
        if self._stall_t0:
            self._period_ns += (t - self._stall_t0 - self._period_ns) // 4
        self._stall_t0 = t
        self._stalls_seen += 1
        if self._stalls_seen % self.STALL_CPU_EVERY == 0:
            self._stall_thread = threading.get_ident()
            self._stall_cpu0 = time.thread_time_ns()
        else:
            self._stall_thread = None
        if ex is not None and not self.failed:
            ex.graph_end()
        return t

    def on_decode_end(
        self, raw: Any, *, graph: int, n_tokens: int, t_begin_ns: int, t_end_ns: int
    ) -> None:
        """The graph's records (raw, from the hook's ring) go to the planner."""
        ex = self.executor
        if ex is None or self.failed:
            return
        if self._worker is not None and raw is not None and len(raw):
            self._idle.clear()
            counters: Any = None
            if (
                self.HOLD_FOR_ENGINE
                and self._on_counters is not None
                and self.feedback != "engine-only"
            ):
                # sampled now: a held graph is planned during the next one, and counters
                # read then would mix the two graphs' busy time (the model's fit needs
                # each graph's own)
                try:
                    counters = self.device.read_counters()
                except (DeviceError, OSError) as e:
                    counters = e  # the planner handles it as its own read's failure
            self._pending_graphs.append((raw, graph, n_tokens, t_begin_ns, t_end_ns, counters))
            if n_tokens > 1 and self.HOLD_PROMPTS:
                held = True  # planned in the first one-token decode (TTFT)
            else:
                held = (
                    self.HOLD_FOR_ENGINE
                    and self._stall_idle_ns <= 2 * self._plan_cpu_ns
                    and self._plan_cpu_ns > self.EAGER_PLAN_FRACTION * self._period_ns
                )
            if not held:
                self._go.set()  # planning in the stall costs (next to) nothing: plan now
                self.plan_holds["eager"] += 1
            else:
                self.plan_holds["held"] += 1
        elif ex.error() is not None:  # no planner run to notice a failed executor
            with self._lock:
                self._collect_log()

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until the worker has planned every queued graph (tests, accounting)."""
        if self._pending_graphs:
            self._go.set()  # plan now: the caller waits for it, not the engine
        return self._idle.wait(timeout_s)

    # ---- worker ----------------------------------------------------------------------

    def _work(self) -> None:
        """The planner. It is woken once per graph, without polling: at a decode
        graph's end (default), or, for held graphs, when the engine next enters a
        one-token ``llama_decode`` (or someone waits: ``wait_idle``, settling).

        Between two decodes the engine thread runs Python (sampling, detokenising; in a
        server, the event loop streams the token and the next one may be decoded on
        another worker thread). A planner running there takes the GIL at each of
        llama-cpp-python's ctypes calls and delays the next token by up to its CPU
        time (measured on gemma, 2-core host: the engine's time between two decodes
        went from 1.3 to 2.3-3.0 ms). Inside ``llama_decode`` the GIL is free (with the
        eval hook installed, llama.cpp computes the graph synchronously there, also on
        a GPU) and the planner runs beside the engine on another core (1.4-1.5 ms
        between decodes). With ``HOLD_FOR_ENGINE`` (default) a plan solved there is
        for the graph after the one begun (``plan.after``/``plan.retarget``: the
        executor decides, atomically, which graph that is, and arms the plan's stall
        raise at the begun graph's end), so it is not late; the controller knows it
        plans two ahead (``GraphBatch.ahead``), and the counters it gets were read at
        the graph's end. Each graph then runs a plan one graph older, which costs tmpc
        a little saving (see ``plan.HOLD_FOR_ENGINE``).

        * A prompt batch's graph (``HOLD_PROMPTS``) is always held: planning it between
          the prompt and the first token cost issue 14's TTFT, and a prompt batch
          runs on ``n_threads_batch`` threads (every core by default), so it does not
          wake the planner either; nor does a request's end (the next request's
          prompt usually follows at once; a plan for an ended request is dropped).
        * Decode graphs are held with ``HOLD_FOR_ENGINE`` (default), else planned at
          once, in time; held or not, they are planned at once where that
          costs (next to) nothing: the engine's stalls are off the CPU (a GPU sync, a
          sleeping logits processor) for twice the planner's CPU per graph, or the
          planner takes at most ``EAGER_PLAN_FRACTION`` of the graph period (moving
          averages). ``health()["plan_holds"]`` counts held and eager graphs."""
        while True:
            self._go.wait()  # and clear
            if self._stop.is_set():
                self._idle.set()
                return
            while self._pending_graphs and not self._stop.is_set():
                item = self._pending_graphs.popleft()
                try:
                    self._plan_graph(*item)
                except Exception as e:  # the worker must survive; generation goes on
                    log.exception("turboinfer planner failed on a graph")
                    with self._lock:
                        self.error = f"planner: {type(e).__name__}: {e}"
            if not self._pending_graphs:
                self._idle.set()

    def _plan_graph(
        self, raw: Any, graph: int, n_tokens: int, t0: int, t1: int, counters: Any = None
    ) -> None:
        start = time.perf_counter_ns()
        cpu0 = time.thread_time_ns()
        rec = records_array(raw)  # the Python hook's tuples, converted here
        if rec is None:
            return
        batch: GraphBatch | None = batch_from_records(
            rec,
            graph=graph,
            n_tokens=n_tokens,
            granularity=self._granularity,
            t_begin_ns=t0,
            t_end_ns=t1,
            costs=self._costs,
        )
        if batch is None:
            return
        ingest_cpu = time.thread_time_ns() - cpu0
        if self.HOLD_FOR_ENGINE and self._begun_graph > graph:
            batch.ahead = 2  # its plan goes past the graph computing (plan.retarget)
        time.sleep(0)  # hand the GIL to the engine thread if it is waiting for it
        with self._lock:
            if self.failed:
                return
            t_drain = now_ns()
            self._collect_log()
            if self._drained_upto_ns is not None:
                t_drain = self._drained_upto_ns
            applied, self._pending_applied = self._pending_applied, []
        with self._ctl_lock:  # controller learning: this thread only, never the engine's
            if len(self.graph_input_ns) < 1_000_000:
                self.graph_input_ns[graph] = now_ns() - t1
            if self._on_applied is not None:
                self._on_applied(applied)
            if self._on_counters is not None and self.feedback != "engine-only":
                self._read_counters(counters)
            ctl0 = time.thread_time_ns()
            plan = self._on_graph(batch) if self._on_graph is not None else None
            ctl_cpu = time.thread_time_ns() - ctl0
            if plan is not None and self.HOLD_FOR_ENGINE:
                # for the graph after the last to start computing when it is set
                plan = after(plan, graph, batch.t_first_ns)
        time.sleep(0)
        with self._lock:
            if plan is not None and self._boundary_ns > t1:
                # planned for a graph of a request that has ended: setting it now would
                # replace the plan its end (or the next request's begin) answered with
                if len(self.plans_dropped) < 1_000_000:
                    self.plans_dropped.add(graph)
                plan = None
            if plan is not None and not self.failed:
                # when the executor took it (its own clock, not after the call returns:
                # that may wait for the GIL): replay sets the plan at the same instant
                t_set = self._set_plan(plan) or now_ns()
                if len(self.plan_delay_ns) < 1_000_000:
                    self.plan_delay_ns[graph] = t_set - t1
                    self.log_cutoff_ns[graph] = t_drain - t1
            self.graphs += 1
            self._graph_ns.append(time.perf_counter_ns() - start)
            cpu = time.thread_time_ns() - cpu0
            self._graph_cpu_ns.append(cpu)
            self._cpu_parts_ns.append((ingest_cpu, ctl_cpu))
            self._plan_cpu_ns += (cpu - self._plan_cpu_ns) // 4
            self._plan_wait_ns.append(start - t1)
            if len(self._graph_ns) > 10_000:
                for lst in (self._graph_ns, self._graph_cpu_ns, self._plan_wait_ns):
                    del lst[:5_000]
                del self._cpu_parts_ns[:5_000]

    def _collect_log(self) -> None:
        """Executor log -> bookkeeping and the controller's pending ``on_applied``
        (fed by the planner before the next ``on_graph``). Under ``_lock``."""
        ex = self.executor
        if ex is None:
            return
        new = ex.drain_log()
        if new:
            self._drained_upto_ns = new[-1].t_ns
            pairs = [(a.t_ns, a.level) for a in new]
            self.applied_entries.extend(new)
            self.applied += len(new)
            self.levels_used.update(lv for _, lv in pairs)
            self.applied_log.extend(pairs)
            if self._on_applied is not None:
                self._pending_applied.extend(pairs)
        err = ex.error()
        if err is not None and not self.failed:
            self._fail(ex.exception() or DeviceError(f"executor: {err}"))

    def _read_counters(self, counters: Any = None) -> None:
        """Give the controller the device's counters: ``counters`` when sampled at
        the graph's end (held graphs; a failed read's exception), else read now."""
        try:
            if isinstance(counters, BaseException):
                raise counters
            if counters is None:
                counters = self.device.read_counters()
        except (DeviceError, OSError) as e:
            if not isinstance(e, Unsupported):
                # impossible readings or a device that went away: hand it back
                self._fail(e)
                return
            # missing counters degrade, they do not disable: engine timing alone
            self.feedback = "engine-only"
            log.warning(
                "%s: no usable counters (%s); tmpc runs on engine timing alone",
                getattr(self.device, "name", "?"),
                e,
            )
            return
        if self._on_counters is not None:
            self._on_counters(counters)

    # ---- switches ------------------------------------------------------------------

    def _set_plan(self, plan: Plan) -> int | None:
        """Hand ``plan`` to the executor; the executor's clock when it took it."""
        ex = self.executor
        if ex is not None and not self.failed:
            self._last_plan = plan
            return ex.set_plan(_clamped(plan, self._cap_level))
        return None

    def _push(self, d: Decision) -> None:
        self._seq += 1
        bisect.insort(self._queue, (d.at_ns, self._seq, d))
        self._wake.set()

    def _apply_due(self, now: int) -> None:
        ex = self.executor
        switched = False
        while self._queue and self._queue[0][0] <= now and not self.failed:
            _, _, d = self._queue.pop(0)
            if ex is None:
                return
            level = bisect.bisect_left(self.levels_hz, d.freq_hz)
            ex.switch_now(min(level, len(self.levels_hz) - 1, self._cap_level))
            switched = True
        # the executor's health is read after a switch here, and once per graph at its
        # end (``on_decode_end``), never per event: each read is a native call, and on
        # the engine thread every native call hands the GIL to whichever thread wants it
        if switched and ex is not None and ex.error() is not None and not self.failed:
            self._collect_log()

    def _timer_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._apply_due(self._clock())
                nxt = self._queue[0][0] if self._queue else None
                self._wake.clear()
            timeout = None if nxt is None else max(0.0, (nxt - self._clock()) / 1e9)
            self._wake.wait(timeout)

    # ---- health ----------------------------------------------------------------------

    def _fail(self, err: BaseException, *, restore: bool = True) -> None:
        self.failed = True
        self.error = f"{type(err).__name__}: {err}"
        self._queue = []
        log.error(
            "GPU device %s failed: %s; handing it back to its default governor",
            getattr(self.device, "name", "?"),
            self.error,
        )
        if self.executor is not None:
            self.executor.stop()  # no native write may land after the restore
        if not restore or self._snapshot is None:
            self.fallback = "none (no snapshot)" if not self._record_only else None
            return
        try:
            self.device.restore(self._snapshot)
            self.fallback = f"restored default governor {self._snapshot.governor!r}"
        except (DeviceError, OSError) as e:
            self.fallback = f"restore failed: {type(e).__name__}: {e}"
            log.error("restoring %s failed too: %s", getattr(self.device, "name", "?"), e)

    def health(self) -> dict[str, Any]:
        """State for ``llm.power.stats()`` and logs."""
        with self._lock:
            self._collect_log()
        ex = self.executor
        st = ex.status() if ex is not None else {}
        parts = list(self._cpu_parts_ns)  # one C-level copy: the planner may append
        return {
            # the device's own: foreign writes seen, lock, state file, guardian
            "device_health": getattr(self.device, "health", lambda: None)(),
            "ok": not self.failed,
            "controller": getattr(self.controller, "name", type(self.controller).__name__),
            "device": getattr(self.device, "name", "?"),
            "error": self.error,
            "fallback": self.fallback,
            "events": self.events,
            "graphs_planned": self.graphs,
            "decisions_applied": self.applied,
            "levels_used": len(self.levels_used),
            "feedback": self.feedback,
            "executor": st,
            "clock_standin": self._standin_health(ex),
            "decision_us_median": (
                statistics.median(self._decision_ns) / 1e3 if self._decision_ns else None
            ),
            "graph_plan_us_median": _median_us(self._graph_ns),
            "graph_plan_cpu_us_median": _median_us(self._graph_cpu_ns),
            # the planner's CPU per graph in parts (issue 13's decision time): the
            # records' ingest, the controller's learning and solve, and the rest of
            # the turn (the executor's log, the plan handed over, bookkeeping)
            "graph_cpu_us": {
                "ingest_median": _median_us([a for a, _ in parts]),
                "controller_median": _median_us([b for _, b in parts]),
                "ingest_plus_controller_median": _median_us([a + b for a, b in parts]),
                "whole_turn_median": _median_us(self._graph_cpu_ns),
            },
            "plan_start_wait_us_median": _median_us(self._plan_wait_ns),
            "plan_holds": dict(self.plan_holds),
            # who wakes the planner for a held graph: the eval callback inside the next
            # llama_decode (native hook: its posts so far), or the engine thread before it
            "planner_wake": self._go.stats(),
        }

    def _standin_health(self, ex: LiveExecutor | None) -> dict[str, Any] | None:
        st = ex.standin_status() if ex is not None and self._standin_share is not None else None
        if st is None:
            return None
        return {
            "what": "TEST STAND-IN: graph time scaled by the applied clock (simulated)",
            "memory_share": self._standin_share,
            "graphs": st["graphs"],
            "waited_ms": st["waited_ns"] / 1e6,
        }


class _Wakeup:
    """``threading.Event`` for one waiter that clears it as it wakes, on a bare lock:
    ``set`` is one native call (the engine thread sets it every decode token; an
    Event's runs its Condition's Python code) and ``wait`` blocks, GIL released, until
    the next ``set`` (or returns at once if one came meanwhile)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # clear

    def set(self) -> None:
        try:  # noqa: SIM105 (contextlib.suppress builds an object per call)
            self._lock.release()
        except RuntimeError:  # already set
            pass

    arm = set  # the engine thread, right before llama_decode: wake now

    def wait(self) -> None:
        self._lock.acquire()

    def stats(self) -> dict[str, Any]:
        return {"by": "engine thread"}


class _HookWakeup:
    """The planner's wake through the native hook (``ti_hook_wait_wake``): the engine
    thread only arms it, one store to an int32 right before ``llama_decode``, and the
    eval callback posts it at the decode's first node, on the compute thread with the
    GIL free. Releasing a lock the planner waits on (``_Wakeup``) cost the engine
    thread a median 42 us between decodes on gemma (a futex wake, after 20 ms of matrix
    products). ``set`` posts at once (any thread). Once the hook is closing, it falls
    back to a ``_Wakeup``."""

    __slots__ = ("_fallback", "_flag", "_hook")

    WAIT_S = 1.0  # a bounded wait; the loop waits again

    def __init__(self, hook: Any) -> None:
        self._hook = hook
        self._flag = hook.wake_flag()
        self._fallback: _Wakeup | None = None

    def arm(self) -> None:
        if self._fallback is None:
            self._flag.value = 1
        else:
            self._fallback.set()

    def set(self) -> None:
        if self._fallback is not None or not self._hook.post_wake():
            self._closed().set()

    def wait(self) -> None:
        while self._fallback is None:
            woke = self._hook.wait_wake(self.WAIT_S)
            if woke:
                return
            if woke is None:  # closing: nothing will post the hook again
                break
        self._closed().wait()

    def stats(self) -> dict[str, Any]:
        if self._fallback is not None:
            return {"by": "engine thread"}
        return {"by": "eval callback", **self._hook.wake_stats()}

    def _closed(self) -> _Wakeup:
        if self._fallback is None:
            fallback = _Wakeup()
            fallback.set()  # a set may have gone to the closing hook: wake once
            self._fallback = fallback
        return self._fallback


def _median_us(ns: list[int]) -> float | None:
    return statistics.median(ns) / 1e3 if ns else None


def _clamped(plan: Plan, cap: int) -> Plan:
    """``plan`` with every level at or below ``cap`` (a thermal cap seen live)."""

    def c(level: int) -> int:
        return min(level, cap) if level >= 0 else level

    if max([plan.first_level, plan.end_level, plan.fallback_level]
           + [s.level for s in plan.switches]) <= cap:  # fmt: skip
        return plan
    return dataclasses.replace(
        plan,
        first_level=c(plan.first_level),
        end_level=c(plan.end_level),
        fallback_level=c(plan.fallback_level),
        switches=tuple(dataclasses.replace(s, level=c(s.level)) for s in plan.switches),
    )
