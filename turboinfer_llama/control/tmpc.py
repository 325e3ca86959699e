"""Tube-based model predictive control of the GPU clock ("act before it's too late").

Decision points are event boundaries: graph start (first node), node completions at
``kernel`` granularity, graph end (the sampling stall begins), token yield, request
end, and the replay/governor timer during long stalls (``plan``).

State: latency debt = actual time - reference time (the default governor's shadow,
see ``reference.py``) since the request began; the level in effect; pending switches.

Horizon: ``horizon`` segments alternating compute and stall (3..6), i.e. up to three
compute blocks (rest of the current graph, then whole graphs from the phase's
template) with the forecast stalls between them. Stalls cost no latency, so their
level has a closed form: the bottom level when the stall's lower bound is longer
than the switch latency (the drop is issued one switch latency before the stall, as
the last kernels run; the raise one switch latency before the stall's *lower-bound*
end, so an early end cannot leave compute on the low clock), else the next compute
level. That leaves the compute levels, searched exhaustively over all L^Nc
combinations at once as outer sums of the per-segment tables (numpy broadcasting).

Nominal plan: minimise predicted energy (busy power x kernel time + idle power x
stalls and host gaps + switch cost) subject to
``debt + sum(d - d_ref) + tube <= slack * (reference elapsed + horizon reference)``.
The tube is the forecast error bound. Debt is measured against the shadow, which is
driven by the measured time, so an error in predicting absolute graph time cancels;
what reaches the debt is the error in the predicted slowdown ``d - d_ref``, bounded
by the upper quantile ``r`` of past relative graph-time errors: ``r * (d - d_ref)``.
Stalls add how far below its lower bound a stall has been seen to end (the raise is
timed on the lower bound) times the largest slowdown a low clock can cause.

Inside the current graph the plan is finer than one level: the graph is cut into
blocks (about one per layer, and the output projection on its own), and the time the
horizon leaves it is shared out by a price on time (Lagrangian relaxation): for each
price every block takes its cheapest level at that price, the cheapest price whose
blocks fit wins, and blocks of the next cheaper price are taken in order while the
time left allows. Memory-bound blocks (the output projection) go low, blocks whose
time scales with the clock stay higher; switches between blocks are issued one
switch latency early.

A graph with no template yet (the first prefill, the first decode graph) follows the
default governor's shadow live, node by node: same clock, no debt.

Ancillary feedback: inside a graph, every node completion compares elapsed time with
the nominal plan; ``level = planned + ceil(K * error / predicted graph time)``, so
falling behind pulls the clock up at once. Debt beyond the allowance shrinks the
next solve's budget (feedback at graph boundaries).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..engine.events import Event, EventKind, StallKind
from ..engine.graph import cost
from .base import Decision
from .forecast import Forecaster, StallStats
from .model import PowerTable, WorkloadModel, node_times
from .reference import DefaultShadow, ShadowParams

_SHADOW_CHUNKS = 24  # about one chunk per layer of a small model
_PLAN_CHUNKS = 24  # blocks of the current graph that may each get their own level
# prices on time (W = J/s) for the per-block Lagrangian search, cheapest first
_LAMBDAS = np.concatenate([[0.0], np.geomspace(0.01, 1000.0, 63)])

_COMBOS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _combos(n_levels: int, n_seg: int) -> tuple[np.ndarray, np.ndarray]:
    """All level combinations (rows, in ``itertools.product`` order) and the number of
    level changes inside each."""
    key = (n_levels, n_seg)
    if key not in _COMBOS:
        combos = np.array(list(itertools.product(range(n_levels), repeat=n_seg)), dtype=np.int64)
        changes = (np.diff(combos, axis=1) != 0).sum(axis=1).astype(np.float64)
        _COMBOS[key] = (combos, changes)
    return _COMBOS[key]


class _Graph:
    """Per-node work of one graph: compute/memory time at the top clock, launches."""

    __slots__ = (
        "c_ns",
        "cd",
        "ce",
        "cum_k",
        "cum_launch",
        "d_row",
        "e_row",
        "edges",
        "k",
        "kh",
        "launch",
        "m_ns",
        "n",
        "node_chunk",
    )

    def __init__(self, c_ns: np.ndarray, m_ns: np.ndarray, launch: np.ndarray) -> None:
        self.c_ns, self.m_ns, self.launch = c_ns, m_ns, launch
        self.n = len(c_ns)
        self.cum_k = np.zeros((1, 1))
        self.cum_launch = np.zeros(1)
        self.e_row = self.d_row = np.zeros(1)

    def tabulate(self, model, levels_hz: np.ndarray, host_ns: float, power: PowerTable) -> None:
        """Cumulative kernel time per level, and the graph's host gaps (measured,
        level-independent) shared out by kernel launches."""
        k, _ = model.level_times(self.c_ns, self.m_ns, self.launch, levels_hz)
        self.cum_k = np.vstack([np.zeros((1, len(levels_hz))), np.cumsum(k, axis=0)])
        per_launch = host_ns / max(float(self.launch.sum()), 1.0)
        self.cum_launch = np.concatenate([[0.0], np.cumsum(self.launch * per_launch)])
        # the whole graph per level: energy (busy kernels, idle host gaps) and time
        self.e_row = power.busy_w * self.cum_k[-1] + power.idle_w * host_ns
        self.d_row = self.cum_k[-1] + host_ns
        # per node (for the nominal trajectory) and per block (for per-block levels)
        self.k = k
        self.kh = np.diff(self.cum_launch)
        edges = np.unique(np.linspace(0, self.n, min(self.n, _PLAN_CHUNKS) + 1).astype(np.int64))
        self.edges = edges
        ck = np.diff(self.cum_k[edges], axis=0)
        ch = np.diff(self.cum_launch[edges])[:, None]
        self.ce = power.busy_w * ck + power.idle_w * ch
        self.cd = ck + ch
        self.node_chunk = np.repeat(np.arange(len(edges) - 1), np.diff(edges))

    def rest(self, done: int) -> tuple[np.ndarray, float]:
        """Kernel time per level and host time of the nodes after ``done``."""
        done = min(done, self.n)
        return self.cum_k[-1] - self.cum_k[done], float(self.cum_launch[-1] - self.cum_launch[done])


class TubeMPC:
    """The TurboInfer controller. See the module docstring for the formulation."""

    name = "tmpc"
    uses_device_governor = False

    def __init__(
        self,
        levels_hz: list[int],
        *,
        latency_slack: float = 0.02,
        switch_latency_ns: int = 500_000,
        power: PowerTable | None = None,
        shadow: ShadowParams | None = None,
        horizon: int = 5,
        feedback_gain: float = 50.0,
        tube_quantile: float = 0.9,
    ) -> None:
        if not 3 <= horizon <= 6:
            raise ValueError(f"horizon must be 3..6 segments, got {horizon}")
        self.levels = np.asarray(sorted(levels_hz), dtype=np.float64)
        self.levels_int = [int(x) for x in self.levels]
        self.L = len(self.levels)
        self.top = self.L - 1
        self.slack = latency_slack
        self.s_ns = int(switch_latency_ns)
        self.power = power or PowerTable.assumed(self.levels_int)
        self.model = WorkloadModel(self.power)
        self.forecast = Forecaster(cost_fn=lambda op, sh: (0.0, 0.0))
        self.shadow = DefaultShadow(self.levels, shadow or ShadowParams())
        self.n_compute = (horizon + 1) // 2
        self._max_slowdown = 1.0 - self.levels[0] / self.levels[-1]
        self.combos, self.changes = _combos(self.L, self.n_compute)
        first_change = self.combos[:, 0][None, :] != np.arange(self.L)[:, None]
        self.switch_cost = self.changes[None, :] + first_change  # per current level
        self.gain = feedback_gain
        self.rel_err = StallStats(window=64, quantile=tube_quantile, prior_ns=0.05)
        self._cost_cache: dict[tuple[str, object], tuple[float, float, float]] = {}
        self._templates: dict[str, _Graph] = {}
        self._plan: list[Decision] = []
        self.solves = 0
        self.feedback_raises = 0
        self._reset_request(0)
        self._initial = self.shadow.level
        self._hist: list[tuple[int, int]] = []  # (at_ns, level) requested, time order
        self._ik_count = 0
        self._busy_last: int | None = None
        self._margin_ns = 0.0
        self._last_graph_phase = "idle"
        self._graph_busy: int | None = None
        self._lv_nodes: np.ndarray | None = None
        self._live_ref: float | None = None
        self._decode_acc = (0.0, 0.0)  # decode (debt, reference) over past requests
        self._seg_nominal: tuple[np.ndarray, np.ndarray] | None = None
        self._live_t = 0

    # ---- state ---------------------------------------------------------------------

    def _reset_request(self, t_ns: int) -> None:
        self.debt_ns = 0.0
        self.ref_elapsed_ns = 0.0
        self.phase = "decode"
        self.in_compute = False
        self.stall_kind: StallKind | None = None
        self.t_stall = t_ns
        self.t_compute = t_ns
        self._nodes: list[tuple[float, float, float]] = []
        self._node_level: list[int] = []
        self._node_hz: list[float] = []
        self._ask_t = t_ns
        self.done = 0
        self.plan_level = self.top
        self._seg_start_t = t_ns
        self._seg_start_node = 0
        self._predicted_graph_ns = 0.0

    def _request(self, t_ns: int, level: int) -> Decision | None:
        """An immediate decision, unless that level is already requested."""
        if level == self._target(t_ns):
            return None
        self._hist.append((t_ns, level))
        return Decision(self.levels_int[level], t_ns, "tmpc")

    def _set_plan(self, t_ns: int, plan: list[Decision]) -> None:
        """Publish timed decisions; they replace the future part of the last plan."""
        hist = [h for h in self._hist if h[0] <= t_ns][-16:]
        hist += [(d.at_ns, self.levels_int.index(d.freq_hz)) for d in plan]
        hist.sort(key=lambda h: h[0])
        self._hist = hist
        self._plan = plan

    def _target(self, t_ns: int) -> int:
        """The level most recently requested at or before ``t_ns``."""
        for at, level in reversed(self._hist):
            if at <= t_ns:
                return level
        return self._initial

    def _mean_hz(self, t0: int, t1: int) -> float:
        """Time-weighted mean clock over ``[t0, t1]`` (a kernel that a switch lands in
        runs part of its work at each clock; for compute-bound work this mean is exact)."""
        lv0 = self._effective(t0)
        lv1 = self._effective(t1)
        if lv0 == lv1 or t1 <= t0:
            return float(self.levels[lv1])
        acc, t, lv = 0.0, t0, lv0
        for at, level in self._hist:
            land = at + self.s_ns
            if land <= t0:
                continue
            if land >= t1:
                break
            acc += (land - t) * self.levels[lv]
            t, lv = land, level
        acc += (t1 - t) * self.levels[lv]
        return acc / (t1 - t0)

    def _effective(self, t_ns: int) -> int:
        """The level in effect at ``t_ns`` (requests land one switch latency later)."""
        for at, level in reversed(self._hist):
            if at + self.s_ns <= t_ns:
                return level
        return self._initial

    # ---- events --------------------------------------------------------------------

    def on_counters(self, counters) -> None:
        """Device counters at a graph end: intensity for the model, and the graph's
        busy time (kernel time without host gaps) for identification."""
        self.model.observe_counters(counters, self.phase)
        if self._busy_last is not None:
            self._graph_busy = counters.busy_ns - self._busy_last
        self._busy_last = counters.busy_ns

    def on_event(self, ev: Event) -> Decision | None:
        k = ev.kind
        if k is EventKind.NODE_DONE:
            return self._node_done(ev)
        if k is EventKind.NODE_ASK:
            return self._node_ask(ev)
        if k is EventKind.DECODE_BEGIN:
            self._end_stall(ev.t_ns)
            phase = "prefill" if ev.n_tokens > 1 else "decode"
            if phase == "decode" and self._last_graph_phase == "prefill":
                # TTFT is settled: decode gets its own budget (TPOT), neither using
                # time the prefill saved nor paying for time it lost. TPOT is the mean
                # over every token of the run, so the decode budget carries over from
                # earlier requests (their unused slack, or their overrun)
                self.debt_ns, self.ref_elapsed_ns = self._decode_acc
            self.phase = self._last_graph_phase = phase
            self.stall_kind, self.t_stall = StallKind.SUBMIT, ev.t_ns
            self._nodes, self._node_level, self._node_hz, self.done = [], [], [], 0
            return None
        if k is EventKind.DECODE_END:
            return self._graph_end(ev.t_ns)
        if k is EventKind.REQUEST_BEGIN:
            self._end_stall(ev.t_ns)
            self._reset_request(ev.t_ns)
            return self._request(ev.t_ns, max(self.shadow.level, self._target(ev.t_ns)))
        if k in (EventKind.REQUEST_END, EventKind.IDLE):
            if self.stall_kind is not StallKind.IDLE:
                self._end_stall(ev.t_ns)
                if self._last_graph_phase == "decode":  # before the idle gap: no TPOT
                    self._decode_acc = (self.debt_ns, self.ref_elapsed_ns)
                self.stall_kind, self.t_stall = StallKind.IDLE, ev.t_ns
            self._set_plan(ev.t_ns, [])
            return self._request(ev.t_ns, 0)
        return None

    def _end_stall(self, t_ns: int) -> None:
        kind = self.stall_kind
        if kind is None:
            return
        dur = t_ns - self.t_stall
        self.forecast.observe(kind, dur)
        self.shadow.run_stall(dur)
        self.ref_elapsed_ns += dur
        self.stall_kind = None

    def _node_cost(self, ev: Event) -> tuple[float, float, float]:
        key = (ev.op, ev.shape)
        got = self._cost_cache.get(key)
        if got is None:
            kc = cost(ev.op, ev.shape)
            c_ns, m_ns = node_times(np.array([kc.flops]), np.array([kc.bytes]))
            got = (float(c_ns[0]), float(m_ns[0]), 0.0 if kc.is_noop else 1.0)
            if len(self._cost_cache) < 100_000:
                self._cost_cache[key] = got
        return got

    def _node_ask(self, ev: Event) -> Decision | None:
        # every ask is the graph's next node (ids are not positions: real graphs
        # number their first node -1)
        self._nodes.append(self._node_cost(ev))
        self._ask_t = ev.t_ns
        if self.in_compute:
            if self.stall_kind is StallKind.INTER_KERNEL:
                self._ik_count += 1
                if self._ik_count % 16 == 0:
                    self.forecast.observe(StallKind.INTER_KERNEL, ev.t_ns - self.t_stall)
                self.stall_kind = None
            return None
        # compute starts: first node of the graph
        self._end_stall(ev.t_ns)
        self.in_compute = True
        self.t_compute = ev.t_ns
        self._lv_nodes = None
        self._live_ref = None
        if self._templates.get(self.phase) is None:
            # nothing to predict this graph from: follow the default governor's shadow
            # live, node by node (same clock as the default, so no latency debt)
            self._live_ref, self._live_t = 0.0, ev.t_ns
            self._seg_nominal = None
            d = self._request(ev.t_ns, self.shadow.level)
            self._set_plan(ev.t_ns, [])
            return d
        level, plan = self._solve(ev.t_ns, in_compute=True)
        self._start_segment(ev.t_ns, level, self._lv_nodes)
        d = self._request(ev.t_ns, level)
        self._set_plan(ev.t_ns, plan)
        return d

    def _start_segment(self, t_ns: int, level: int, lv: np.ndarray | None = None) -> None:
        """Nominal trajectory of the rest of the graph: one level, or ``lv`` per node."""
        self.plan_level = level
        self._seg_start_t = t_ns
        self._seg_start_node = self.done
        tpl = self._templates.get(self.phase)
        self._seg_nominal = None
        if tpl is not None and tpl.n >= self.done:
            done = self.done
            if lv is None or len(lv) != tpl.n - done:
                lv = np.full(tpl.n - done, level, dtype=np.int64)
            kn = tpl.k[np.arange(done, tpl.n), lv] + tpl.kh[done:]
            cum = np.concatenate([[0.0], np.cumsum(kn)])
            self._seg_nominal = (cum, lv)
            self._predicted_graph_ns = float(cum[-1])

    def _node_done(self, ev: Event) -> Decision | None:
        self._node_level.append(self._effective(ev.t_ns))
        self._node_hz.append(self._mean_hz(self._ask_t, ev.t_ns))
        self.done = len(self._node_level)
        self.stall_kind, self.t_stall = StallKind.INTER_KERNEL, ev.t_ns
        if self._live_ref is not None:
            c, m, launch = self._nodes[-1]
            k, _ = self.model.phases[self.phase].level_times(
                np.array([c]), np.array([m]), np.array([launch]), self.levels
            )
            host = max(0.0, float(self._ask_t - self._live_t))
            self._live_ref += self.shadow.run_compute(k[0], host)
            self._live_t = ev.t_ns
            return self._request(ev.t_ns, self.shadow.level)
        nominal = self._seg_nominal
        if nominal is None:
            return None
        cum, lv_plan = nominal
        j = self.done - self._seg_start_node
        if j >= len(cum) or j >= len(lv_plan):
            return None
        expect = cum[j]
        # deviation beyond what the plan can absorb (its tube and unused slack)
        err = (ev.t_ns - self._seg_start_t) - expect - self._margin_ns
        lvl = int(lv_plan[j])
        if err <= 0 or lvl >= self.top:
            return None
        bump = math.ceil(self.gain * err / max(self._predicted_graph_ns, 1.0))
        new = min(self.top, lvl + bump)
        if new <= self._target(ev.t_ns):
            return None
        self.feedback_raises += 1
        # re-plan the rest of the graph at the new level, drop still before the stall
        self._start_segment(ev.t_ns, new)
        d = self._request(ev.t_ns, new)
        self._set_plan(ev.t_ns, self._stall_plan(ev.t_ns, self._predicted_graph_ns, new))
        return d

    def _graph_end(self, t_ns: int) -> Decision | None:
        measured = t_ns - self.t_compute
        self.in_compute = False
        phase = self.phase
        if self._nodes:
            arr = np.asarray(self._nodes)
            g = _Graph(arr[:, 0], arr[:, 1], arr[:, 2])
            pm = self.model.phases[phase]
            # nodes without a completion event (graph granularity): the level in effect
            # at the middle of the compute (not at its end, where the drop has landed)
            mid = self._effective((self.t_compute + t_ns) // 2)
            f = np.asarray(
                (self._node_hz + [float(self.levels[mid])] * g.n)[: g.n], dtype=np.float64
            )
            prior = self._templates.get(phase)
            if prior is not None and prior.n == g.n and self._predicted_graph_ns > 0:
                self.rel_err.update(abs(measured - self._predicted_full()) / max(measured, 1.0))
            busy = self._graph_busy
            self._graph_busy = None
            if busy is None or not 0 < busy <= measured:  # no counters: fit wall time
                busy, host = measured, 0.0
            else:
                host = float(measured - busy)
            pm.update(pm.features(g.c_ns, g.m_ns, g.launch, f), float(busy))
            g.tabulate(pm, self.levels, host, self.power)
            self._templates[phase] = g
            # reference: the shadow runs the same graph, calibrated by this measurement
            # against the (updated) model's time at the clocks each node really ran at
            pred_here = float(pm.features(g.c_ns, g.m_ns, g.launch, f) @ pm.theta) + host
            scale = measured / pred_here if pred_here > 0 else 1.0
            ref = 0.0  # the shadow walks the graph in chunks, so its windows see the
            # graph's real mix of busy and host time (e.g. the long output matmul)
            edges = np.linspace(0, g.n, min(g.n, _SHADOW_CHUNKS) + 1).astype(np.int64)
            k_chunks = np.diff(g.cum_k[edges], axis=0) * scale
            h_chunks = np.diff(g.cum_launch[edges]) * scale
            if self._live_ref is not None and len(self._node_level) > 0:
                ref = self._live_ref  # the shadow already ran this graph, live
                k_chunks = h_chunks = np.zeros((0,))
            for kc, hc in zip(k_chunks, h_chunks, strict=True):
                ref += self.shadow.run_compute(kc, float(hc))
            self._live_ref = None
        else:
            ref = float(measured)
            self.shadow.run_stall(measured)
        self.ref_elapsed_ns += ref
        self.debt_ns += measured - ref
        self.phase = "decode"
        self.stall_kind, self.t_stall = StallKind.SAMPLE, t_ns
        _, plan = self._solve(t_ns, in_compute=False)
        self._set_plan(t_ns, plan)
        return None

    def _predicted_full(self) -> float:
        return self._predicted_graph_ns + (self._seg_start_t - self.t_compute)

    # ---- the optimisation -----------------------------------------------------------

    def _stall_ns(self) -> tuple[float, float, float]:
        """Forecast of the next inter-graph stall (sample + submit): median, lower
        bound, and how far below the lower bound one has ended."""
        s = self.forecast.estimate(StallKind.SAMPLE)
        u = self.forecast.estimate(StallKind.SUBMIT)
        early = (s.lower_ns - s.min_ns) + (u.lower_ns - u.min_ns)
        return s.typical_ns + u.typical_ns, s.lower_ns + u.lower_ns, early

    def _stall_plan(self, t_ns: int, compute_left_ns: float, next_level: int) -> list[Decision]:
        """Drop one switch latency before the predicted stall start, raise one switch
        latency before its lower-bound end."""
        _, d_lo, _ = self._stall_ns()
        if d_lo < self.s_ns or self.forecast.estimate(StallKind.SAMPLE).n == 0:
            return []
        stall_at = t_ns + int(compute_left_ns)
        return [
            Decision(self.levels_int[0], stall_at - self.s_ns, "tmpc: drop before stall"),
            Decision(self.levels_int[next_level], stall_at + int(d_lo) - self.s_ns, "tmpc: raise"),
        ]

    def _solve(self, t_ns: int, *, in_compute: bool) -> tuple[int, list[Decision]]:
        """Receding-horizon solve. Returns the level for the first compute segment and
        the timed decisions (drop, raise) around the next stall."""
        self.solves += 1
        cur_tpl = self._templates.get(self.phase)
        nxt_tpl = self._templates.get("decode") or cur_tpl
        if nxt_tpl is None or (in_compute and cur_tpl is None):
            return self.top, []  # nothing to predict from yet: never fall behind
        L, nc = self.L, self.n_compute
        d_med, d_lo, d_early = self._stall_ns()
        droppable = d_lo >= self.s_ns and self.forecast.estimate(StallKind.SAMPLE).n > 0
        busy_w, idle_w = self.power.busy_w, self.power.idle_w
        ref_lvl = self.shadow.level
        # stall before a compute block: low clock for its lower bound, the block's own
        # level for the rest (the early raise); or the block's level throughout
        stall_e = idle_w * (d_med - d_lo) if droppable else idle_w * d_med
        e = np.empty((nc, L))
        d = np.empty((nc, L))
        e[1:] = nxt_tpl.e_row + stall_e
        d[1:] = nxt_tpl.d_row
        d_ref = float(nxt_tpl.d_row[ref_lvl]) * (nc - 1)
        if in_compute:
            assert cur_tpl is not None  # checked above
            k0, host0 = cur_tpl.rest(self.done)
            e[0] = busy_w * k0 + idle_w * host0
            d[0] = k0 + host0
            d_ref += float(k0[ref_lvl]) + host0
            n_stalls = nc - 1
        else:
            e[0] = e[1]
            d[0] = nxt_tpl.d_row
            d_ref += float(nxt_tpl.d_row[ref_lvl])
            n_stalls = nc
        stalls_total = d_med * n_stalls
        r = self.rel_err.estimate().upper_ns
        stall_tube = d_early * n_stalls * self._max_slowdown if droppable else 0.0
        allowed = self.slack * (self.ref_elapsed_ns + d_ref + stalls_total) - self.debt_ns
        # sum(d) - d_ref + r * (sum(d) - d_ref) + stall_tube <= allowed
        budget = d_ref + (allowed - stall_tube) / (1.0 + r)
        # every combination at once by outer sums (row-major, the order of ``combos``)
        flat_e, flat_d = e[0], d[0]
        for i in range(1, nc):
            flat_e = (flat_e[..., None] + e[i]).ravel()
            flat_d = (flat_d[..., None] + d[i]).ravel()
        sw = self.power.switch_j + 1e-7  # tie-break against needless switches
        flat_e = flat_e + self.switch_cost[self._target(t_ns)] * sw
        masked = np.where(flat_d <= budget, flat_e, np.inf)
        best = int(masked.argmin())
        if masked[best] == np.inf:  # nothing meets the budget: the fastest plan
            best = int(flat_d.argmin())
        used = float(flat_d[best])
        self._margin_ns = max(0.0, budget - used) + r * max(used - d_ref, 0.0) + stall_tube
        levels = self.combos[best]
        first = int(levels[0])
        if in_compute:
            left = float(d[0, first])
            nxt = int(levels[1]) if nc > 1 else first
            ok = cur_tpl is not None and cur_tpl.n > self.done
            if ok and masked[int(masked.argmin())] < np.inf:
                # per-block levels for the rest of this graph, in the budget the
                # horizon leaves it (later graphs keep their planned level)
                fut = sum(float(d[i, levels[i]]) for i in range(1, nc))
                assert cur_tpl is not None
                got = self._block_plan(t_ns, cur_tpl, budget - fut)
                if got is not None:
                    first, left, plan = got
                    used = left + fut
                    self._margin_ns = (
                        max(0.0, budget - used) + r * max(used - d_ref, 0.0) + stall_tube
                    )
                    return first, plan + self._stall_plan(t_ns, left, nxt)
            plan = self._stall_plan(t_ns, left, nxt)
            return first, plan
        plan = []
        if droppable:
            plan.append(Decision(self.levels_int[0], t_ns, "tmpc: stall"))
            plan.append(
                Decision(self.levels_int[first], t_ns + int(d_lo) - self.s_ns, "tmpc: raise")
            )
        else:
            plan.append(Decision(self.levels_int[first], t_ns, "tmpc: short stall"))
        return first, plan

    def _block_plan(
        self, t_ns: int, tpl: _Graph, cap: float
    ) -> tuple[int, float, list[Decision]] | None:
        """Levels per block of the rest of the graph with the least predicted energy
        whose time fits ``cap``: a price on time (Lagrangian) picks each block's
        level independently, the cheapest price that fits wins, and the blocks of
        the next cheaper price are taken in order while the time left allows. Sets
        ``self._lv_nodes``; returns the first level, the predicted time and the timed
        switches between blocks (each issued one switch latency early)."""
        done = self.done
        c0 = int(tpl.node_chunk[done])
        E = tpl.ce[c0:].copy()
        D = tpl.cd[c0:].copy()
        e0 = int(tpl.edges[c0])
        part_k = tpl.cum_k[done] - tpl.cum_k[e0]
        part_h = tpl.cum_launch[done] - tpl.cum_launch[e0]
        D[0] -= part_k + part_h
        E[0] -= self.power.busy_w * part_k + self.power.idle_w * part_h
        choice = (E[None] + _LAMBDAS[:, None, None] * D[None]).argmin(axis=2)
        nb = len(D)
        rows = np.arange(nb)
        tot = D[rows[None, :], choice].sum(axis=1)
        ok = tot <= cap
        if not ok.any():
            return None
        i = int(ok.argmax())
        a = choice[i].copy()
        if i > 0:
            b = choice[i - 1]
            dt = D[rows, b] - D[rows, a]
            fits = np.cumsum(dt) <= cap - tot[i]
            k = int(fits.argmin()) if not fits.all() else nb
            a[:k] = b[:k]
        d_blk = D[rows, a]
        ends = np.cumsum(d_blk)
        plan = []
        for j in range(1, nb):
            if a[j] != a[j - 1]:
                at = max(t_ns, t_ns + int(ends[j - 1]) - self.s_ns)
                plan.append(Decision(self.levels_int[int(a[j])], at, "tmpc: block"))
        sizes = np.diff(tpl.edges[c0:]).copy()
        sizes[0] -= done - e0
        self._lv_nodes = np.repeat(a, sizes)
        return int(a[0]), float(ends[-1]), plan

    # ---- timer path ------------------------------------------------------------------

    def plan(self, now_ns: int) -> list[Decision]:
        return [d for d in self._plan if d.at_ns >= now_ns]
