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
    """

    def __init__(
        self,
        max_events: int | None = 2_000_000,
        *,
        window_ns: int | None = None,
        hold_unsettled: bool = False,
    ) -> None:
        if max_events is not None and max_events <= 0:
            raise ValueError(f"max_events must be positive or None, not {max_events}")
        if window_ns is not None and window_ns <= 0:
            raise ValueError(f"window_ns must be positive or None, not {window_ns}")
        self._lock = threading.Lock()
        self.max_events = max_events
        self.window_ns = window_ns
        self.hold_unsettled = hold_unsettled
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
    def from_events(cls, events: list[Event]) -> Timeline:
        """A timeline holding every one of ``events`` (a recorded trace)."""
        tl = cls(max_events=None)
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
            n = len(store)
            for ev in events:
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
