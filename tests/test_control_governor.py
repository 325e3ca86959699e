"""Governor: inline fast path, timed decisions, and safe fallback when the device fails."""

import logging
import time

import numpy as np

from turboinfer_llama.control.base import ControllerDefaults, Decision
from turboinfer_llama.control.governor import Governor
from turboinfer_llama.control.plan import Anchor, Plan, Switch
from turboinfer_llama.devices.base import Capabilities, Counters, DeviceGone, DeviceState
from turboinfer_llama.engine.events import Event, EventKind

LEVELS = [305_000_000, 490_000_000, 670_000_000]


class FakeGpu:
    """A GpuDevice that records calls and can be told to vanish."""

    name = "fake"
    capabilities = Capabilities(True, False, True, 500_000)

    def __init__(self, *, fail_after=None, restore_fails=False):
        self.hz = LEVELS[0]
        self.set_calls = []
        self.restored = []
        self.fail_after = fail_after
        self.restore_fails = restore_fails
        self.state = DeviceState("msm-adreno-tz", LEVELS[0], LEVELS[-1])

    def frequencies_hz(self):
        return list(LEVELS)

    def current_hz(self):
        return self.hz

    def set_hz(self, hz):
        if self.fail_after is not None and len(self.set_calls) >= self.fail_after:
            raise DeviceGone("fake GPU unplugged")
        self.set_calls.append(hz)
        self.hz = hz
        return hz

    def set_range(self, lo, hi):
        pass

    def read_counters(self):
        return Counters(0, 0, 0, None, self.hz)

    def snapshot(self):
        return self.state

    def restore(self, state):
        if self.restore_fails:
            raise OSError("write error")
        self.restored.append(state)

    def close(self):
        pass


class Scripted(ControllerDefaults):
    """Raises at every graph start; drops at graph end and plans a raise 1 ms later."""

    name = "scripted"
    event_kinds = frozenset(EventKind)

    def __init__(self):
        self._plan = []

    def on_event(self, ev):
        if ev.kind is EventKind.DECODE_END:
            self._plan = [Decision(LEVELS[2], ev.t_ns + 1_000_000, "raise")]
            return Decision(LEVELS[0], ev.t_ns, "drop")
        if ev.kind is EventKind.NODE_ASK and ev.node == 0:
            return Decision(LEVELS[1], ev.t_ns, "compute")
        return None

    def plan(self, now_ns):
        return [d for d in self._plan if d.at_ns >= now_ns]


def _events(n_graphs, t0=0):
    t = t0
    for g in range(n_graphs):
        for kind, node in (
            (EventKind.DECODE_BEGIN, -1),
            (EventKind.NODE_ASK, 0),
            (EventKind.NODE_DONE, 0),
            (EventKind.DECODE_END, -1),
            (EventKind.TOKEN, -1),
        ):
            yield Event(kind, t, graph=g, node=node)
            t += 600_000


def test_fast_path_applies_decisions_inline_and_timed_ones_at_the_next_boundary():
    dev = FakeGpu()
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    for ev in _events(2):
        now[0] = ev.t_ns
        gov.on_event(ev)
    gov.close()
    # compute, drop, (raise due 1 ms after graph end, applied at the next boundary), ...
    assert dev.set_calls[:4] == [LEVELS[1], LEVELS[0], LEVELS[2], LEVELS[1]]
    h = gov.health()
    assert h["ok"] and h["events"] == 10 and h["decision_us_median"] is not None
    assert dev.restored == [dev.state]  # close() gives the device back


def test_device_failure_mid_run_falls_back_to_the_default_governor(caplog):
    dev = FakeGpu(fail_after=2)
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    with caplog.at_level(logging.ERROR):
        for ev in _events(4):  # generation keeps going: no exception reaches the engine
            now[0] = ev.t_ns
            gov.on_event(ev)
    h = gov.health()
    assert not h["ok"]
    assert "DeviceGone" in h["error"] and "unplugged" in h["error"]
    assert "restored default governor 'msm-adreno-tz'" in h["fallback"]
    assert dev.restored == [dev.state]
    assert len(dev.set_calls) == 2  # nothing more was written after the failure
    assert h["events"] == 20
    assert "failed" in caplog.text
    gov.close()


def test_failure_of_the_restore_itself_is_reported():
    dev = FakeGpu(fail_after=0, restore_fails=True)
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    for ev in _events(1):
        now[0] = ev.t_ns
        gov.on_event(ev)
    h = gov.health()
    assert not h["ok"] and h["fallback"].startswith("restore failed: OSError")


def test_timer_thread_applies_a_decision_due_inside_a_stall():
    import time

    dev = FakeGpu()
    dev.hz = LEVELS[1]  # so the drop is a change (a switch to the level in effect is skipped)
    gov = Governor(Scripted(), dev, timer=True).start()  # real monotonic clock
    from turboinfer_llama._clock import now_ns

    gov.on_event(Event(EventKind.DECODE_END, now_ns(), graph=0))
    deadline = time.monotonic() + 2.0
    while LEVELS[2] not in dev.set_calls and time.monotonic() < deadline:
        time.sleep(0.005)
    gov.close()
    assert dev.set_calls[:2] == [LEVELS[0], LEVELS[2]]


class Learner(ControllerDefaults):
    """A planning controller that only notes which graphs reached its ``on_graph``."""

    name = "learner"
    event_kinds = frozenset(EventKind)

    def __init__(self):
        self.graphs = []

    def on_event(self, ev):
        return None

    def plan(self, now_ns):
        return []

    def on_graph(self, batch):
        self.graphs.append(batch.graph)


def _asks(graph, t_ns, n=4):
    from turboinfer_llama.engine.hooks import RECORD_DTYPE

    rec = np.zeros(n, dtype=RECORD_DTYPE)
    rec["t_ns"] = t_ns + np.arange(n) * 1_000
    rec["graph"] = graph
    rec["node"] = np.arange(n)
    rec["op"] = b"MUL_MAT"
    rec["name"] = b"ffn_up-0"
    return rec


def _soon(cond, timeout_s=5.0):
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return cond()


def test_a_prompt_graph_is_planned_in_the_first_decode_not_before_the_first_token():
    """Issue 14 (TTFT): a prompt batch's graph is not planned between the prompt and the
    first token, nor while another prompt batch runs (every core); the first one-token
    decode's entry wakes the planner. A decode graph is planned at once when graphs are
    not held (``HOLD_FOR_ENGINE`` False)."""
    ctl = Learner()
    gov = Governor(ctl, FakeGpu(), record_only=True, timer=False).start()
    gov.HOLD_FOR_ENGINE = False
    try:
        gov._plan_cpu_ns = 10**9  # as learned: planning is not ~free (EAGER_PLAN_FRACTION)
        t = time.monotonic_ns()
        gov.graph_end()
        gov.on_decode_end(_asks(1, t), graph=1, n_tokens=12, t_begin_ns=t, t_end_ns=t + 10**5)
        time.sleep(0.2)
        assert ctl.graphs == []  # the engine samples the first token
        gov.entering_decode(32)  # another prompt batch
        time.sleep(0.1)
        assert ctl.graphs == []
        gov.entering_decode(1)
        assert _soon(lambda: ctl.graphs == [1])
        gov.graph_end()
        gov.on_decode_end(_asks(2, t), graph=2, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        assert _soon(lambda: ctl.graphs == [1, 2])  # a decode graph: at once, in time
        assert gov.plan_holds == {"held": 1, "eager": 1}
    finally:
        gov.close()


class Planner(Learner):
    """Plans a raise one ms after each graph's end, then level 1 for the graph."""

    def on_graph(self, batch):
        super().on_graph(batch)
        return Plan(
            first_level=1,
            fallback_level=1,
            switches=(Switch(Anchor.TIME, batch.t_end_ns + 1_000_000, 2),),
        )


def test_the_governor_hands_over_each_plan_as_solved_after_its_graph():
    """Issue 11: graph 1's records are planned while the engine decodes graph 2 (GIL
    free): the plan goes to the executor marked as solved after graph 1 (and its first
    ask), so the executor gives it to the graph after the last one to start computing
    (``plan.retarget``, tested on both executors in test_exec_model)."""
    ctl = Planner()
    gov = Governor(ctl, FakeGpu(), record_only=True, timer=False).start()
    gov.HOLD_FOR_ENGINE = True
    try:
        gov._plan_cpu_ns = 10**9
        t = time.monotonic_ns()
        gov.graph_end()
        gov.on_decode_end(_asks(1, t), graph=1, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        gov.entering_decode(1)
        assert _soon(lambda: gov._last_plan is not None)
        plan = gov._last_plan
        assert (plan.graph, plan.after_graph, plan.after_t0_ns) == (0, 1, t)
        assert [s.key for s in plan.switches] == [t + 10**5 + 1_000_000]
    finally:
        gov.close()


class CountingGpu(FakeGpu):
    """Its busy counter is the number of reads so far, so a controller can tell when
    the counters it was given were read."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def read_counters(self):
        self.reads += 1
        return Counters(0, self.reads, 0, None, self.hz)


class CounterLearner(Learner):
    def __init__(self):
        super().__init__()
        self.seen = []
        self.busy = None

    def on_counters(self, counters):
        self.busy = counters.busy_ns

    def on_graph(self, batch):
        super().on_graph(batch)
        self.seen.append((batch.graph, batch.ahead, self.busy))


def test_a_held_graph_is_planned_two_ahead_with_the_counters_read_at_its_end():
    """Planning two ahead (``HOLD_FOR_ENGINE``): a decode graph planned once the engine
    has begun the next one says so (``GraphBatch.ahead`` 2: its plan is for the graph
    after that one), and the device counters it gets are the ones read as it ended, not
    at planning time (those would mix in the next graph's busy time)."""
    ctl = CounterLearner()
    dev = CountingGpu()
    gov = Governor(ctl, dev, timer=False).start()
    gov.HOLD_FOR_ENGINE = True
    try:
        gov._plan_cpu_ns = 10**9
        t = time.monotonic_ns()
        gov.on_decode_begin(1)
        gov.graph_end()
        gov.on_decode_end(_asks(1, t), graph=1, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        reads_at_end = dev.reads
        dev.read_counters()  # later reads (the next graph running) must not be the ones given
        dev.read_counters()
        gov.on_decode_begin(2)
        gov.entering_decode(1)
        assert _soon(lambda: ctl.seen)
        assert ctl.seen == [(1, 2, reads_at_end)]
    finally:
        gov.close()


def test_held_decode_graphs_wait_for_the_engine_to_enter_llama_decode():
    """HOLD_FOR_ENGINE: a decode graph is planned while the next decode runs (GIL free),
    not in the engine's Python between decodes."""
    ctl = Learner()
    gov = Governor(ctl, FakeGpu(), record_only=True, timer=False).start()
    gov.HOLD_FOR_ENGINE = True
    try:
        gov._plan_cpu_ns = 10**9
        t = time.monotonic_ns()
        gov.graph_end()
        gov.on_decode_end(_asks(1, t), graph=1, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        time.sleep(0.2)
        assert ctl.graphs == []
        gov.entering_decode(1)
        assert _soon(lambda: ctl.graphs == [1])
        gov._plan_cpu_ns = 0  # planning became ~free: in time again
        gov.graph_end()
        gov.on_decode_end(_asks(2, t), graph=2, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        assert _soon(lambda: ctl.graphs == [1, 2])
    finally:
        gov.close()


def test_wait_idle_plans_what_the_engine_left_pending():
    ctl = Learner()
    gov = Governor(ctl, FakeGpu(), record_only=True, timer=False).start()
    try:
        gov._plan_cpu_ns = 10**9
        t = time.monotonic_ns()
        gov.graph_end()
        gov.on_decode_end(_asks(1, t), graph=1, n_tokens=1, t_begin_ns=t, t_end_ns=t + 10**5)
        assert gov.wait_idle(5.0)
        assert ctl.graphs == [1]
    finally:
        gov.close()


class BusyPlanner(Learner):
    """Learns for ~2 ms of CPU per graph."""

    def on_graph(self, batch):
        super().on_graph(batch)
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 2_000_000:
            pass


def test_the_planners_cpu_per_graph_is_reported_in_parts():
    """Issue 13's decision time on the live loop (``bench.decision_time --live``): the
    planner's CPU per graph split into the records' ingest and the controller's
    on_graph, next to the whole turn. The controller here burns 2 ms of CPU per graph;
    that lands in its part, not in the ingest's."""
    ctl = BusyPlanner()
    gov = Governor(ctl, FakeGpu(), record_only=True, timer=False).start()
    gov.HOLD_FOR_ENGINE = False
    try:
        t = time.monotonic_ns()
        for g in range(1, 6):
            gov.graph_end()
            gov.on_decode_end(
                _asks(g, t + g * 10**6), graph=g, n_tokens=1, t_begin_ns=t, t_end_ns=t + g * 10**6
            )
            assert gov.wait_idle(5.0)
        parts = gov.health()["graph_cpu_us"]
        assert parts["controller_median"] >= 1_900
        assert parts["ingest_median"] < 0.5 * parts["controller_median"]
        both = parts["ingest_plus_controller_median"]
        assert parts["controller_median"] <= both <= parts["whole_turn_median"] + 1.0
    finally:
        gov.close()


def test_the_stalls_cpu_time_is_read_at_every_fourth_stall_only(monkeypatch):
    """Issue 14: a thread-CPU clock read costs the engine thread ~9 us after a decode
    (a syscall, cold), and the stalls' off-CPU share is a slow moving average: read
    at every ``STALL_CPU_EVERY``-th stall only, it still sees a stall spent asleep."""
    import turboinfer_llama.control.governor as gov_mod

    reads = []
    clock = gov_mod.time.thread_time_ns

    def counted() -> int:
        reads.append(1)
        return clock()

    gov = Governor(Learner(), FakeGpu(), record_only=True, timer=False).start()
    try:
        monkeypatch.setattr(gov_mod.time, "thread_time_ns", counted)
        stalls = 4 * gov.STALL_CPU_EVERY
        for _ in range(stalls):
            gov.graph_end()
            time.sleep(0.004)  # the stall, off the CPU (a GPU sync, a sleeping sampler)
            gov.entering_decode(1)
        monkeypatch.undo()
        assert len(reads) == 2 * stalls // gov.STALL_CPU_EVERY  # start and end, sampled
        assert gov._stall_idle_ns > 1_000_000  # 4 samples of ~4 ms asleep
    finally:
        gov.close()
