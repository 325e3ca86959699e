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

import numpy as np

from .blocks import NodeBlock, NodeTable
from .events import Event, EventKind, NodeShape, StallKind
from .segment_store import SegmentColumns
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
    nodes: list[Event | NodeBlock] = field(default_factory=list)


Derived = Segment | SegmentColumns  # one segment, or one graph's as arrays


def expand(items: Iterable[Derived]) -> list[Segment]:
    """``items`` as ``Segment`` objects, in order."""
    out: list[Segment] = []
    for x in items:
        if isinstance(x, SegmentColumns):
            out.extend(x.segments())
        else:
            out.append(x)
    return out


@dataclass
class _Structure:
    """What a graph's segments take from its records but their times (``Timeline.
    _structure``): over its asks, in order, unless said."""

    code: np.ndarray  # the records' (all of them) table codes, kinds, nodes: the key
    done: np.ndarray
    node: np.ndarray
    a_idx: np.ndarray  # the asks among the records
    na: np.ndarray  # their nodes
    end_src: np.ndarray  # by run: the record whose time ends it (all but a trailing run)
    trailing: bool  # the last run ends at DECODE_END
    starts: np.ndarray  # by run: its first ask
    run_of: np.ndarray
    arange: np.ndarray
    first: np.ndarray  # first / last of its run
    last: np.ndarray
    csum_lo: np.ndarray  # the run's weights accumulated before / through it
    csum_hi: np.ndarray
    total: np.ndarray  # its run's weights' sum
    layers: np.ndarray
    meta: np.ndarray  # the segment table's index for it as a kernel


class _Window:
    """A FIFO of items where some entries are blocks of many (``NodeBlock``,
    ``SegmentColumns``), counted item by item: the timeline's retained window."""

    def __init__(self, end_of_segment: bool) -> None:
        self._q: deque[Any] = deque()
        self._n = 0
        self._off = 0  # items of the first entry already dropped
        self._seg = end_of_segment  # eviction by t_ns + dur_ns (segments), else t_ns

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def append(self, item: Any) -> None:
        self._q.append(item)
        self._n += 1

    def add_block(self, block: NodeBlock | SegmentColumns) -> None:
        if len(block):
            self._q.append(block)
            self._n += len(block)

    def extend(self, items: Iterable[Any]) -> None:
        for x in items:
            if isinstance(x, (NodeBlock, SegmentColumns)):
                self.add_block(x)
            else:
                self.append(x)

    def last_t_ns(self) -> int:
        last = self._q[-1]
        return int(last.t_ns[-1]) if isinstance(last, NodeBlock) else int(last.t_ns)

    def items(self) -> list[Any]:
        out: list[Any] = []
        off = self._off
        for x in self._q:
            if isinstance(x, NodeBlock):
                out.extend(x.events(off))
            elif isinstance(x, SegmentColumns):
                out.extend(x.segments(off))
            else:
                out.append(x)
            off = 0
        return out

    def _key(self, x: Any) -> int:
        return int(x.t_ns + x.dur_ns) if self._seg else int(x.t_ns)

    def _keys(self, b: NodeBlock | SegmentColumns) -> np.ndarray:
        if isinstance(b, SegmentColumns):
            return b.t_ns + b.dur_ns
        return b.t_ns

    def evict(self, cap: int | None, oldest: int | None, limit: int) -> int:
        """Drop from the front while more than ``cap`` items are held or the front one
        is older than ``oldest`` (its t_ns, or a segment's end), at most ``limit``
        items; returns how many were dropped."""
        q = self._q
        popped = 0
        while q and popped < limit:
            head = q[0]
            if not isinstance(head, (NodeBlock, SegmentColumns)):
                if (cap is not None and self._n > cap) or (
                    oldest is not None and self._key(head) < oldest
                ):
                    q.popleft()
                    self._n -= 1
                    popped += 1
                    continue
                break
            off = self._off
            rem = len(head) - off
            kc = max(0, self._n - cap) if cap is not None else 0  # to drop for the cap
            if kc >= rem:
                j = rem
            elif oldest is None:
                j = kc
            else:
                keep = np.flatnonzero(self._keys(head)[off + kc :] >= oldest)
                j = kc + int(keep[0]) if len(keep) else rem
            j = min(j, limit - popped)
            self._n -= j
            popped += j
            if j >= rem:
                q.popleft()
                self._off = 0
                continue
            self._off += j
            break
        return popped


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
        self._events = _Window(end_of_segment=False)
        self._segments = _Window(end_of_segment=True)
        # graph segments as arrays (``extend_block``): their (kind, phase, stall, op,
        # name, shape, timed) by index, and each node table's index -> ours
        self._seg_table: list[tuple[Any, ...]] = []
        self._stall_meta: dict[tuple[StallKind, str], int] = {}
        self._kmaps: dict[tuple[int, str, bool], tuple[NodeTable, np.ndarray]] = {}
        # by phase: what a graph of asks only with these node-table codes (the same
        # array object while graphs have the same shape) shares its time by
        self._struct_cache: dict[str, _Structure] = {}
        self._asks_cache: dict[
            str, tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]
        ] = {}
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
        self._token_ns: int | None = None  # the last TOKEN event's time
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
        return expand(self.extend_lazy(events))

    def extend_lazy(self, events: Iterable[Event]) -> list[Derived]:
        """``extend``, a graph whose node records came as blocks (``extend_block``)
        giving its segments as one ``SegmentColumns``."""
        evs = events if isinstance(events, (list, tuple)) else list(events)
        out: list[Derived] = []
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
            self.total_segments += sum(len(x) if isinstance(x, SegmentColumns) else 1 for x in out)
            self._evict()
        return out

    def extend_block(self, block: NodeBlock) -> None:
        """Add node records given as arrays (``NodeBlock``): as ``extend`` with their
        events (``block.events()``) would, without building them. They complete no
        segment (a graph's segments come with its DECODE_END)."""
        n = len(block)
        if not n:
            return
        with self._lock:
            counts = self.counts
            done = block.done
            n_done = int(np.count_nonzero(done))
            n_ask = n - n_done
            # keys enter ``counts`` in the order of their kinds' first records
            first_done = bool(done[0])
            for key, k in (
                (("node_done", n_done), ("node_ask", n_ask))
                if first_done
                else (("node_ask", n_ask), ("node_done", n_done))
            ):
                if k:
                    counts[key] += k
            self._events.add_block(block)
            if self._graph is not None:
                self._graph.nodes.append(block)
            self.total_events += n
            self._evict()

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
        oldest_kept = store.last_t_ns() - window if window is not None else None
        if cap is None and oldest_kept is None:
            return
        self.dropped += store.evict(cap, oldest_kept, len(store))
        segs = self._segments
        first = self.total_segments - len(segs)  # index of segs[0] among all segments
        settled = self._settled if self.hold_unsettled else self.total_segments
        if segs and first < settled:
            self.segments_dropped += segs.evict(cap, oldest_kept, settled - first)

    # -- reading ---------------------------------------------------------------
    def events(self) -> list[Event]:
        """The retained window of events, oldest first."""
        with self._lock:
            return self._events.items()

    def segments(self) -> list[Segment]:
        """The retained window of segments, oldest first."""
        with self._lock:
            return self._segments.items()

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

    def _add_stall(
        self, out: list[Segment], kind: StallKind, t0: int, t1: int, phase: Phase, reference: bool
    ) -> None:
        """Append the stall ``[t0, t1)`` (none where empty) to ``out``, accounted unless
        ``reference`` (the caller accounts it)."""
        s = self._stall(kind, t0, t1, phase)
        if s:
            out.append(s)
            if not reference:
                self._account(s)

    def _derive(self, ev: Event, reference: bool = False) -> list[Segment]:
        """The segments one non-node event completes, accounted (kernel and stall
        totals) as they are derived unless ``reference`` (the caller accounts them)."""
        k = ev.kind
        out: list[Segment] = []
        if k is EventKind.REQUEST_BEGIN:
            if self._request_end_ns is not None:
                self._add_stall(
                    out, StallKind.IDLE, self._request_end_ns, ev.t_ns, "idle", reference
                )
            self._request += 1
            self._in_request = True
            self._token = -1
            self._token_ns = None
            self._last_kernel_end_ns = None
            self._request_end_ns = None
        elif k is EventKind.REQUEST_END:
            last_end, tok_ns = self._last_kernel_end_ns, self._token_ns
            if last_end is not None and tok_ns is not None and tok_ns >= last_end:
                # the request's last token: its sampling (the last graph's end to the
                # request's end) is a sample stall like every other token's, so the
                # token counts (replay's token times, TPOT). It used to fall between
                # segments: the last graph of a request was timed by no token, and
                # the oracle ran it at the bottom level for free (sim adreno640,
                # gemma recording, 2%: 17 mJ a request)
                self._add_stall(out, StallKind.SAMPLE, last_end, ev.t_ns, "decode", reference)
            self._in_request = False
            self._request_end_ns = ev.t_ns
            self._last_kernel_end_ns = None
        elif k is EventKind.PREFILL_BEGIN:
            self._in_prefill = True
        elif k is EventKind.PREFILL_END:
            self._in_prefill = False
        elif k is EventKind.TOKEN:
            self._token = ev.token
            self._token_ns = ev.t_ns
        elif k is EventKind.DECODE_BEGIN:
            phase: Phase = "prefill" if self._in_prefill else "decode"
            if self._last_kernel_end_ns is not None:
                self._add_stall(
                    out, StallKind.SAMPLE, self._last_kernel_end_ns, ev.t_ns, phase, reference
                )
            self._graph = _Graph(ev.t_ns, phase, self._request, self._token + 1)
        elif k in (EventKind.NODE_ASK, EventKind.NODE_DONE):
            if self._graph is not None:
                self._graph.nodes.append(ev)
        elif k is EventKind.DECODE_END and self._graph is not None:
            g = self._graph
            self._graph = None
            blocks = [x for x in g.nodes if isinstance(x, NodeBlock)]
            if blocks and len(blocks) == len(g.nodes) and not reference:
                cols = self._graph_columns(g, blocks, ev.t_ns)
                if cols is not None:
                    out.append(cols)  # type: ignore[arg-type]
                return out
            # mixed with events (or the reference): blocks as events
            nodes = [e for x in g.nodes for e in self._as_events(x)] if blocks else g.nodes
            if reference:
                out.extend(self._graph_segments_reference(g, ev.t_ns, nodes))  # type: ignore[arg-type]
            else:
                out.extend(self._graph_segments(g, ev.t_ns, nodes))  # type: ignore[arg-type]
        return out

    @staticmethod
    def _as_events(x: Event | NodeBlock) -> list[Event]:
        return x.events() if isinstance(x, NodeBlock) else [x]

    def _meta_stall(self, kind: StallKind, phase: Phase) -> int:
        key = (kind, phase)
        c = self._stall_meta.get(key)
        if c is None:
            c = self._stall_meta[key] = len(self._seg_table)
            self._seg_table.append(("stall", phase, kind, "", "", None, True))
        return c

    def _meta_kernels(
        self, table: NodeTable, phase: Phase, timed: bool, codes: np.ndarray
    ) -> np.ndarray:
        """The segment table's index for kernels of these node-table entries."""
        key = (id(table), phase, timed)
        ent = self._kmaps.get(key)
        if ent is None or ent[0] is not table:
            ent = (table, np.full(0, -1, dtype=np.int32))
        arr = ent[1]
        if len(arr) < len(table):
            arr = np.concatenate((arr, np.full(len(table) - len(arr), -1, dtype=np.int32)))
        self._kmaps[key] = (table, arr)
        got = arr[codes]
        missing = got < 0
        if missing.any():
            seg = self._seg_table
            for c in np.unique(codes[missing]).tolist():
                arr[c] = len(seg)
                seg.append(
                    ("kernel", phase, None, table.op[c], table.name[c], table.shape[c], timed)
                )
            got = arr[codes]
        return got

    def _graph_columns_asks(self, g: _Graph, b: NodeBlock, end_ns: int) -> SegmentColumns:
        """``_graph_columns`` for one block of asks only (``graph`` granularity): one
        run of every node, to DECODE_END; its weights' shares cached while the graphs
        keep their shape."""
        table = b.table
        m = len(b)
        t = b.t_ns
        t0 = int(t[0])
        submit = 1 if t0 > g.begin_ns else 0
        rows = submit + m
        span = max(end_ns - t0, 0)
        phase = g.phase
        if m == 1:
            kt: np.ndarray = t
            kd = np.full(1, span, dtype=np.int64)
            kmeta = self._meta_kernels(table, phase, True, b.code)
            klayers = table.layers[b.code]
        else:
            cached = self._asks_cache.get(phase)
            if cached is None or cached[0] is not b.code:
                w = table.weights[b.code]
                cached = (
                    b.code,
                    np.cumsum(w[:-1]),
                    sum(w.tolist()),  # as ``_run_kernels`` sums them
                    self._meta_kernels(table, phase, False, b.code),
                    table.layers[b.code],
                )
                self._asks_cache[phase] = cached
            _, csum, total, kmeta, klayers = cached
            cut = np.empty(m + 1, dtype=np.int64)
            cut[0] = 0
            cut[m] = span
            cut[1:m] = (span * csum / total).astype(np.int64)
            kt = t0 + cut[:-1]
            kd = np.diff(cut)
        cols = self._blank_columns(rows)
        if submit:
            self._submit_row(cols.t_ns, cols.dur_ns, cols.meta, g, t0, phase)
        k = slice(submit, rows)
        cols.t_ns[k] = kt
        cols.dur_ns[k] = kd
        cols.request[k] = g.request
        cols.token[k] = g.token
        cols.graph[k] = b.graph
        cols.node[k] = b.node
        cols.layer[k] = klayers
        cols.meta[k] = kmeta
        self.kernel_ns += span  # the shares add up to the span
        self.kernel_count += m
        self._last_kernel_end_ns = end_ns
        return cols

    def _blank_columns(self, rows: int) -> SegmentColumns:
        """``rows`` rows of a graph's columns to fill: request and token the current
        ones and graph, node and layer -1 (what a stall row carries), times and meta
        unset."""
        return SegmentColumns(
            t_ns=np.empty(rows, dtype=np.int64),
            dur_ns=np.empty(rows, dtype=np.int64),
            request=np.full(rows, self._request, dtype=np.int64),
            token=np.full(rows, self._token, dtype=np.int64),
            graph=np.full(rows, -1, dtype=np.int64),
            node=np.full(rows, -1, dtype=np.int64),
            layer=np.full(rows, -1, dtype=np.int64),
            meta=np.empty(rows, dtype=np.int32),
            table=self._seg_table,
        )

    def _submit_row(
        self,
        t_col: np.ndarray,
        d_col: np.ndarray,
        meta: np.ndarray,
        g: _Graph,
        first_ns: int,
        phase: Phase,
    ) -> None:
        """Row 0 of a graph's columns: the submit stall from its DECODE_BEGIN to its
        first kernel at ``first_ns``, accounted."""
        sub_ns = first_ns - g.begin_ns
        t_col[0] = g.begin_ns
        d_col[0] = sub_ns
        meta[0] = self._meta_stall(StallKind.SUBMIT, phase)
        self.stall_ns["submit"] += sub_ns
        self.stall_count["submit"] += 1

    def _graph_columns(
        self, g: _Graph, blocks: list[NodeBlock], end_ns: int
    ) -> SegmentColumns | None:
        """``_graph_segments`` on node records given as arrays: the same segments, as
        ``SegmentColumns``, accounted the same (kernel and stall totals). What depends
        only on the graph's nodes (runs, weights, table indices) is cached while graphs
        keep their shape (``_structure``)."""
        table = blocks[0].table
        if any(b.table is not table for b in blocks):
            raise ValueError("a graph's node blocks come from different decoders")
        if len(blocks) == 1:
            b = blocks[0]
            if not b.done.any():
                return self._graph_columns_asks(g, b, end_ns)
            t_all, graph_all, node_all, done, code_all = b.t_ns, b.graph, b.node, b.done, b.code
        else:
            t_all = np.concatenate([b.t_ns for b in blocks])
            graph_all = np.concatenate([b.graph for b in blocks])
            node_all = np.concatenate([b.node for b in blocks])
            done = np.concatenate([b.done for b in blocks])
            code_all = np.concatenate([b.code for b in blocks])
        st = self._structure(table, g.phase, code_all, done, node_all)
        if st is None:
            self._last_kernel_end_ns = end_ns
            return None
        a_idx, starts, run_of = st.a_idx, st.starts, st.run_of
        m = len(a_idx)
        ta = t_all[a_idx]
        run_end_t = t_all[st.end_src]
        if st.trailing:
            run_end_t = np.append(run_end_t, end_ns)
        run_t0 = ta[starts]
        # kernels: a run of one is timed, its whole span; a longer one shares its span
        # by the cost model's weights, rounded cumulatively (``_run_kernels``)
        span = np.maximum(run_end_t - run_t0, 0)
        span_k = span[run_of]
        cut_lo = np.where(st.first, 0, (span_k * st.csum_lo / st.total).astype(np.int64))
        cut_hi = np.where(st.last, span_k, (span_k * st.csum_hi / st.total).astype(np.int64))
        kt = run_t0[run_of] + cut_lo
        kd = cut_hi - cut_lo
        inter = np.zeros(len(starts), dtype=bool)
        inter[1:] = run_t0[1:] > run_end_t[:-1]
        submit = 1 if int(ta[0]) > g.begin_ns else 0
        cum_inter = np.cumsum(inter)
        n_inter = int(cum_inter[-1])
        rows = submit + m + n_inter
        kpos = st.arange + submit + cum_inter[run_of] if n_inter else None
        cols = self._blank_columns(rows)
        t_col, d_col, meta = cols.t_ns, cols.dur_ns, cols.meta
        phase = g.phase
        if submit:
            self._submit_row(t_col, d_col, meta, g, int(ta[0]), phase)
        at: Any = kpos if kpos is not None else slice(submit, rows)
        t_col[at] = kt
        d_col[at] = kd
        cols.request[at] = g.request
        cols.token[at] = g.token
        cols.graph[at] = graph_all[a_idx]
        cols.node[at] = st.na
        cols.layer[at] = st.layers
        meta[at] = st.meta
        self.kernel_ns += int(kd.sum())
        self.kernel_count += m
        if n_inter:
            ipos = (starts + submit + cum_inter - 1)[inter]
            prev = run_end_t[:-1][inter[1:]]
            gap = run_t0[inter] - prev
            t_col[ipos] = prev
            d_col[ipos] = gap
            meta[ipos] = self._meta_stall(StallKind.INTER_KERNEL, phase)
            self.stall_ns["inter_kernel"] += int(gap.sum())
            self.stall_count["inter_kernel"] += n_inter
        self._last_kernel_end_ns = int(run_end_t[-1])
        return cols

    def _structure(
        self,
        table: NodeTable,
        phase: Phase,
        code_all: np.ndarray,
        done: np.ndarray,
        node_all: np.ndarray,
    ) -> _Structure | None:
        """A graph's runs and weights, from its records' kinds, nodes and table codes
        (no times); the last one is reused while they repeat. None without asks."""
        c = self._struct_cache.get(phase)
        if (
            c is not None
            and c.code is code_all
            and np.array_equal(c.done, done)
            and np.array_equal(c.node, node_all)
        ):
            return c
        a_idx = np.flatnonzero(~done)
        m = len(a_idx)
        if not m:
            return None
        na = node_all[a_idx]
        ca = code_all[a_idx]
        d_idx = np.flatnonzero(done)
        if len(d_idx):
            # each node's last DONE record (a dict's last write wins)
            dn = node_all[d_idx]
            order = np.argsort(dn, kind="stable")
            sdn, src = dn[order], d_idx[order]
            last = np.ones(len(sdn), dtype=bool)
            last[:-1] = sdn[1:] != sdn[:-1]
            udn, usrc = sdn[last], src[last]
            pos = np.minimum(np.searchsorted(udn, na), len(udn) - 1)
            has = udn[pos] == na
            done_src = usrc[pos]
        else:
            has = np.zeros(m, dtype=bool)
            done_src = a_idx  # unused
        # runs: each ends at an ask with a DONE record, the last one at DECODE_END
        ends = np.flatnonzero(has)
        trailing = not bool(has[-1])
        starts = np.concatenate(([0], ends + 1))
        if not trailing:
            starts = starts[:-1]
        run_len = np.diff(np.append(starts, m))
        run_of = np.repeat(np.arange(len(starts)), run_len)
        first = np.zeros(m, dtype=bool)
        first[starts] = True
        last_k = np.zeros(m, dtype=bool)
        last_k[starts + run_len - 1] = True
        # a run's weights, accumulated in order from its start, and their sum (as
        # ``_run_kernels``: itertools.accumulate and sum over the run's list)
        csum_lo = np.zeros(m, dtype=np.float64)
        csum_hi = np.zeros(m, dtype=np.float64)
        total = np.ones(m, dtype=np.float64)
        timed = run_len[run_of] == 1
        multi = np.flatnonzero(run_len > 1)
        if len(multi):
            weights = table.weights
            for r in multi.tolist():
                s = int(starts[r])
                n = int(run_len[r])
                w = weights[ca[s : s + n]]
                acc = np.cumsum(w)
                csum_hi[s : s + n] = acc
                csum_lo[s + 1 : s + n] = acc[:-1]
                total[s : s + n] = sum(w.tolist())
        meta = np.empty(m, dtype=np.int32)
        meta[timed] = self._meta_kernels(table, phase, True, ca[timed])
        meta[~timed] = self._meta_kernels(table, phase, False, ca[~timed])
        st = _Structure(
            code=code_all,
            done=done,
            node=node_all,
            a_idx=a_idx,
            na=na,
            end_src=done_src[ends],
            trailing=trailing,
            starts=starts,
            run_of=run_of,
            arange=np.arange(m),
            first=first,
            last=last_k,
            csum_lo=csum_lo,
            csum_hi=csum_hi,
            total=total,
            layers=table.layers[ca],
            meta=meta,
        )
        self._struct_cache[phase] = st
        return st

    def _graph_segments(self, g: _Graph, end_ns: int, nodes: list[Event]) -> list[Segment]:
        """Kernels and stalls of one llama_decode call, accounted (kernel and stall
        totals): ``_graph_segments_reference`` in one pass, the common run of a single
        kernel (every node at ``kernel`` granularity) without a call."""
        ask_k, done_k = EventKind.NODE_ASK, EventKind.NODE_DONE
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

    def _graph_segments_reference(
        self, g: _Graph, end_ns: int, nodes: list[Event]
    ) -> list[Segment]:
        """Kernels and stalls of one llama_decode call."""
        asks = [e for e in nodes if e.kind is EventKind.NODE_ASK]
        if not asks:
            self._last_kernel_end_ns = end_ns
            return []
        done_at = {e.node: e.t_ns for e in nodes if e.kind is EventKind.NODE_DONE}
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
