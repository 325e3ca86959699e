"""The timeline: engine events on one clock, and the kernel/stall segments derived from them.

Hook records (NODE_ASK/NODE_DONE) and token events (Python) are appended in time
order: node records of one ``llama_decode`` are drained by the time its DECODE_END is
appended. Segment boundaries are documented in docs/architecture.md.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .events import Event, EventKind, NodeShape, StallKind
from .segments import Phase, Segment

# Reference machine for sharing an untimed graph's compute time among its kernels:
# the weights only need the right proportions (assumption: a 2-core AVX2 CPU does
# about 50 GFLOP/s and streams about 20 GB/s; see docs/architecture.md).
_REF_FLOPS_PER_S = 50e9
_REF_BYTES_PER_S = 20e9


@functools.lru_cache(maxsize=65536)
def _weight(op: str, shape: NodeShape | None) -> float:
    """Relative duration of a node on the reference machine (cached: shapes repeat
    every token)."""
    from .graph import cost

    c = cost(op, shape)
    return max(c.flops / _REF_FLOPS_PER_S, c.bytes / _REF_BYTES_PER_S, 1e-9)


@dataclass
class _Graph:
    begin_ns: int
    phase: Phase
    request: int
    token: int
    nodes: list[Event] = field(default_factory=list)


class Timeline:
    """Ordered events plus incremental segment derivation.

    Thread-safe for one producer and readers. ``max_events`` bounds memory for long
    servers: the oldest events are dropped (counted in ``dropped``), while segment
    and stall totals keep accumulating.
    """

    def __init__(self, max_events: int = 2_000_000) -> None:
        self._lock = threading.Lock()
        self._events: deque[Event] = deque(maxlen=max_events)
        self._segments: deque[Segment] = deque(maxlen=max_events)
        self.dropped = 0
        self.counts: Counter[str] = Counter()
        self.stall_ns: Counter[str] = Counter()
        self.stall_count: Counter[str] = Counter()
        self.kernel_ns = 0
        self.kernel_count = 0
        self._graph: _Graph | None = None
        self._request = -1
        self._in_request = False
        self._in_prefill = False
        self._token = -1
        self._last_kernel_end_ns: int | None = None
        self._request_end_ns: int | None = None

    @classmethod
    def from_events(cls, events: list[Event]) -> Timeline:
        """A timeline holding every one of ``events`` (a recorded trace)."""
        tl = cls(max_events=max(len(events), 1))
        tl.extend(events)
        return tl

    # -- producing -------------------------------------------------------------
    def append(self, event: Event) -> list[Segment]:
        """Add one event; returns the segments it completed (possibly none)."""
        return self.extend((event,))

    def extend(self, events: Iterable[Event]) -> list[Segment]:
        """Add events in order; returns the segments they completed."""
        out: list[Segment] = []
        with self._lock:
            store, counts, derive = self._events, self.counts, self._derive
            for ev in events:
                if len(store) == store.maxlen:
                    self.dropped += 1
                store.append(ev)
                counts[ev.kind.value] += 1
                if ev.kind is EventKind.NODE_ASK or ev.kind is EventKind.NODE_DONE:
                    if self._graph is not None:
                        self._graph.nodes.append(ev)
                    continue
                new = derive(ev)
                for seg in new:
                    self._account(seg)
                    self._segments.append(seg)
                out.extend(new)
        return out

    # -- reading ---------------------------------------------------------------
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def segments(self) -> list[Segment]:
        with self._lock:
            return list(self._segments)

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def stall_totals(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {
                k.value: {
                    "count": self.stall_count[k.value],
                    "total_ms": self.stall_ns[k.value] / 1e6,
                }
                for k in StallKind
            }

    # -- derivation ------------------------------------------------------------
    def _account(self, seg: Segment) -> None:
        if seg.kind == "kernel":
            self.kernel_ns += seg.dur_ns
            self.kernel_count += 1
        elif seg.stall is not None:
            self.stall_ns[seg.stall.value] += seg.dur_ns
            self.stall_count[seg.stall.value] += 1

    def _stall(self, kind: StallKind, t0: int, t1: int, phase: Phase) -> Segment | None:
        if t1 <= t0:
            return None
        return Segment(
            kind="stall",
            t_ns=t0,
            dur_ns=t1 - t0,
            phase=phase,
            stall=kind,
            request=self._request,
            token=self._token,
        )

    def _derive(self, ev: Event) -> list[Segment]:
        k = ev.kind
        out: list[Segment] = []
        if k is EventKind.REQUEST_BEGIN:
            if self._request_end_ns is not None:
                s = self._stall(StallKind.IDLE, self._request_end_ns, ev.t_ns, "idle")
                if s:
                    out.append(s)
            self._request += 1
            self._in_request = True
            self._token = -1
            self._last_kernel_end_ns = None
            self._request_end_ns = None
        elif k is EventKind.REQUEST_END:
            self._in_request = False
            self._request_end_ns = ev.t_ns
            self._last_kernel_end_ns = None
        elif k is EventKind.PREFILL_BEGIN:
            self._in_prefill = True
        elif k is EventKind.PREFILL_END:
            self._in_prefill = False
        elif k is EventKind.TOKEN:
            self._token = ev.token
        elif k is EventKind.DECODE_BEGIN:
            phase: Phase = "prefill" if self._in_prefill else "decode"
            if self._last_kernel_end_ns is not None:
                s = self._stall(StallKind.SAMPLE, self._last_kernel_end_ns, ev.t_ns, phase)
                if s:
                    out.append(s)
            self._graph = _Graph(ev.t_ns, phase, self._request, self._token + 1)
        elif k in (EventKind.NODE_ASK, EventKind.NODE_DONE):
            if self._graph is not None:
                self._graph.nodes.append(ev)
        elif k is EventKind.DECODE_END and self._graph is not None:
            out.extend(self._graph_segments(self._graph, ev.t_ns))
            self._graph = None
        return out

    def _graph_segments(self, g: _Graph, end_ns: int) -> list[Segment]:
        """Kernels and stalls of one llama_decode call."""
        asks = [e for e in g.nodes if e.kind is EventKind.NODE_ASK]
        if not asks:
            self._last_kernel_end_ns = end_ns
            return []
        done_at = {e.node: e.t_ns for e in g.nodes if e.kind is EventKind.NODE_DONE}
        out: list[Segment] = []
        s = self._stall(StallKind.SUBMIT, g.begin_ns, asks[0].t_ns, g.phase)
        if s:
            out.append(s)
        # Group asks into synchronised runs: a run ends at a node with a DONE record
        # (every node at `kernel` granularity, layer outputs at `layer`, none at
        # `graph`, where the run ends at DECODE_END).
        run: list[Event] = []
        run_start = asks[0].t_ns
        prev_end: int | None = None
        for ask in asks:
            if not run:
                run_start = ask.t_ns
                if prev_end is not None:
                    s = self._stall(StallKind.INTER_KERNEL, prev_end, ask.t_ns, g.phase)
                    if s:
                        out.append(s)
            run.append(ask)
            if ask.node in done_at:
                prev_end = done_at[ask.node]
                out.extend(self._run_kernels(g, run, run_start, prev_end))
                run = []
        if run:
            prev_end = end_ns
            out.extend(self._run_kernels(g, run, run_start, end_ns))
        self._last_kernel_end_ns = prev_end
        return out

    def _run_kernels(self, g: _Graph, run: list[Event], t0: int, t1: int) -> list[Segment]:
        span = max(t1 - t0, 0)
        if len(run) == 1:
            shares = [span]
            timed = True
        else:
            w = [_weight(e.op, e.shape) for e in run]
            total = sum(w)
            # cumulative rounding: the shares add up to the measured span exactly
            ends = list(itertools.accumulate(w))
            cut = [0] + [int(span * c / total) for c in ends[:-1]] + [span]
            shares = [b - a for a, b in itertools.pairwise(cut)]
            timed = False
        out = []
        t = t0
        for ev, dur in zip(run, shares, strict=True):
            out.append(
                Segment(
                    kind="kernel",
                    t_ns=t,
                    dur_ns=dur,
                    phase=g.phase,
                    request=g.request,
                    token=g.token,
                    graph=ev.graph,
                    node=ev.node,
                    layer=ev.layer,
                    op=ev.op,
                    name=ev.name,
                    shape=ev.shape,
                    timed=timed,
                )
            )
            t += dur
        return out
