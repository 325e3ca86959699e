"""The timeline: engine events on one clock, and the kernel/stall segments derived from them.

Hook records (NODE_ASK/NODE_DONE) and token events (Python) are appended in time
order: node records of one ``llama_decode`` are drained by the time its DECODE_END is
appended. Segment boundaries are documented in docs/architecture.md.
"""

from __future__ import annotations

import functools
import gc
import itertools
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

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

    Thread-safe for one producer and readers. Memory is bounded for long-running
    servers: only a window of events and segments is retained, the last
    ``max_events`` of each and, when ``window_ns`` is set, only those no older than
    ``window_ns`` before the newest event. Evicted events are counted in ``dropped``
    (segments in ``segments_dropped``); the totals (``counts``, stall and kernel
    totals, ``total_events``, ``total_segments``) keep counting everything.

    With ``hold_unsettled`` the window never evicts a segment that accounting has not
    processed yet: segments stay until ``mark_settled(n)`` says the first ``n``
    segments ever derived are accounted for, even past the window's bounds.

    Node records are collected per graph and a graph's segments derived in one pass at
    its DECODE_END (``_graph_segments``); ``reference=True`` keeps the per-event,
    per-segment path (``_extend_reference``), which gives the same segments and totals.
    """

    def __init__(
        self,
        max_events: int | None = 2_000_000,
        *,
        window_ns: int | None = None,
        hold_unsettled: bool = False,
        reference: bool = False,
    ) -> None:
        if max_events is not None and max_events <= 0:
            raise ValueError(f"max_events must be positive or None, not {max_events}")
        if window_ns is not None and window_ns <= 0:
            raise ValueError(f"window_ns must be positive or None, not {window_ns}")
        self._lock = threading.Lock()
        self.max_events = max_events
        self.window_ns = window_ns
        self.hold_unsettled = hold_unsettled
        # the per-event derivation (``_extend_reference``) instead of the per-graph one:
        # the same segments and totals, slower (kept for the tests)
        self.reference = reference
        self._events: deque[Event] = deque()
        self._segments: deque[Segment] = deque()
        self.dropped = 0
        self.segments_dropped = 0
        self.total_events = 0
        self.total_segments = 0
        self._settled = 0  # segments ever derived that accounting has processed
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
    def from_events(cls, events: list[Event], *, reference: bool = False) -> Timeline:
        """A timeline holding every one of ``events`` (a recorded trace)."""
        tl = cls(max_events=None, reference=reference)
        # hundreds of thousands of segments, none in a cycle: the cyclic collector
        # would rescan the trace again and again while they are built (most of the time)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            tl.extend(events)
        finally:
            if was_enabled:
                gc.enable()
        return tl

    # -- producing -------------------------------------------------------------
    def append(self, event: Event) -> list[Segment]:
        """Add one event; returns the segments it completed (possibly none)."""
        return self.extend((event,))

    def extend(self, events: Iterable[Event]) -> list[Segment]:
        """Add events in order; returns the segments they completed."""
        if self.reference:
            return self._extend_reference(events)
        evs = events if isinstance(events, (list, tuple)) else list(events)
        out: list[Segment] = []
        ask_k, done_k = EventKind.NODE_ASK, EventKind.NODE_DONE
        with self._lock:
            store, counts, derive = self._events, self.counts, self._derive
            store.extend(evs)
            # node records (nearly every event) are counted here, the rest by value;
            # a kind's key enters ``counts`` at its first event, as one by one
            asks = dones = 0
            g = self._graph
            nodes = g.nodes if g is not None else None
            for ev in evs:
                k = ev.kind
                if k is ask_k:
                    if not asks and "node_ask" not in counts:
                        counts["node_ask"] = 0
                    asks += 1
                    if nodes is not None:
                        nodes.append(ev)
                    continue
                if k is done_k:
                    if not dones and "node_done" not in counts:
                        counts["node_done"] = 0
                    dones += 1
                    if nodes is not None:
                        nodes.append(ev)
                    continue
                counts[k.value] += 1
                new = derive(ev)  # accounted as derived
                if new:
                    out.extend(new)
                g = self._graph
                nodes = g.nodes if g is not None else None
            if asks:
                counts["node_ask"] += asks
            if dones:
                counts["node_done"] += dones
            self._segments.extend(out)
            self.total_events += len(evs)
            self.total_segments += len(out)
            self._evict()
        return out

    def _extend_reference(self, events: Iterable[Event]) -> list[Segment]:
        """``extend`` event by event, each segment accounted as it is derived."""
        out: list[Segment] = []
        with self._lock:
            store, counts = self._events, self.counts
            n = len(store)
            for ev in events:
                store.append(ev)
                counts[ev.kind.value] += 1
                if ev.kind is EventKind.NODE_ASK or ev.kind is EventKind.NODE_DONE:
                    if self._graph is not None:
                        self._graph.nodes.append(ev)
                    continue
                new = self._derive(ev, reference=True)
                for seg in new:
                    self._account(seg)
                    self._segments.append(seg)
                out.extend(new)
            self.total_events += len(store) - n
            self.total_segments += len(out)
            self._evict()
        return out

    def mark_settled(self, n_segments: int) -> None:
        """Accounting has processed the first ``n_segments`` segments ever derived
        (``total_segments`` at the time it took them); they may now leave the window."""
        with self._lock:
            self._settled = max(self._settled, min(n_segments, self.total_segments))
            self._evict()

    @property
    def unsettled(self) -> int:
        """Segments derived but not yet marked settled (0 unless ``hold_unsettled``)."""
        return self.total_segments - self._settled if self.hold_unsettled else 0

    def _evict(self) -> None:
        """Drop what is outside the window (lock held)."""
        store, cap, window = self._events, self.max_events, self.window_ns
        if not store:
            return
        oldest_kept = store[-1].t_ns - window if window is not None else None
        while store and (
            (cap is not None and len(store) > cap)
            or (oldest_kept is not None and store[0].t_ns < oldest_kept)
        ):
            store.popleft()
            self.dropped += 1
        segs = self._segments
        first = self.total_segments - len(segs)  # index of segs[0] among all segments
        settled = self._settled if self.hold_unsettled else self.total_segments
        while (
            segs
            and first < settled
            and (
                (cap is not None and len(segs) > cap)
                or (oldest_kept is not None and segs[0].t_ns + segs[0].dur_ns < oldest_kept)
            )
        ):
            segs.popleft()
            first += 1
            self.segments_dropped += 1

    # -- reading ---------------------------------------------------------------
    def events(self) -> list[Event]:
        """The retained window of events, oldest first."""
        with self._lock:
            return list(self._events)

    def segments(self) -> list[Segment]:
        """The retained window of segments, oldest first."""
        with self._lock:
            return list(self._segments)

    def window(self) -> dict[str, int | bool | None]:
        """What the retained window holds and how much has left it."""
        with self._lock:
            return {
                "max_events": self.max_events,
                "window_ns": self.window_ns,
                "events": len(self._events),
                "segments": len(self._segments),
                "events_dropped": self.dropped,
                "segments_dropped": self.segments_dropped,
                "total_events": self.total_events,
                "total_segments": self.total_segments,
                "unsettled_segments": self.unsettled,
                "complete": self.dropped == 0 and self.segments_dropped == 0,
            }

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def stall_totals(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return self._stall_totals()

    def _stall_totals(self) -> dict[str, dict[str, float]]:
        return {
            k.value: {"count": self.stall_count[k.value], "total_ms": self.stall_ns[k.value] / 1e6}
            for k in StallKind
        }

    def totals(self) -> dict[str, Any]:
        """Every running total at one instant (safe while the producer appends)."""
        with self._lock:
            return {
                "events": dict(self.counts),
                "kernels": {"count": self.kernel_count, "total_ms": self.kernel_ns / 1e6},
                "stalls": self._stall_totals(),
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

    def _derive(self, ev: Event, reference: bool = False) -> list[Segment]:
        """The segments one non-node event completes, accounted (kernel and stall
        totals) as they are derived unless ``reference`` (the caller accounts them)."""
        k = ev.kind
        out: list[Segment] = []
        if k is EventKind.REQUEST_BEGIN:
            if self._request_end_ns is not None:
                s = self._stall(StallKind.IDLE, self._request_end_ns, ev.t_ns, "idle")
                if s:
                    out.append(s)
                    if not reference:
                        self._account(s)
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
                    if not reference:
                        self._account(s)
            self._graph = _Graph(ev.t_ns, phase, self._request, self._token + 1)
        elif k in (EventKind.NODE_ASK, EventKind.NODE_DONE):
            if self._graph is not None:
                self._graph.nodes.append(ev)
        elif k is EventKind.DECODE_END and self._graph is not None:
            if reference:
                out.extend(self._graph_segments_reference(self._graph, ev.t_ns))
            else:
                out.extend(self._graph_segments(self._graph, ev.t_ns))
            self._graph = None
        return out

    def _graph_segments(self, g: _Graph, end_ns: int) -> list[Segment]:
        """Kernels and stalls of one llama_decode call, accounted (kernel and stall
        totals): ``_graph_segments_reference`` in one pass, the common run of a single
        kernel (every node at ``kernel`` granularity) without a call."""
        ask_k, done_k = EventKind.NODE_ASK, EventKind.NODE_DONE
        nodes = g.nodes
        asks = [e for e in nodes if e.kind is ask_k]
        if not asks:
            self._last_kernel_end_ns = end_ns
            return []
        done_at = {e.node: e.t_ns for e in nodes if e.kind is done_k}
        out: list[Segment] = []
        append = out.append
        phase, g_req, g_tok = g.phase, g.request, g.token
        s_req, s_tok = self._request, self._token  # stalls carry the current ones
        inter = StallKind.INTER_KERNEL
        k_ns = k_n = i_ns = i_n = 0
        t_first = asks[0].t_ns
        if t_first > g.begin_ns:
            self.stall_ns["submit"] += t_first - g.begin_ns
            self.stall_count["submit"] += 1
            append(
                Segment(
                    "stall", g.begin_ns, t_first - g.begin_ns, phase, StallKind.SUBMIT, s_req, s_tok
                )
            )
        run: list[Event] = []
        run_start = t_first
        prev_end: int | None = None
        get = done_at.get
        for ask in asks:
            t = ask.t_ns
            if not run:
                run_start = t
                if prev_end is not None and t > prev_end:
                    append(Segment("stall", prev_end, t - prev_end, phase, inter, s_req, s_tok))
                    i_ns += t - prev_end
                    i_n += 1
            d = get(ask.node)
            if d is None:
                run.append(ask)
                continue
            if not run:  # a run of one kernel: timed, the whole span
                span = d - t if d > t else 0
                append(
                    Segment(
                        "kernel",
                        t,
                        span,
                        phase,
                        None,
                        g_req,
                        g_tok,
                        ask.graph,
                        ask.node,
                        ask.layer,
                        ask.op,
                        ask.name,
                        ask.shape,
                        True,
                    )
                )
                k_ns += span
                k_n += 1
            else:
                run.append(ask)
                ks = self._run_kernels(g, run, run_start, d)
                out.extend(ks)
                k_ns += sum(x.dur_ns for x in ks)
                k_n += len(ks)
                run = []
            prev_end = d
        if run:
            prev_end = end_ns
            ks = self._run_kernels(g, run, run_start, end_ns)
            out.extend(ks)
            k_ns += sum(x.dur_ns for x in ks)
            k_n += len(ks)
        self._last_kernel_end_ns = prev_end
        self.kernel_ns += k_ns
        self.kernel_count += k_n
        if i_n:
            self.stall_ns["inter_kernel"] += i_ns
            self.stall_count["inter_kernel"] += i_n
        return out

    def _graph_segments_reference(self, g: _Graph, end_ns: int) -> list[Segment]:
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
