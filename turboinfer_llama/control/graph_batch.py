"""One graph's node records, as arrays: what a controller learns from after each decode.

Live, the records of a ``llama_decode`` are drained from the hook's ring once it
returns and turned into a :class:`GraphBatch` with numpy (no Python call per node);
replay builds the same batch from recorded segments at the same point (the graph's
end). A controller therefore gets, in both modes, exactly what the eval callback saw
at the run's granularity: every node's ask time, and the completion time of the nodes
it synchronised on (all of them at ``kernel``, the layer outputs at ``layer``, none at
``graph``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.lib.recfunctions import repack_fields

from ..engine.events import NodeShape
from ..engine.graph import cost
from ..engine.hooks import GraphRecords, records_same_shape, records_scan
from .model import node_times

LAYER_OUT_PREFIX = b"l_out-"
_ASK, _DONE = 0, 1
# the fields that decide a node's cost (engine.hooks.RECORD_DTYPE)
_KEY_FIELDS = ["op", "flags", "ne", "type", "src0_ne", "src0_type", "src1_ne", "src1_type"]
_HAS_SHAPE, _HAS_SRC0, _HAS_SRC1 = 1, 2, 4


@dataclass(slots=True)
class GraphBatch:
    """One graph (one ``llama_decode``). Times are ns on the run's clock; per-node
    arrays are in the scheduler's order (node ordinal = index)."""

    graph: int
    phase: str  # "prefill" | "decode"
    n_tokens: int
    granularity: str  # "graph" | "layer" | "kernel"
    t_begin_ns: int  # DECODE_BEGIN
    t_first_ns: int  # first ask: compute starts
    t_end_ns: int  # DECODE_END
    ask_ns: np.ndarray  # int64
    done_ns: np.ndarray  # int64, -1 where the callback saw no completion
    c_ns: np.ndarray  # compute time at the reference top clock (engine.graph cost)
    m_ns: np.ndarray  # memory time
    launch: np.ndarray  # 1.0 for a kernel, 0.0 for a no-op (view, reshape ...)
    layer_out: np.ndarray  # bool: the node is a layer's output (``l_out-<i>``)
    extra: dict[str, float] = field(default_factory=dict)
    # the plan solved from this graph is for the graph this many after it: 2 where the
    # engine had begun the next graph when the planner took this one and plans are
    # retargeted past it (``plan.HOLD_FOR_ENGINE``, ``plan.retarget``), else 1
    ahead: int = 1

    @property
    def n(self) -> int:
        return len(self.ask_ns)

    @property
    def compute_ns(self) -> int:
        return self.t_end_ns - self.t_first_ns


_Costs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class NodeCosts:
    """Per-node (compute, memory, launch) and layer-output flags from hook records.

    Two caches: a whole graph's, keyed by the bytes that decide every node's cost --
    llama.cpp pads the KV length (to 256 cells), so consecutive decode graphs are
    byte-identical in those fields and a graph costs one comparison -- and, on a miss,
    a per-node one keyed by the same bytes (one ``np.unique`` plus a dict lookup per
    distinct node)."""

    GRAPHS_KEPT = 4  # recent distinct graphs (decode, prefill, their KV paddings)

    def __init__(self, max_entries: int = 200_000) -> None:
        self._cache: dict[bytes, tuple[float, float, float]] = {}
        self._by_shape: dict[tuple[str, NodeShape | None], tuple[float, float, float]] = {}
        self._max = max_entries
        self._graphs: list[tuple[np.ndarray, _Costs]] = []
        # replay's twin of the per-graph cache, keyed by the nodes' (op, shape,
        # layer output): (compute ns, memory ns, launch, layer output) arrays
        self.by_nodes: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.graph_hits = 0
        # repeats (engine.hooks.GraphRecords): the last template's checks
        self._asks_of: tuple[np.ndarray, bool] | None = None
        self._same_of: tuple[np.ndarray, np.ndarray, bool] | None = None

    def all_asks(self, template: np.ndarray) -> bool:
        """Whether every record of ``template`` (a repeat's rows) is an ask; kept for
        the last template asked about."""
        if self._asks_of is not None and self._asks_of[0] is template:
            return self._asks_of[1]
        got = not template["phase"].any()
        self._asks_of = (template, got)
        return got

    def same_as_last(self, template: np.ndarray) -> bool:
        """``records_same_shape(template, last_seen)``, compared once per template
        while :attr:`last_seen` stays (a repeat's rows are its template's)."""
        seen = self.last_seen
        if seen is None:
            return False
        hit = self._same_of
        if hit is not None and hit[0] is template and hit[1] is seen:
            return hit[2]
        got = records_same_shape(template, seen)
        self._same_of = (template, seen, got)
        return got

    @property
    def last_seen(self) -> np.ndarray | None:
        """The records of the most recent graph shape asked for (its cache key)."""
        return self._graphs[0][0] if self._graphs else None

    def of_last(self) -> _Costs:
        """The costs of :attr:`last_seen`'s shape: the caller found its graph the same."""
        self.graph_hits += 1
        return self._graphs[0][1]

    def of_graph(self, asks: np.ndarray) -> _Costs:
        """Compute ns, memory ns, launch (1.0 a kernel, 0.0 a no-op) and the
        layer-output flags of one graph's asks (``engine.hooks.RECORD_DTYPE``). While a
        shape repeats, the very same (read-only) arrays are handed out: the planner
        keys its own per-shape work on their identity."""
        asks = np.ascontiguousarray(asks)
        for i, (seen, arrays) in enumerate(self._graphs):
            if records_same_shape(asks, seen):
                if i:
                    self._graphs.insert(0, self._graphs.pop(i))
                self.graph_hits += 1
                return arrays
        cmx = self.of_records(asks)
        layer_out = np.char.startswith(asks["name"], LAYER_OUT_PREFIX).astype(bool)
        c, m, launch = (np.ascontiguousarray(cmx[:, j]) for j in range(3))
        got = (c, m, launch, layer_out)
        for a in got:
            a.setflags(write=False)
        # a copy: the caller's buffer may be reused for the next drain
        self._graphs.insert(0, (asks.copy(), got))
        del self._graphs[self.GRAPHS_KEPT :]
        return got

    def of(self, op: str, shape: NodeShape | None) -> tuple[float, float, float]:
        key = (op, shape)
        got = self._by_shape.get(key)
        if got is None:
            kc = cost(op, shape)
            c, m = node_times(np.array([kc.flops]), np.array([kc.bytes]))
            got = (float(c[0]), float(m[0]), 0.0 if kc.is_noop else 1.0)
            if len(self._by_shape) < self._max:
                self._by_shape[key] = got
        return got

    def of_records(self, rec: np.ndarray) -> np.ndarray:
        """(n, 3) array of compute ns, memory ns, launch for ring records."""
        if len(rec) == 0:
            return np.zeros((0, 3))
        keys = repack_fields(rec[_KEY_FIELDS])  # packed: no other field in the key
        raw = keys.view(np.dtype((np.void, keys.dtype.itemsize)))
        uniq, first, inv = np.unique(raw, return_index=True, return_inverse=True)
        vals = np.empty((len(uniq), 3))
        cache = self._cache
        for i, u in enumerate(uniq):
            kb = u.tobytes()
            got = cache.get(kb)
            if got is None:
                got = self._from_record(rec[first[i]])
                if len(cache) < self._max:
                    cache[kb] = got
            vals[i] = got
        return vals[inv.reshape(-1)]

    def _from_record(self, r: np.void) -> tuple[float, float, float]:
        flags = int(r["flags"])
        shape = None
        if flags & _HAS_SHAPE:
            shape = NodeShape(
                ne=tuple(int(x) for x in r["ne"]),  # type: ignore[arg-type]
                type=int(r["type"]),
                src0_ne=tuple(int(x) for x in r["src0_ne"]) if flags & _HAS_SRC0 else None,  # type: ignore[arg-type]
                src0_type=int(r["src0_type"]) if flags & _HAS_SRC0 else -1,
                src1_ne=tuple(int(x) for x in r["src1_ne"]) if flags & _HAS_SRC1 else None,  # type: ignore[arg-type]
                src1_type=int(r["src1_type"]) if flags & _HAS_SRC1 else -1,
                nbytes=int(r["nbytes"]),
            )
        op = bytes(r["op"]).decode("ascii", "replace")
        return self.of(op, shape)


def records_array(raw: object) -> np.ndarray | GraphRecords | None:
    """Hook records as ``RECORD_DTYPE``: the native ring's array (or its repeat of an
    earlier graph's, ``GraphRecords``) as is; the Python
    hook's tuples ``(t_ns, graph, node, phase, op, name, shape key)`` converted (the
    fallback path, where this costs what the Python callback already costs)."""
    if isinstance(raw, np.ndarray | GraphRecords):
        return raw
    if not raw:
        return None
    from ..engine.hooks import RECORD_DTYPE

    rows = list(raw)  # type: ignore[call-overload]
    rec = np.zeros(len(rows), dtype=RECORD_DTYPE)
    for i, (t_ns, graph, node, phase, op, name, key) in enumerate(rows):
        flags, ne, typ, s0_ne, s0_type, s1_ne, s1_type, nbytes = key
        rec[i] = (t_ns, graph, ne, s0_ne, s1_ne, nbytes, node, typ, s0_type, s1_type,
                  phase, flags, b"", op, name)  # fmt: skip
    return rec


_NO_DONE: dict[int, np.ndarray] = {}


def none_done(n: int) -> np.ndarray:
    """``done_ns`` of an ``n``-node graph whose completions the callback did not see
    (graph granularity): all -1, read-only, one array per size."""
    got = _NO_DONE.get(n)
    if got is None:
        got = np.full(n, -1, dtype=np.int64)
        got.setflags(write=False)
        if len(_NO_DONE) < 64:
            _NO_DONE[n] = got
    return got


def is_none_done(done_ns: np.ndarray) -> bool:
    """Whether ``done_ns`` is :func:`none_done`'s own array (a graph the ingest
    saw no completion of), told without reading it: live, the planner takes each
    graph cold from the caches, ~35 us for a pass over a gemma graph's 817 values."""
    return _NO_DONE.get(len(done_ns)) is done_ns


def batch_from_records(
    rec: np.ndarray | GraphRecords,
    *,
    graph: int,
    n_tokens: int,
    granularity: str,
    t_begin_ns: int,
    t_end_ns: int,
    costs: NodeCosts,
) -> GraphBatch | None:
    """The batch of graph ``graph`` from raw ring records (``engine.hooks.RECORD_DTYPE``);
    None when the graph produced no ask (nothing was computed)."""
    if len(rec) == 0:
        return None
    if isinstance(rec, GraphRecords):
        if rec.graph == graph and costs.all_asks(rec.template):
            # a repeat of an earlier graph's records (every decode token): the
            # template's rows are this graph's but for t_ns and graph
            own_asks, same, t_ns = True, costs.same_as_last(rec.template), rec.t_ns
            rec = rec.template
        else:
            rec = rec.records()
            own_asks, same, t_ns = records_scan(rec, graph, costs.last_seen)
    else:
        if not rec.flags.c_contiguous:
            rec = np.ascontiguousarray(rec)
        own_asks, same, t_ns = records_scan(rec, graph, costs.last_seen)
    costs_of: _Costs | None = None
    dones: np.ndarray | None = None
    if own_asks:
        # exactly this graph's asks (graph granularity): nothing to select, no copy
        asks, ask_ns = rec, t_ns
        if same:
            costs_of = costs.of_last()
    else:
        mine = rec["graph"] == graph
        phase = rec["phase"]
        # rows copied as bytes: numpy copies a structured array field by field, ~10x
        # slower
        rows = rec.view(np.uint8).reshape(len(rec), rec.dtype.itemsize)
        asks = rows[mine & (phase == _ASK)].view(rec.dtype).reshape(-1)
        ask_ns = asks["t_ns"].astype(np.int64)
        is_done = mine & (phase == _DONE)
        if is_done.any():
            dones = rows[is_done].view(rec.dtype).reshape(-1)
    if len(asks) == 0:
        return None
    n = len(asks)
    if dones is None:
        done_ns = none_done(n)
    else:
        done_ns = np.full(n, -1, dtype=np.int64)
        # a done record carries the ordinal of the last asked node
        base = int(asks["node"][0])
        idx = dones["node"].astype(np.int64) - base
        ok = (idx >= 0) & (idx < n)
        done_ns[idx[ok]] = dones["t_ns"][ok]
    c_ns, m_ns, launch, layer_out = costs_of if costs_of is not None else costs.of_graph(asks)
    return GraphBatch(
        graph=graph,
        phase="prefill" if n_tokens > 1 else "decode",
        n_tokens=n_tokens,
        granularity=granularity,
        t_begin_ns=int(t_begin_ns),
        t_first_ns=int(ask_ns[0]),
        t_end_ns=int(t_end_ns),
        ask_ns=ask_ns,
        done_ns=done_ns,
        c_ns=c_ns,
        m_ns=m_ns,
        launch=launch,
        layer_out=layer_out,
    )
