"""Replay: deterministic for a fixed seed, and causal for every controller but the oracle."""

import dataclasses

import pytest

from turboinfer_llama.accounting import phone_segments
from turboinfer_llama.control.base import ControllerDefaults
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimGpu
from turboinfer_llama.engine.events import EventKind

CAUSAL = ("tmpc", "default", "max", "static:490000000", "reactive", "ztt")


@pytest.fixture(scope="module")
def trace():
    return make_trace(requests=2, decode_tokens=5, prompt_tokens=8, idle_ms=80.0, seed=5)


@pytest.mark.parametrize("name", ["tmpc", "ztt"])
def test_replay_is_deterministic_for_a_fixed_seed(trace, name):
    runs = []
    for _ in range(2):
        dev = SimGpu()
        runs.append(replay(trace, make_controller(name, **for_device(dev)), dev, seed=7))
    a, b = runs
    assert (a.energy_j, a.duration_s, a.switches, a.tokens, a.decisions) == (
        b.energy_j,
        b.duration_s,
        b.switches,
        b.tokens,
        b.decisions,
    )
    assert a.tokens == 12 and a.requests == 2
    assert a.simulated


class Spy(ControllerDefaults):
    """Wraps a controller; checks every call happens at the virtual instant it names."""

    def __init__(self, inner, device):
        self.inner, self.device = inner, device
        self.name = inner.name
        self.uses_device_governor = inner.uses_device_governor
        self.event_kinds = inner.event_kinds
        self.last_t = -1
        self.seen = 0
        self.kinds = set()
        self.graphs = 0
        self.on_counters = inner.on_counters
        self.on_applied = inner.on_applied
        if inner.on_graph is not None:
            self.on_graph = self._on_graph

    def _on_graph(self, batch):
        now = self.device.now_ns()
        # a graph's records arrive after it ended, never before (the live worker)
        assert batch.t_end_ns < now, "graph records delivered before the graph ended"
        assert batch.t_first_ns <= batch.t_end_ns and (batch.ask_ns <= batch.t_end_ns).all()
        self.graphs += 1
        return self.inner.on_graph(batch)

    def on_event(self, ev):
        now = self.device.now_ns()
        assert ev.t_ns == now, f"{ev.kind} delivered at {now} but stamped {ev.t_ns}"
        assert ev.t_ns >= self.last_t, "events out of order"
        self.last_t = ev.t_ns
        self.seen += 1
        self.kinds.add(ev.kind)
        return self.inner.on_event(ev)

    def plan(self, now_ns):
        assert now_ns == self.device.now_ns()
        return self.inner.plan(now_ns)


def _reachable(obj, target, depth=3, seen=None):
    seen = seen if seen is not None else set()
    if obj is target:
        return True
    if depth == 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float)):
        return False
    seen.add(id(obj))
    children = []
    if hasattr(obj, "__dict__"):
        children += list(vars(obj).values())
    if isinstance(obj, (list, tuple, set)):
        children += list(obj)[:50]
    if isinstance(obj, dict):
        children += list(obj.values())[:50]
    return any(_reachable(c, target, depth - 1, seen) for c in children)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_controllers_never_read_an_event_before_it_happens(trace, name):
    dev = SimGpu()
    # even when handed the trace, a causal controller does not keep it
    ctl = make_controller(name, **for_device(dev), trace=trace, device_factory=SimGpu)
    assert not _reachable(ctl, trace)
    spy = Spy(ctl, dev)
    res = replay(trace, spy, dev, seed=0)
    # the Python events of 12 tokens, of the kinds it takes only (as live)
    per_token = ctl.event_kinds & {
        EventKind.DECODE_BEGIN,
        EventKind.DECODE_END,
        EventKind.SAMPLE_BEGIN,
        EventKind.SAMPLE_END,
        EventKind.TOKEN,
    }
    assert spy.seen >= 12 * len(per_token)
    assert spy.kinds <= ctl.event_kinds
    n_graphs = len({s.graph for s in trace if s.kind == "kernel"})
    if ctl.on_graph is not None:  # and every graph's records, once, after it ended
        assert spy.graphs == n_graphs
    assert res.tokens == 12


def test_only_the_oracle_holds_the_whole_trace(trace):
    oracle = make_controller("oracle", **for_device(SimGpu()), trace=trace, device_factory=SimGpu)
    assert oracle.budgets_ns  # it read the default run of the whole trace up front
    res = replay(trace, oracle, SimGpu(), seed=0)
    assert res.tokens == 12


def test_graph_granularity_replays_with_scan_events():
    from turboinfer_llama.accounting import phone_segments

    dev = SimGpu()
    tr = make_trace(requests=1, decode_tokens=3, prompt_tokens=4, kernel_timing=False)
    tr = phone_segments(tr, dev.profile)  # the phone's host gaps, as the benchmark runs it
    res = replay(tr, make_controller("tmpc", **for_device(dev)), dev)
    assert res.granularity == "graph" and res.tokens == 4
    assert dev.gap_ns_by_kind["inter_kernel"] > 0  # the host model's submission gaps


def test_bad_arguments_are_refused(trace):
    with pytest.raises(ValueError, match="granularity"):
        replay(trace, make_controller("max", device_levels_hz=[1]), SimGpu(), granularity="node")
    with pytest.raises(ValueError, match="at least one segment"):
        replay([], make_controller("max", device_levels_hz=[1]), SimGpu())


class Hold(ControllerDefaults):
    """A controller that never decides: the clock stays where the device starts."""

    name = "hold"
    event_kinds: frozenset[EventKind] = frozenset()

    def on_event(self, event):
        return None

    def plan(self, now_ns):
        return []


def test_replay_runs_segments_through_the_simulator():
    """Kernels re-timed by the cost model (no-op views launch nothing), host submission
    added only before kernels without their own timing, stalls kept as recorded.
    (Was SimGpu.consume's test; replay is the one loop that does this.)"""
    from test_devices_sim import MS, toy_profile

    from turboinfer_llama.engine.events import NodeShape, StallKind
    from turboinfer_llama.engine.segments import Segment

    gpu = SimGpu(toy_profile(host_submission_ns=10_000))
    shape = NodeShape((1000, 1, 1, 1), 0, (1000, 1, 1, 1), 0, (1000, 1, 1, 1), 0)
    segs = [
        Segment("stall", 0, 50_000, "decode", stall=StallKind.SUBMIT),
        Segment("kernel", 0, 0, "decode", op="ADD", shape=shape, timed=False),
        Segment("kernel", 0, 0, "decode", op="VIEW", shape=shape, timed=False),
        Segment("kernel", 0, 0, "decode", op="ADD", shape=shape, timed=True),
        Segment("stall", 0, 7_000, "decode", stall=StallKind.INTER_KERNEL),
        Segment("stall", 0, 2 * MS, "decode", stall=StallKind.SAMPLE),
    ]
    res = replay(segs, Hold(), gpu, granularity="kernel", timer_ns=10**12)
    kernel_ns = 12_000  # 12 kB at 1 GB/s each
    assert gpu.kernels == 2  # the VIEW launched nothing
    assert gpu.gap_ns_by_kind == {"submit": 50_000, "inter_kernel": 17_000, "sample": 2 * MS}
    assert round(res.duration_s * 1e9) == 50_000 + 10_000 + 2 * kernel_ns + 7_000 + 2 * MS


def test_a_live_runs_late_graph_ends_are_late_in_its_replay():
    """Replaying a live run, each end-of-graph switch lands as late after the decode's
    return as the live engine thread made it (it may wait for the GIL or a core between
    the two on a busy host): here a live log whose end switches came 0.3 ms late."""
    segs = make_trace(
        requests=2, decode_tokens=12, prompt_tokens=8, idle_ms=60.0, seed=3, kernel_timing=False
    )

    def run(**kw):
        dev = SimGpu("adreno650", start_ns=segs[0].t_ns)
        ctl = make_controller("tmpc", latency_slack=0.05, **for_device(dev))
        return replay(segs, ctl, dev, timing="recorded", granularity="graph", counters=False, **kw)

    def end_offsets(res):
        return {
            a.graph: a.t_ns - res.graph_begin_ns[a.graph] for a in res.applied if a.source == "end"
        }

    first = run()
    on_time = end_offsets(first)
    assert len(on_time) >= 4  # tmpc drops the clock at some graph ends
    late_ns = 300_000
    live = [
        dataclasses.replace(a, t_ns=a.t_ns + late_ns) if a.source == "end" else a
        for a in first.applied
    ]
    again = run(live_applied=live, live_begin_ns=first.graph_begin_ns)
    assert again.graph_begin_ns == first.graph_begin_ns
    assert end_offsets(again) == {g: off + late_ns for g, off in on_time.items()}
    # an on-time live log changes nothing
    same = run(live_applied=list(first.applied), live_begin_ns=first.graph_begin_ns)
    assert end_offsets(same) == on_time


def test_held_graphs_reach_the_planner_in_the_next_decode_and_their_plans_in_time():
    """As live (``plan.HOLD_FOR_ENGINE``): a graph's records reach the controller once
    the engine has entered its next one-token decode (never in the Python between
    decodes), and each plan goes to the graph after the last one that started
    computing, so no decode graph after a request's first starts without one."""
    segs = phone_segments(
        make_trace(requests=2, decode_tokens=10, prompt_tokens=8, idle_ms=60.0, seed=3),
        SimGpu("adreno650").profile,
    )
    got = {}
    for hold in (True, False):
        dev = SimGpu("adreno650")
        ctl = make_controller("tmpc", **for_device(dev))
        seen: list[tuple[int, int]] = []
        inner = ctl.on_graph

        def on_graph(batch, inner=inner, seen=seen, dev=dev):
            seen.append((batch.graph, dev.now_ns()))
            return inner(batch)

        ctl.on_graph = on_graph
        res = replay(segs, ctl, dev, granularity="graph", hold=hold)
        got[hold] = (res, seen)
    res, seen = got[True]
    begins = res.graph_begin_ns
    one_token = sorted(g for g in begins if g + 1 in begins)
    for g, t in seen[:-1]:  # the trace's last graph: planned at the end of the run
        nxt = min((h for h in begins if h > g), default=None)
        if nxt is not None:
            assert t > begins[nxt], (g, t, begins[nxt])  # in the next decode
    assert len(seen) == len(begins) and one_token
    assert res.late_plans <= 2 * 2  # each request's first graphs only
    # the same controller, planning at each graph's end instead, gets them earlier
    _, eager_seen = got[False]
    assert [g for g, _ in eager_seen][:5] == [g for g, _ in seen][:5]
    assert all(te < th for (_, te), (_, th) in zip(eager_seen[:5], seen[:5], strict=True))


def test_a_prompt_of_two_micro_batches_is_one_batch_of_all_its_tokens():
    # as live: DECODE_BEGIN carries the batch's tokens (the replay once gave the first
    # micro-batch's, 512 of a 700-token prompt) and REQUEST_BEGIN the prompt's
    from turboinfer_llama.engine.events import EventKind

    trace = make_trace(requests=2, prompt_tokens=[12, 700], decode_tokens=2, seed=0)
    graph_nodes = {}
    for s in trace:
        if s.kind == "kernel":
            graph_nodes[s.graph] = graph_nodes.get(s.graph, 0) + 1
    assert graph_nodes[3] == 2 * graph_nodes[0]  # two micro-batches of the same nodes
    dev = SimGpu()
    spy = Spy(make_controller("default", **for_device(dev)), dev)
    spy.event_kinds = frozenset(EventKind)  # every event (the default itself takes none)
    got = []
    inner = spy.on_event

    def record(ev):
        if ev.kind in (EventKind.REQUEST_BEGIN, EventKind.DECODE_BEGIN):
            got.append((ev.kind, ev.n_tokens))
        return inner(ev)

    spy.on_event = record
    replay(trace, spy, dev, seed=0)
    assert got == [
        (EventKind.REQUEST_BEGIN, 12), (EventKind.DECODE_BEGIN, 12),
        (EventKind.DECODE_BEGIN, 1), (EventKind.DECODE_BEGIN, 1),
        (EventKind.REQUEST_BEGIN, 700), (EventKind.DECODE_BEGIN, 700),
        (EventKind.DECODE_BEGIN, 1), (EventKind.DECODE_BEGIN, 1),
    ]  # fmt: skip
