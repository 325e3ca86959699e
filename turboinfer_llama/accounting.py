"""Arrays-based accounting of a recorded run on the simulated phone GPU.

The live loop (and the benchmark's hindsight baselines) need two figures per finished
request, fast: the energy of the recorded timeline under the frequency switches a
controller actually issued, and the energy and latency under the device's default
governor. Both used to be a per-kernel replay in Python (18-55 ms of CPU per token).
Here the recorded run becomes, once, a list of graphs (numpy arrays of each kernel's
work and host gap) and the stalls between them, and the simulator runs each graph with
``SimGpu.run_batch``, cut only at switch instants and at the device governor's own
decision instants. The physics is the simulator's (the same ``SimGpu``), so results
match the per-kernel path to rounding.

The phone's host side is applied here, once, the same way whatever the recording's
granularity (``phone_segments`` is the same transformation for ``control.replay``):
the recording host's inter-kernel gaps are dropped and replaced by the profile's
enqueue/submission gaps (``SimProfile.host_gaps_ns``), and the per-token CPU work
(submit and sample stalls) is scaled by the profile's CPU-speed factor. Idle stalls
(between requests) are kept as recorded.

Offline controllers are figured here too: ``static_levels``/``phase_split`` for the
hindsight baselines, ``scheduled_energy`` for the oracle's schedule (a ``Schedule``
re-anchored as the run drifts from the oracle's block model, as its replay re-anchors
on events). ``turboinfer bench`` and ``sweep`` report those figures instead of a
per-kernel replay; the tests compare the two (within 0.5%).

Every figure is simulated.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .devices.sim import SimGpu, SimProfile
from .engine.events import StallKind
from .engine.graph import cost
from .engine.latency import RequestLatency, per_request, pooled_ms
from .engine.segment_store import SegmentColumns
from .engine.segments import Segment

# segments between two calls of PhoneTrace.build's pause point (a few ms of CPU at most)
BUILD_PAUSE_EVERY = 256

__all__ = [
    "Account",
    "PhoneTrace",
    "Schedule",
    "Switches",
    "applied_energy",
    "default_shadow",
    "phase_split",
    "phone_segments",
    "scheduled_energy",
    "static_levels",
]


# ---- the phone host model over recorded segments -----------------------------------


def _graph_ids(segments: Sequence[Segment]) -> list[Segment]:
    """Submit stalls carry the graph that follows, sample stalls the graph before
    (as ``control.replay.with_graphs`` does; kept here so devices-level code does not
    import the controller package)."""
    from .control.replay import with_graphs

    return with_graphs(segments)


def phone_segments(segments: Sequence[Segment], profile: SimProfile) -> list[Segment]:
    """``segments`` as they would run on the phone of ``profile``: recorded inter-kernel
    gaps dropped, the profile's host gaps (``host_gaps_ns``) inserted before the
    kernels that get one, submit and sample stalls scaled by ``host_cpu_factor``.
    Kernels keep their ``timed`` flag, so ``control.replay`` still places events as the
    recording's granularity dictates. Use with a profile whose ``host_submission_ns``
    is 0 (the shipped ones), so no host cost is counted twice."""
    out: list[Segment] = []
    append = out.append
    segs = list(segments)
    inter, submit, sample = StallKind.INTER_KERNEL, StallKind.SUBMIT, StallKind.SAMPLE
    # no-op or not, by (op, shape object): a recording shares each distinct shape
    noop: dict[tuple[str, int], bool] = {}
    i = 0
    n = len(segs)
    while i < n:
        s = segs[i]
        if s.kind == "stall":
            if s.stall is inter:
                i += 1
                continue
            if s.stall is submit or s.stall is sample:
                s = _with_dur(s, profile.scale_host_ns(s.dur_ns))
            append(s)
            i += 1
            continue
        # one graph's run of kernels (inter-kernel stalls in between)
        j = i
        graph = s.graph
        graph_kernels: list[Segment] = []
        real: list[bool] = []
        while j < n:
            k = segs[j]
            if k.kind == "kernel" and k.graph == graph:
                key = (k.op, id(k.shape))
                nop = noop.get(key)
                if nop is None:
                    nop = noop[key] = cost(k.op, k.shape).is_noop
                graph_kernels.append(k)
                real.append(not nop)
            elif k.stall is not inter:
                break
            j += 1
        gaps = profile.host_gaps_ns(sum(real)).tolist()
        r = 0
        for k, is_real in zip(graph_kernels, real, strict=True):
            if is_real:
                g = int(gaps[r])
                r += 1
                if g > 0:
                    append(
                        Segment(
                            "stall",
                            k.t_ns,
                            g,
                            k.phase,
                            stall=inter,
                            request=k.request,
                            token=k.token,
                            graph=k.graph,
                        )
                    )
            append(k)
        i = j
    return out


def _with_dur(s: Segment, dur_ns: int) -> Segment:
    return Segment(
        s.kind,
        s.t_ns,
        int(dur_ns),
        s.phase,
        stall=s.stall,
        request=s.request,
        token=s.token,
        graph=s.graph,
        node=s.node,
        layer=s.layer,
        op=s.op,
        name=s.name,
        shape=s.shape,
        timed=s.timed,
    )


# ---- the trace as arrays -------------------------------------------------------------


@dataclass
class _Graph:
    """One graph's kernels: work, DRAM traffic and the host gap before each."""

    graph: int
    phase: str
    flops: np.ndarray
    bytes_: np.ndarray
    gaps_ns: np.ndarray
    first_kernel: int  # global index of its first kernel
    node_ids: np.ndarray
    layers: np.ndarray | None = None  # each kernel's layer (-1: none); ``build`` only


@dataclass
class _Stall:
    dur_ns: int
    kind: str
    phase: str
    token_request: int  # >= 0: a token of that request is produced at the stall's end
    graph: int = -1  # the graph a submit stall precedes, a sample stall follows


@dataclass
class PhoneTrace:
    """A recorded run prepared once for a profile: graphs as arrays, stalls between.
    ``steps`` is the run in order; ``request_begin`` marks, per step index, the
    requests that begin before that step (as ``control.replay`` emits REQUEST_BEGIN).
    """

    profile_name: str
    steps: list[_Graph | _Stall]
    request_begin: dict[int, int]
    n_kernels: int
    tokens: int
    _index: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)
    # per recorded segment (``build`` only): its start and length on the recording
    # host's clock, the stall step it became (-1: none) and where a switch issued at
    # its start lands (``_seg_at_step`` >= 0: that step's start, else kernel
    # ``_seg_at_kernel``; ``n_kernels``: after the last kernel)
    _seg_t_ns: np.ndarray | None = field(default=None, repr=False)
    _seg_dur_ns: np.ndarray | None = field(default=None, repr=False)
    _seg_step: np.ndarray | None = field(default=None, repr=False)
    _seg_at_step: np.ndarray | None = field(default=None, repr=False)
    _seg_at_kernel: np.ndarray | None = field(default=None, repr=False)
    # CPU time ``build`` took (ms on this host; 0 for a trace filled incrementally)
    build_cpu_ms: float = field(default=0.0, repr=False, compare=False)
    # ``build_columns`` leaves ``_index`` empty (a dict entry per kernel is the burst
    # of small objects it avoids); ``kernel_index`` fills it from the steps when asked
    _index_from_steps: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        segments: Sequence[Segment],
        profile: SimProfile,
        *,
        host_model: bool = True,
        pause: Callable[[], None] | None = None,
    ) -> PhoneTrace:
        """Walk the recorded segments once, applying the phone host model; with
        ``host_model=False`` the segments are taken as they are (already through
        ``phone_segments``, or a synthetic trace): inter-kernel stalls become the gap
        before the next kernel, stalls keep their length, and kernels without
        per-kernel timing get the profile's ``host_submission_ns``, as replay does.
        ``pause()`` is called every ``BUILD_PAUSE_EVERY`` segments: a server's settle
        worker waits there (or raises) while a request runs, as in the passes."""
        if not segments:
            raise ValueError("accounting needs at least one segment")
        cpu0 = time.process_time()
        segs = _graph_ids(segments)
        steps: list[_Graph | _Stall] = []
        request_begin: dict[int, int] = {}
        request = -1
        n_kernels = 0
        tokens = 0
        index: dict[tuple[int, int], int] = {}
        costs: dict[tuple[str, int], tuple[float, float]] = {}
        pending_gap = 0  # host_model=False: inter-kernel stall before the next kernel
        i = 0
        n = len(segs)
        seg_step = [-1] * n  # the stall step a segment became
        seg_kernel = [-1] * n  # the kernel index a segment became
        next_pause = BUILD_PAUSE_EVERY if pause is not None else n
        inter = StallKind.INTER_KERNEL
        while i < n:
            if i >= next_pause:
                pause()  # type: ignore[misc]
                next_pause = i + BUILD_PAUSE_EVERY
            s = segs[i]
            if s.request >= 0 and s.request != request and s.stall is not StallKind.IDLE:
                request = s.request
                request_begin[len(steps)] = request
            if s.kind == "stall":
                kind = s.stall or StallKind.IDLE
                i += 1
                if kind is StallKind.INTER_KERNEL:
                    if not host_model:
                        pending_gap += int(s.dur_ns)
                    continue  # else replaced by the host model
                seg_step[i - 1] = len(steps)
                if kind is StallKind.IDLE:
                    request = -1
                    steps.append(_Stall(int(s.dur_ns), kind.value, s.phase, -1, s.graph))
                    continue
                dur = profile.scale_host_ns(s.dur_ns) if host_model else int(s.dur_ns)
                tok = -1
                if kind is StallKind.SAMPLE and request >= 0:
                    tok = request
                    tokens += 1
                steps.append(_Stall(dur, kind.value, s.phase, tok, s.graph))
                continue
            graph, phase = s.graph, s.phase
            flops: list[float] = []
            bytes_: list[float] = []
            nodes: list[int] = []
            layers: list[int] = []
            own_gaps: list[int] = []
            sub_ns = profile.host_submission_ns
            base = n_kernels  # this graph's first kernel
            while i < n:
                k = segs[i]
                if k.kind == "kernel":
                    if k.graph != graph:
                        break
                elif k.stall is not inter:
                    break
                if i >= next_pause:
                    pause()  # type: ignore[misc]
                    next_pause = i + BUILD_PAUSE_EVERY
                i += 1
                if k.kind != "kernel":
                    if not host_model:
                        pending_gap += int(k.dur_ns)
                    continue
                sh = k.shape
                # by the shape object: a recording shares each distinct shape (the
                # segments hold every keyed one alive while its id is a key)
                key = (k.op, id(sh))
                work = costs.get(key)
                if work is None:
                    c = cost(k.op, sh)
                    work = costs[key] = (c.flops, c.bytes)
                if work == (0, 0):
                    continue
                seg_kernel[i - 1] = base + len(flops)
                flops.append(work[0])
                bytes_.append(work[1])
                nodes.append(k.node)
                layers.append(k.layer)
                if not host_model:
                    own_gaps.append(pending_gap + (0 if k.timed else sub_ns))
                    pending_gap = 0
            if not flops:
                continue
            for j, node in enumerate(nodes):
                index[(graph, node)] = n_kernels + j
            steps.append(
                _Graph(
                    graph,
                    phase,
                    np.asarray(flops, dtype=np.float64),
                    np.asarray(bytes_, dtype=np.float64),
                    profile.host_gaps_ns(len(flops))
                    if host_model
                    else np.asarray(own_gaps, dtype=np.int64),
                    n_kernels,
                    np.asarray(nodes, dtype=np.int64),
                    np.asarray(layers, dtype=np.int64),
                )
            )
            n_kernels += len(flops)
        out = cls(profile.name, steps, request_begin, n_kernels, tokens, index)
        out._anchors(
            np.fromiter((x.t_ns for x in segs), dtype=np.int64, count=n),
            np.fromiter((x.dur_ns for x in segs), dtype=np.int64, count=n),
            np.asarray(seg_step, dtype=np.int64),
            np.asarray(seg_kernel, dtype=np.int64),
        )
        out.build_cpu_ms = (time.process_time() - cpu0) * 1e3
        return out

    @classmethod
    def build_columns(
        cls,
        cols: SegmentColumns,
        profile: SimProfile,
        *,
        pause: Callable[[], None] | None = None,
    ) -> PhoneTrace:
        """``build(cols.segments(), profile)`` (host model on) from the arrays of a
        ``SegmentStore``, with no Python object per segment or kernel: the same steps,
        request marks, token count and switch anchors, to the bit. A settle worker
        builds a request's trace this way so its memory is a few arrays, which malloc
        returns, not tens of thousands of small objects left fragmenting pymalloc's
        arenas (issue 14). ``kernel_index`` works on it as well (filled on first use).
        ``pause()`` is called about every ``BUILD_PAUSE_EVERY`` segments, between
        steps."""
        n = len(cols)
        if not n:
            raise ValueError("accounting needs at least one segment")
        cpu0 = time.process_time()
        code = {None: 0, StallKind.SUBMIT: 1, StallKind.INTER_KERNEL: 2}
        code.update({StallKind.SAMPLE: 3, StallKind.IDLE: 4})
        table = cols.table
        # per table entry, then per row
        e_kernel = np.fromiter((t[0] == "kernel" for t in table), dtype=bool, count=len(table))
        e_stall = np.fromiter((code.get(t[2], 5) for t in table), dtype=np.int8, count=len(table))
        work: dict[tuple[str, int], tuple[float, float]] = {}
        e_flops = np.zeros(len(table), dtype=np.float64)
        e_bytes = np.zeros(len(table), dtype=np.float64)
        e_real = np.zeros(len(table), dtype=bool)
        for j, t in enumerate(table):
            if t[0] != "kernel":
                continue
            key = (t[3], id(t[5]))
            w = work.get(key)
            if w is None:
                c = cost(t[3], t[5])
                w = work[key] = (c.flops, c.bytes)
            e_real[j] = w != (0, 0)
            e_flops[j], e_bytes[j] = w
        m = cols.meta
        kern = e_kernel[m]
        stall = e_stall[m]  # the segment's own ``stall`` (kernels: theirs, None)
        inter = ~kern & (stall == 2)
        rows = np.arange(n)
        # with_graphs: a submit stall takes the graph of the next kernel, a sample stall
        # that of the last kernel since the last idle stall (graph < 0 only)
        graph = cols.graph.copy()
        kg = cols.graph
        nxt_k = np.minimum.accumulate(np.where(kern, rows, n)[::-1])[::-1]
        g_next = np.append(kg, -1)[nxt_k]
        fill = ~kern & (stall == 1) & (graph < 0) & (g_next >= 0)
        graph[fill] = g_next[fill]
        last = np.maximum.accumulate(np.where(kern | (~kern & (stall == 4)), rows, -1))
        g_prev = np.where(last >= 0, np.where(kern[last], kg[last], -1), -1)
        fill = ~kern & (stall == 3) & (graph < 0) & (g_prev >= 0)
        graph[fill] = g_prev[fill]
        # a graph's run of kernels: from a kernel whose last non-inter-kernel segment
        # before it is not a kernel of its graph, through inter-kernel stalls and that
        # graph's kernels; everything else is a step of its own (or dropped)
        last_ni = np.maximum.accumulate(np.where(~inter, rows, -1))
        prev = np.append(-1, last_ni[:-1])
        has_prev = prev >= 0
        prev_kernel = has_prev & kern[np.maximum(prev, 0)]
        cont = kern & prev_kernel & (graph[np.maximum(prev, 0)] == kg)
        inner = cont | (inter & prev_kernel)
        tops = np.flatnonzero(~inner)
        ends = np.append(tops[1:], n)
        real = kern & e_real[m]
        real_at = np.flatnonzero(real)  # kernel index -> row
        seg_kernel = np.full(n, -1, dtype=np.int64)
        seg_kernel[real_at] = np.arange(len(real_at))
        seg_step = np.full(n, -1, dtype=np.int64)
        k_lo = np.searchsorted(real_at, tops)
        k_hi = np.searchsorted(real_at, ends)
        flops_k = e_flops[m[real_at]]
        bytes_k = e_bytes[m[real_at]]
        nodes_k = cols.node[real_at]
        layers_k = cols.layer[real_at]
        entries = m[tops].tolist()
        reqs = cols.request[tops].tolist()
        durs = cols.dur_ns[tops].tolist()
        graphs = graph[tops].tolist()
        steps: list[_Graph | _Stall] = []
        request_begin: dict[int, int] = {}
        request = -1
        tokens = 0
        every = BUILD_PAUSE_EVERY if pause is not None else n + 1
        next_pause = every
        idle = StallKind.IDLE
        for top, (row, e, req, dur, g) in enumerate(
            zip(tops.tolist(), entries, reqs, durs, graphs, strict=True)
        ):
            if row >= next_pause:
                pause()  # type: ignore[misc]
                next_pause = row + every
            kind_s, phase, st = table[e][0], table[e][1], table[e][2]
            if req >= 0 and req != request and st is not idle:
                request = req
                request_begin[len(steps)] = request
            if kind_s == "stall":
                kind = st or idle
                if kind is StallKind.INTER_KERNEL:
                    continue
                seg_step[row] = len(steps)
                if kind is idle:
                    request = -1
                    steps.append(_Stall(int(dur), kind.value, phase, -1, g))
                    continue
                tok = -1
                if kind is StallKind.SAMPLE and request >= 0:
                    tok = request
                    tokens += 1
                steps.append(_Stall(profile.scale_host_ns(dur), kind.value, phase, tok, g))
                continue
            a, b = int(k_lo[top]), int(k_hi[top])
            if b == a:
                continue
            steps.append(
                _Graph(
                    g,
                    phase,
                    flops_k[a:b],
                    bytes_k[a:b],
                    profile.host_gaps_ns(b - a),
                    a,
                    nodes_k[a:b],
                    layers_k[a:b],
                )
            )
        out = cls(profile.name, steps, request_begin, len(real_at), tokens)
        out._index_from_steps = True
        out._anchors(cols.t_ns, cols.dur_ns, seg_step, seg_kernel)
        out.build_cpu_ms = (time.process_time() - cpu0) * 1e3
        return out

    def _anchors(
        self, t_ns: np.ndarray, dur_ns: np.ndarray, st: np.ndarray, ke: np.ndarray
    ) -> None:
        """Where a switch issued at each recorded segment's start lands: a stall step's
        start, or the next launched kernel (a dropped segment -- a recorded
        inter-kernel gap, a no-op kernel -- takes the anchor of the one after it).
        ``st``/``ke``: the stall step / kernel index each segment became (-1: none)."""
        n = len(t_ns)
        has = (st >= 0) | (ke >= 0)
        nxt = np.where(has, np.arange(n), n)
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]  # next segment with an anchor
        st_x = np.append(st, -1)
        ke_x = np.append(np.where(st >= 0, -1, ke), self.n_kernels)  # past the end
        self._seg_t_ns = t_ns
        self._seg_dur_ns = dur_ns
        self._seg_step = st
        self._seg_at_step = st_x[nxt]
        self._seg_at_kernel = np.where(st_x[nxt] >= 0, -1, ke_x[nxt])

    def place(self, t_ns: Sequence[int] | np.ndarray, freq_hz: Sequence[int]) -> Switches:
        """Switches issued at host times ``t_ns`` (on the recording's clock, as the live
        loop's executor logs them: ``Governor.applied_log``) anchored where they were
        issued on the recorded timeline, so they keep their place when the phone's
        host model re-times the run: one issued inside a stall (submit, sample, idle)
        lands at the same fraction of that stall; one issued inside a kernel or a
        recorded inter-kernel gap lands as the host reaches the next launched kernel
        (never before it was issued); one before the first segment at the first, one
        after the last at the end. ``build`` traces only."""
        if self._seg_t_ns is None:
            raise ValueError("place needs a trace made by PhoneTrace.build")
        starts = self._seg_t_ns
        assert self._seg_dur_ns is not None and self._seg_step is not None
        assert self._seg_at_step is not None and self._seg_at_kernel is not None
        t = np.asarray(t_ns, dtype=np.int64)
        hz = np.asarray(freq_hz, dtype=np.int64)
        if len(t) != len(hz):
            raise ValueError("place: one frequency per switch time")
        n = len(starts)
        if n > 1 and bool((np.diff(starts) < 0).any()):
            raise ValueError("place: the recorded segments are not in time order")
        held = np.searchsorted(starts, t, side="right") - 1  # the segment t falls in
        h = np.clip(held, 0, n - 1)
        step_h = self._seg_step[h]
        inside = (held >= 0) & (step_h >= 0) & (t < starts[h] + self._seg_dur_ns[h])
        j = np.searchsorted(starts, t, side="left")  # the first segment from t on
        jx = np.minimum(j, n)
        at_step_x = np.append(self._seg_at_step, -1)
        at_kernel_x = np.append(self._seg_at_kernel, self.n_kernels)
        phone_dur = np.array(
            [self.steps[k].dur_ns if k >= 0 else 0 for k in step_h.tolist()], dtype=np.float64
        )
        offset = (t - starts[h]) * phone_dur / np.maximum(self._seg_dur_ns[h], 1)
        return Switches(
            hz,
            np.where(inside, np.rint(offset), 0).astype(np.int64),
            np.where(inside, -1, at_kernel_x[jx]),
            np.where(inside, step_h, at_step_x[jx]),
        )

    @classmethod
    def shared(cls, segments: Sequence[Segment], profile: SimProfile) -> PhoneTrace:
        """``build(segments, profile, host_model=False)``, built once for the last
        (segments, profile) asked for: the benchmark's default run and its offline
        controllers all account the same phone segments. The cache holds the
        segments list itself and matches it by identity (do not modify it after)."""
        global _SHARED
        if _SHARED is not None and _SHARED[0] is segments and _SHARED[1] == profile:
            return _SHARED[2]
        trace = cls.build(segments, profile, host_model=False)
        _SHARED = (segments, profile, trace)
        return trace

    @classmethod
    def empty(cls, profile: SimProfile) -> PhoneTrace:
        """A trace to fill incrementally, as a live loop finishes graphs and stalls."""
        return cls(profile.name, [], {}, 0, 0, {})

    def begin_request(self, request: int) -> None:
        """Request ``request`` begins before the next step (its TTFT starts here)."""
        self.request_begin[len(self.steps)] = int(request)

    def add_stall(self, dur_ns: int, kind: str, phase: str, *, token_request: int = -1) -> None:
        """A stall as the phone runs it (already scaled: ``SimProfile.scale_host_ns``);
        ``token_request`` >= 0 marks a sample stall that ends with a token of it."""
        self.steps.append(_Stall(int(dur_ns), kind, phase, int(token_request)))
        if token_request >= 0:
            self.tokens += 1

    def add_graph(
        self,
        graph: int,
        phase: str,
        flops: np.ndarray,
        bytes_: np.ndarray,
        gaps_ns: np.ndarray,
        node_ids: np.ndarray | None = None,
    ) -> None:
        """One graph's launched kernels (no-ops left out) with the host gap before each
        (``SimProfile.host_gaps_ns(len(flops))`` on the phone)."""
        f = np.asarray(flops, dtype=np.float64)
        nodes = (
            np.arange(len(f), dtype=np.int64)
            if node_ids is None
            else np.asarray(node_ids, dtype=np.int64)
        )
        if not (len(f) == len(bytes_) == len(gaps_ns) == len(nodes)):
            raise ValueError("add_graph: flops, bytes_, gaps_ns and node_ids need one entry each")
        for j, node in enumerate(nodes):
            self._index[(int(graph), int(node))] = self.n_kernels + j
        self.steps.append(
            _Graph(
                int(graph),
                phase,
                f,
                np.asarray(bytes_, dtype=np.float64),
                np.asarray(gaps_ns, dtype=np.int64),
                self.n_kernels,
                nodes,
            )
        )
        self.n_kernels += len(f)

    def kernel_index(self, graph: int, node: int) -> int:
        """Global index of a graph's node among the trace's kernels (for switches
        anchored to nodes, as a per-graph plan is)."""
        if self._index_from_steps:
            self._index_from_steps = False
            for step in self.steps:
                if isinstance(step, _Graph):
                    for j, nd in enumerate(step.node_ids.tolist()):
                        self._index[(step.graph, nd)] = step.first_kernel + j
        try:
            return self._index[(graph, node)]
        except KeyError:
            raise KeyError(f"graph {graph} node {node} is not a kernel of this trace") from None


_SHARED: tuple[Sequence[Segment], SimProfile, PhoneTrace] | None = None


@dataclass(frozen=True)
class Switches:
    """Frequency switches a controller issued, in issue order. Each is anchored either
    at a virtual time (``at_ns``, on the simulated run's clock, 0 = its start) or at a
    kernel (``at_kernel``: issued as the host reaches that kernel, before its gap;
    ``n_kernels``: after the last; ``-1`` = use ``at_ns``) or ``at_ns`` after a
    stall step begins (``at_step`` >= 0, ``PhoneTrace.place``). The device applies
    them after its switch latency and minimum dwell, as ``set_hz`` does."""

    freq_hz: np.ndarray
    at_ns: np.ndarray
    at_kernel: np.ndarray
    at_step: np.ndarray | None = None

    @classmethod
    def at_times(cls, t_ns: Sequence[int], freq_hz: Sequence[int]) -> Switches:
        t = np.asarray(t_ns, dtype=np.int64)
        return cls(np.asarray(freq_hz, dtype=np.int64), t, np.full(len(t), -1, np.int64))

    @classmethod
    def at_kernels(cls, kernel: Sequence[int], freq_hz: Sequence[int]) -> Switches:
        k = np.asarray(kernel, dtype=np.int64)
        return cls(np.asarray(freq_hz, dtype=np.int64), np.zeros(len(k), np.int64), k)


@dataclass(frozen=True)
class Schedule:
    """Switches planned offline on a predicted clock (``rel_ns``: issue times, 0 = the
    run's start, ascending) with the predicted start of every step (``step_ns``), as
    the oracle plans them. The run re-anchors the schedule at each step's start and
    at each ``anchor_kernel`` (a block start inside a graph) as the host reaches it,
    as the oracle does on events, so model error does not accumulate: when the anchor
    comes more than ``tolerance_ns`` off its prediction (relative to the last anchor),
    the level the schedule has in effect there is issued at once and the later
    switches move with it. While the device lags the plan (a switch still pending, or
    a level other than ``kernel_hz`` planned for the kernel at hand) every kernel
    anchors (``kernel_ns``), as every node ask does in replay: that is when kernels run
    off their predicted time; in step with the plan the drift cannot change, and the
    batch runs whole to the next block."""

    rel_ns: np.ndarray
    freq_hz: np.ndarray
    step_ns: np.ndarray
    tolerance_ns: int = 2_000
    # more anchors inside graphs: a kernel's global index (ascending) and the predicted
    # time the host reaches it (before its gap)
    anchor_kernel: np.ndarray | None = None
    anchor_ns: np.ndarray | None = None
    # every kernel: the predicted time the host reaches it (before its gap), and the
    # level planned for it
    kernel_ns: np.ndarray | None = None
    kernel_hz: np.ndarray | None = None


@dataclass
class Account:
    """Figures of one accounting pass (all simulated)."""

    energy_j: float
    energy_by_phase_j: dict[str, float]
    time_by_phase_ns: dict[str, int]
    duration_ns: int
    tokens: int
    ttft_ms: float
    tpot_ms: float
    switches: int
    cpu_ms: float
    simulated: bool = True
    # each request's tokens, TTFT and TPOT (``engine.latency``), in request order
    requests_latency: tuple[RequestLatency, ...] = ()

    @property
    def energy_per_token_j(self) -> float:
        return self.energy_j / self.tokens if self.tokens else float("nan")


def _device(
    profile: SimProfile | SimGpu,
    governor: str | None,
    share: float,
    background: Sequence[tuple[int, float]],
    governor_phase_ns: int = 0,
) -> SimGpu:
    """A fresh device for a profile; a given ``SimGpu`` (or a stand-in for one) as is,
    in userspace mode when ``governor`` is None (as replay runs every controller but
    ``default``)."""
    if not isinstance(profile, SimProfile):
        if governor_phase_ns:
            raise ValueError("a timer phase needs a fresh device: pass the profile")
        if governor is None:
            profile.governor = None
        return profile
    return SimGpu(
        profile,
        governor=governor,
        background_share=share,
        background_schedule=list(background),
        governor_phase_ns=governor_phase_ns,
    )


def _run(
    trace: PhoneTrace,
    dev: SimGpu,
    switches: Switches | None,
    phase_hz: tuple[int, int] | None = None,
    schedule: Schedule | None = None,
) -> Account:
    """Run ``trace`` on ``dev`` applying ``switches``. ``phase_hz`` = (prefill, decode)
    issues the prefill level as each prefill graph's submit begins and the decode
    level as it ends, as the ``phase`` baseline does. ``schedule``: an offline
    schedule, re-anchored at every step (``Schedule``)."""
    cpu0 = time.process_time()
    t_start = dev.now_ns()
    e0 = dev.energy_j
    ph_e0 = dict(dev.energy_by_phase_j)
    ph_t0 = dict(dev.time_by_phase_ns)
    sw0 = dev.switches
    # switch instants: (t_ns, order, Hz); kernel-anchored ones are handled where their
    # kernel starts
    timed: list[tuple[int, int, int]] = []
    by_kernel: dict[int, list[int]] = {}
    by_step: dict[int, list[tuple[int, int, int]]] = {}  # step -> (offset, order, Hz)
    if switches is not None:
        at_step = (
            switches.at_step.tolist()
            if switches.at_step is not None
            else [-1] * len(switches.freq_hz)
        )
        for j, (hz, k, at, st) in enumerate(
            zip(
                switches.freq_hz.tolist(),
                switches.at_kernel.tolist(),
                switches.at_ns.tolist(),
                at_step,
                strict=True,
            )
        ):
            if k >= 0:
                by_kernel.setdefault(k, []).append(hz)
            elif st >= 0:
                by_step.setdefault(st, []).append((at, j, hz))
            else:
                timed.append((t_start + at, j, hz))
    timed.sort()
    q = 0  # next timed instant

    # the offline schedule: issue times relative to t_start + offset
    rel: list[float] = schedule.rel_ns.tolist() if schedule is not None else []
    rel_hz: list[int] = schedule.freq_hz.tolist() if schedule is not None else []
    n_rel = len(rel)
    r = 0  # next schedule switch
    offset = 0.0
    if n_rel:
        r = bisect.bisect_right(rel, 0.0)
        dev.set_hz(rel_hz[max(r - 1, 0)])  # in effect at the start: the last wins

    def fire_due() -> None:
        nonlocal q, r
        now = dev.now_ns()
        while True:  # both queues, earliest first
            t_q = timed[q][0] if q < len(timed) else math.inf
            t_r = int(t_start + offset + rel[r]) if r < n_rel else math.inf
            if min(t_q, t_r) > now:
                return
            if t_r < t_q:
                dev.set_hz(rel_hz[r])
                r += 1
            else:
                dev.set_hz(timed[q][2])
                q += 1

    def next_stop() -> int | None:
        t_q = timed[q][0] if q < len(timed) else None
        if r >= n_rel:
            return t_q
        t_r = int(t_start + offset + rel[r])
        return t_r if t_q is None else min(t_q, t_r)

    # kernel anchors (a block start inside a graph): global index -> predicted time
    sk_kernel = (
        schedule.anchor_kernel
        if schedule is not None and schedule.anchor_kernel is not None
        else np.zeros(0, dtype=np.int64)
    )
    sk_n = len(sk_kernel)
    sk_list: list[int] = sk_kernel.tolist()
    sk_pred_list: list[float] = (
        schedule.anchor_ns.tolist()
        if sk_n and schedule is not None and schedule.anchor_ns is not None
        else [0.0] * sk_n
    )

    kns: np.ndarray | None = None
    khz: list[int] = []
    if schedule is not None and schedule.kernel_ns is not None and schedule.kernel_hz is not None:
        kns = schedule.kernel_ns
        khz = schedule.kernel_hz.tolist()

    def lagging(k: int) -> bool:
        """The device is not at the level planned for kernel ``k`` (or will change)."""
        return getattr(dev, "next_switch", None) is not None or dev.current_hz() != khz[k]

    def drift_end(lo: int, i: int, cut: int, f: np.ndarray, b: np.ndarray, g: np.ndarray) -> int:
        """Off the plan, kernels run off their predicted time: the first kernel in
        ``(i, cut)`` at which the drift has moved past the tolerance (where replay, at
        that node's ask, re-anchors), assuming the level in effect holds; else ``cut``."""
        assert kns is not None and schedule is not None
        if cut - i <= 1:
            return cut
        share = 1.0 - float(getattr(dev, "background_share", 0.0))
        hz = dev.current_hz()
        nxt = getattr(dev, "next_switch", None)
        if nxt is not None and nxt[0] <= dev.now_ns():
            hz = nxt[1]  # due now: lands as the batch starts
        # in windows growing from a few kernels: the drift usually crosses early, and
        # the sums are of whole ns (exact in float64), so the same as one pass
        t = float(dev.now_ns())
        j, w = i, 8
        coefs = getattr(dev.profile, "kernel_ns_coefs", None)
        while j < cut - 1:
            k = min(cut, j + w + 1)
            if k - j <= DRIFT_PY_MAX and coefs is not None:
                hit, t = _drift_window(
                    coefs(hz, share),
                    f[j : k - 1].tolist(),
                    b[j : k - 1].tolist(),
                    g[j : k - 1].tolist(),
                    kns[lo + j + 1 : lo + k].tolist(),
                    t,
                    t_start,
                    offset,
                    schedule.tolerance_ns,
                )
                if hit >= 0:
                    return j + 1 + hit
                j, w = k - 1, 4 * w
                continue
            dur = np.rint(dev.profile.kernel_ns_array(f[j:k], b[j:k], hz, share))
            reach = t + np.cumsum(g[j : k - 1] + dur[:-1])  # host reaches j+1..k-1
            off = reach - t_start - kns[lo + j + 1 : lo + k]
            over = np.abs(off - offset) > schedule.tolerance_ns
            if bool(over.any()):
                return j + 1 + int(np.argmax(over))
            t = float(reach[-1])
            j, w = k - 1, 4 * w
        return cut

    def stop_at() -> int | None:
        """The next switch instant, or a pending level change landing (off the plan)."""
        stop = next_stop()
        nxt = getattr(dev, "next_switch", None)
        land = nxt[0] if nxt is not None else None
        if (
            kns is not None
            and land is not None
            and land > dev.now_ns()
            and (stop is None or land < stop)
        ):
            return int(land)
        return stop

    def anchor(si: int) -> None:
        assert schedule is not None
        reanchor(float(schedule.step_ns[si]))

    def reanchor(pred_ns: float) -> None:
        """The anchor predicted at ``pred_ns`` (on the schedule's clock) is now."""
        nonlocal r, offset
        assert schedule is not None
        now = dev.now_ns()
        off = now - t_start - pred_ns
        if abs(off - offset) <= schedule.tolerance_ns:
            return
        offset = off
        r = bisect.bisect_right(rel, now - t_start - offset)
        dev.set_hz(rel_hz[max(r - 1, 0)])

    begin_ns: dict[int, int] = {}
    token_ns: dict[int, list[int]] = {}
    anchors = np.asarray(sorted(by_kernel), dtype=np.int64)
    # a short batch inside a graph (after its first) through the per-kernel calls: what
    # run_batch does for it, without its numpy set-up (userspace mode: no governor
    # notifications to place)
    small_ok = (
        isinstance(dev, SimGpu)
        and dev.governor is None
        and not dev._load_changes  # its other device events: none
    )
    for si, step in enumerate(trace.steps):
        req = trace.request_begin.get(si)
        if req is not None:
            begin_ns[req] = dev.now_ns()
            token_ns.setdefault(req, [])
        for at, j, hz in by_step.get(si, ()):
            bisect.insort(timed, (dev.now_ns() + at, j, hz), lo=q)
        if n_rel and si:
            anchor(si)
        fire_due()
        if isinstance(step, _Stall):
            if phase_hz is not None and step.kind == "submit" and step.phase == "prefill":
                dev.set_hz(phase_hz[0])
            end = dev.now_ns() + step.dur_ns
            first = True
            while True:
                stop = next_stop()
                upto = end if stop is None or stop >= end else stop
                if first:
                    dev.run_gap(upto - dev.now_ns(), kind=step.kind, phase=step.phase)
                    first = False
                else:
                    dev.advance_to(upto, phase=step.phase)
                fire_due()
                if upto >= end:
                    break
            if step.token_request >= 0:
                token_ns.setdefault(step.token_request, []).append(dev.now_ns())
            continue
        f, b, g = step.flops, step.bytes_, step.gaps_ns
        n = len(f)
        lo = step.first_kernel
        a0 = int(np.searchsorted(anchors, lo))
        a1 = int(np.searchsorted(anchors, lo + n))
        cuts = [int(k) - lo for k in anchors[a0:a1]]
        if sk_n:  # the schedule's anchors inside this graph: re-anchor as each is reached
            s0 = bisect.bisect_left(sk_list, lo)
            s1 = bisect.bisect_left(sk_list, lo + n)
            if s1 > s0:
                cuts = sorted({*cuts, *(k - lo for k in sk_list[s0:s1])})
        i = 0
        for cut in [*cuts, n]:
            while i < cut:
                # off the plan: up to where the drift moves (re-anchor there)
                end = drift_end(lo, i, cut, f, b, g) if kns is not None and lagging(lo + i) else cut
                res = (
                    _small_batch(dev, f, b, g, i, end, step.phase, stop_at())
                    if end - i <= SMALL_BATCH and i > 0 and small_ok
                    else dev.run_batch(
                        f[i:end], b[i:end], g[i:end], phase=step.phase, stop_at_ns=stop_at()
                    )
                )
                i += res.n_done
                if i < end and (res.gap_left_ns != g[i] or res.work_left != 1.0):
                    f, b, g = f.copy(), b.copy(), g.copy()
                    g[i] = res.gap_left_ns
                    f[i] *= res.work_left
                    b[i] *= res.work_left
                fire_due()
                if kns is not None and i == end < cut:
                    reanchor(kns[lo + i])
                    fire_due()
            if cut < n:
                if sk_n:
                    j = bisect.bisect_left(sk_list, lo + cut)
                    if j < sk_n and sk_list[j] == lo + cut:
                        reanchor(sk_pred_list[j])
                        fire_due()
                for hz in by_kernel.get(lo + cut, ()):
                    dev.set_hz(hz)
        if phase_hz is not None and step.phase == "prefill":
            dev.set_hz(phase_hz[1])
    fire_due()
    for hz in by_kernel.get(trace.n_kernels, ()):
        dev.set_hz(hz)  # issued after the last kernel
    latency = per_request(token_ns, begin_ns)
    ttft_ms, tpot_ms = pooled_ms(latency)
    by_phase = {ph: e - ph_e0.get(ph, 0.0) for ph, e in dev.energy_by_phase_j.items()}
    t_phase = {ph: ns - ph_t0.get(ph, 0) for ph, ns in dev.time_by_phase_ns.items()}
    tokens = sum(len(t) for t in token_ns.values())
    return Account(
        energy_j=dev.energy_j - e0,
        energy_by_phase_j=by_phase,
        time_by_phase_ns=t_phase,
        duration_ns=dev.now_ns() - t_start,
        tokens=tokens,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        switches=dev.switches - sw0,
        cpu_ms=(time.process_time() - cpu0) * 1e3,
        requests_latency=latency,
    )


# batches of up to this many kernels go through ``_small_batch``
SMALL_BATCH = 4
# ``drift_end``'s windows of up to this many kernels in Python numbers (``_drift_window``)
DRIFT_PY_MAX = 24


def _drift_window(
    coefs: tuple[float, float, float, float],
    f: list[float],
    b: list[float],
    g: list[int],
    pred_ns: list[float],
    t: float,
    t_start: int,
    offset: float,
    tolerance_ns: int,
) -> tuple[int, float]:
    """One window of ``drift_end``, as its numpy lines compute it: kernel ``x``'s
    time (``SimProfile.kernel_ns_array``'s operations, rounded half to even), the host
    reaching the next kernel at ``t`` plus the running sum of gaps and kernels
    (``np.cumsum``: from the first, in order), its drift from the prediction
    ``pred_ns``. Returns the first window index past the tolerance (-1: none) and the
    time the host reaches the window's last kernel."""
    c_f, c_b, w_lo, floor = coefs
    acc = 0.0
    reach = t
    for x in range(len(f)):
        t_c = f[x] * c_f
        t_m = b[x] * c_b
        hi, lo = (t_c, t_m) if t_c >= t_m else (t_m, t_c)
        d = hi + lo * w_lo
        step = g[x] + float(round(d if d >= floor else floor))
        acc = step if x == 0 else acc + step
        reach = t + acc
        if abs(reach - t_start - pred_ns[x] - offset) > tolerance_ns:
            return x, reach
    return -1, reach


class _Ran(NamedTuple):
    n_done: int
    gap_left_ns: int
    work_left: float


def _small_batch(
    dev: SimGpu,
    f: np.ndarray,
    b: np.ndarray,
    g: np.ndarray,
    i: int,
    end: int,
    phase: str,
    stop_at_ns: int | None,
) -> Any:
    """``dev.run_batch(f[i:end], b[i:end], g[i:end], phase=phase, stop_at_ns=...)``
    for a few kernels of a graph whose earlier kernels ran (the device's phase is
    ``phase``), by the per-kernel path that ``run_batch`` itself takes where an event
    falls: each gap by ``run_gap``, each kernel by ``run_kernel``, a stop inside a gap
    ends it there, one inside a kernel splits it linearly where more than its floor
    from either end. A gap that could reach the idle timeout goes to ``run_batch``."""
    p = dev.profile
    gaps = g[i:end]
    if int(gaps.max()) * 2 >= p.idle_timeout_ns:
        return dev.run_batch(f[i:end], b[i:end], gaps, phase=phase, stop_at_ns=stop_at_ns)
    floor = p.kernel_floor_ns
    for k in range(end - i):
        t = dev.now_ns()
        gk = int(gaps[k])
        if stop_at_ns is not None:
            if stop_at_ns <= t:
                return _Ran(k, gk, 1.0)
            if stop_at_ns <= t + gk:
                dev.run_gap(int(stop_at_ns - t), kind="inter_kernel", phase=phase)
                return _Ran(k, int(t + gk - stop_at_ns), 1.0)
        dev.run_gap(gk, kind="inter_kernel", phase=phase)
        nxt = dev.next_switch
        if nxt is not None and nxt[0] <= dev.now_ns():
            # a switch due at the kernel's start (an empty gap does not land it):
            # run_batch lands it before it times the kernel
            rest = gaps[k:].copy()
            rest[0] = 0
            res = dev.run_batch(
                f[i + k : end], b[i + k : end], rest, phase=phase, stop_at_ns=stop_at_ns
            )
            return _Ran(k + res.n_done, res.gap_left_ns, res.work_left)
        fk, bk = float(f[i + k]), float(b[i + k])
        if stop_at_ns is not None:
            now = dev.now_ns()
            full = dev.kernel_ns(fk, bk)
            if now + floor < stop_at_ns < now + full - max(1_000, floor):
                frac = (stop_at_ns - now) / full
                dev.run_kernel("batch", fk * frac, bk * frac, phase=phase)
                return _Ran(k, 0, 1.0 - frac)
        dev.run_kernel("batch", fk, bk, phase=phase)
    return _Ran(end - i, 0, 1.0)


def applied_energy(
    trace: PhoneTrace,
    profile: SimProfile | SimGpu,
    switches: Switches,
    *,
    background_share: float = 0.0,
    background: Sequence[tuple[int, float]] = (),
) -> Account:
    """Energy and latency of the recorded timeline on the simulated device, given the
    switches a live loop actually issued (the controller is not run again). A
    ``SimGpu`` passed in is used as is (its clock and state carry over) in userspace
    mode (its governor off); a profile gets a fresh device."""
    dev = _device(profile, None, background_share, background)
    return _run(trace, dev, switches)


def default_shadow(
    trace: PhoneTrace,
    profile: SimProfile | SimGpu,
    *,
    background_share: float = 0.0,
    background: Sequence[tuple[int, float]] = (),
    governor_phase_ns: int = 0,
) -> Account:
    """The same timeline under the device's default governor (the reference every
    saving and latency change is measured against); ``governor_phase_ns``: its polling
    timer's phase (``SimGpu``), on a fresh device of the profile."""
    dev = _device(profile, "default", background_share, background, governor_phase_ns)
    return _run(trace, dev, None)


def scheduled_energy(
    trace: PhoneTrace,
    profile: SimProfile | SimGpu,
    schedule: Schedule,
    *,
    background_share: float = 0.0,
    background: Sequence[tuple[int, float]] = (),
) -> Account:
    """An offline schedule (the oracle's) played on the simulated device, re-anchored
    at every step (``Schedule``)."""
    dev = _device(profile, None, background_share, background)
    return _run(trace, dev, None, schedule=schedule)


def static_levels(
    trace: PhoneTrace,
    profile: SimProfile,
    *,
    background_share: float = 0.0,
    background: Sequence[tuple[int, float]] = (),
) -> dict[int, Account]:
    """Every level pinned for the whole run (set at the start, as ``Static`` does):
    what the hindsight baselines choose from."""
    out: dict[int, Account] = {}
    for hz in profile.levels_hz:
        sw = Switches.at_times([0], [hz])
        out[int(hz)] = applied_energy(
            trace, profile, sw, background_share=background_share, background=background
        )
    return out


def phase_split(
    trace: PhoneTrace,
    profile: SimProfile,
    prefill_hz: int,
    decode_hz: int,
    *,
    background_share: float = 0.0,
    background: Sequence[tuple[int, float]] = (),
) -> Account:
    """Prefill at one level, decode at another (the ``phase`` baseline's schedule)."""
    dev = _device(profile, None, background_share, background)
    return _run(trace, dev, None, (int(prefill_hz), int(decode_hz)))


def summary(acc: Account, ref: Account) -> dict[str, Any]:
    """Saving and latency changes of ``acc`` against ``ref`` (fractions)."""
    return {
        "energy_saving_vs_default": 1.0 - acc.energy_j / ref.energy_j if ref.energy_j else None,
        "latency_change_vs_default": acc.tpot_ms / ref.tpot_ms - 1.0 if ref.tpot_ms else None,
        "ttft_change_vs_default": acc.ttft_ms / ref.ttft_ms - 1.0 if ref.ttft_ms else None,
    }
