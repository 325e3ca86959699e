"""Stall forecaster: how long the next stall lasts, and when it starts.

Durations, per stall kind, come from a sliding window of the most recent stalls:
the median is the robust mean (one GC pause or page fault does not move it), the
upper/lower quantiles bound it, and their spread is the error bound the tube MPC
tightens its latency constraint by.

Drift handling: window + run test. A pure window adapts to a regime shift (new
model, longer context, background memory load) only after half the window has
turned over. So when ``drift_run`` consecutive samples all fall outside the
[lower, upper] band on the same side -- under a stationary stream that happens with
probability about ``(1 - q)**drift_run``, e.g. 0.1**6 = 1e-6 -- the window is cut
down to those samples and the estimate re-converges at once. We chose this over
exponential decay because decay trades noise for lag with one knob, while decode
stall streams are mostly stationary with rare step changes: the window keeps the
estimate quiet in between and the run test makes the steps cheap.

Start times come from the engine position (:class:`EnginePosition`): the node
index in the current graph, the nodes still to run with their predicted kernel
times, graph end -> sampling, token yield -> submit.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..engine.events import StallKind


class StallEstimate(NamedTuple):
    """Forecast of one stall's duration (ns). ``err_ns`` is the tube half-width;
    ``min_ns`` the shortest stall in the window (how far below ``lower_ns`` one has
    actually ended)."""

    typical_ns: float
    lower_ns: float
    upper_ns: float
    err_ns: float
    n: int
    min_ns: float = 0.0


class StallStats:
    """Online duration estimate for one stall kind (see module docstring)."""

    def __init__(
        self,
        *,
        window: int = 64,
        quantile: float = 0.9,
        drift_run: int = 6,
        prior_ns: float = 0.0,
    ) -> None:
        if not 0.5 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0.5, 1), got {quantile}")
        if window < 2 * drift_run:
            raise ValueError("window must hold at least two drift runs")
        self.quantile = quantile
        self.drift_run = drift_run
        self.shifts = 0
        self._window: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []  # the window's values, ascending
        self._run_side = 0
        self._run_len = 0
        self._est = StallEstimate(prior_ns, prior_ns, prior_ns, prior_ns, 0, prior_ns)

    def update(self, dur_ns: float) -> None:
        est = self._est
        side = 0
        if est.n >= self.drift_run:
            side = 1 if dur_ns > est.upper_ns else (-1 if dur_ns < est.lower_ns else 0)
        if side and side == self._run_side:
            self._run_len += 1
        else:
            self._run_side, self._run_len = side, (1 if side else 0)
        win, xs, dur = self._window, self._sorted, float(dur_ns)
        if len(win) == win.maxlen:  # the oldest leaves the sorted copy too
            del xs[bisect.bisect_left(xs, win[0])]
        win.append(dur)
        bisect.insort(xs, dur)
        if self._run_len >= self.drift_run:
            recent = list(win)[-self.drift_run :]
            win.clear()
            win.extend(recent)
            xs[:] = sorted(recent)
            self.shifts += 1
            self._run_side = self._run_len = 0
        self._est = self._compute()

    def _compute(self) -> StallEstimate:
        xs = self._sorted
        n = len(xs)
        mid = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
        hi = xs[min(n - 1, int(self.quantile * n))]
        lo = min(xs[int((1.0 - self.quantile) * n)], mid)
        return StallEstimate(mid, lo, hi, max(hi - mid, mid - lo), n, xs[0])

    def estimate(self) -> StallEstimate:
        return self._est


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of a graph template: its op and predicted work units."""

    op: str
    flops: float
    bytes_: float


class EnginePosition:
    """Where the engine is, and how much compute is left before the next stall.

    A decode graph has the same node sequence every token, so the previous graph of
    the same batch size is the template for the current one. Node work comes from the
    cost model (``cost_fn(op, shape) -> (flops, bytes)``), so the workload model can
    turn it into time at any frequency.
    """

    def __init__(self, cost_fn: Callable[[str, object], tuple[float, float]] | None = None):
        self._cost_fn = cost_fn
        self.graph = -1
        self.node = -1  # index of the node now running (-1: none yet)
        self.nodes_done = 0
        self.in_graph = False
        self.phase = "idle"
        self._current: list[NodeInfo] = []
        self._templates: dict[str, list[NodeInfo]] = {}
        self._cum_flops: list[float] = [0.0]
        self._cum_bytes: list[float] = [0.0]

    def _cost(self, op: str, shape: object) -> tuple[float, float]:
        if self._cost_fn is None:
            from ..engine.graph import cost

            def _default(op_: str, shape_: object) -> tuple[float, float]:
                kc = cost(op_, shape_)  # type: ignore[arg-type]
                return float(kc.flops), float(kc.bytes)

            self._cost_fn = _default
        return self._cost_fn(op, shape)

    def begin_graph(self, graph: int, phase: str) -> None:
        self.graph, self.phase, self.in_graph = graph, phase, True
        self.node, self.nodes_done = -1, 0
        self._current = []
        tpl = self._templates.get(phase, [])
        self._set_cumulative(tpl)

    def _set_cumulative(self, nodes: list[NodeInfo]) -> None:
        cf, cb = [0.0], [0.0]
        for nd in nodes:
            cf.append(cf[-1] + nd.flops)
            cb.append(cb[-1] + nd.bytes_)
        self._cum_flops, self._cum_bytes = cf, cb

    def ask(self, node: int, op: str, shape: object) -> None:
        """A node was reached (scan or per-kernel ask)."""
        if node >= len(self._current):
            flops, bytes_ = self._cost(op, shape)
            self._current.append(NodeInfo(op, flops, bytes_))
            if len(self._current) > len(self._cum_flops) - 1:
                last_f, last_b = self._cum_flops[-1], self._cum_bytes[-1]
                self._cum_flops.append(last_f + flops)
                self._cum_bytes.append(last_b + bytes_)

    def done(self, node: int) -> None:
        """Nodes up to and including ``node`` have finished."""
        self.node = node
        self.nodes_done = node + 1

    def end_graph(self) -> None:
        if self._current:
            self._templates[self.phase] = self._current
        self.in_graph = False
        self.nodes_done = len(self._current)

    def total_work(self, phase: str | None = None) -> tuple[float, float, int]:
        """(flops, bytes, nodes) of a whole graph of ``phase`` (template)."""
        tpl = self._templates.get(phase or self.phase)
        if tpl is None:
            return (self._cum_flops[-1], self._cum_bytes[-1], len(self._cum_flops) - 1)
        return (sum(n.flops for n in tpl), sum(n.bytes_ for n in tpl), len(tpl))

    def remaining_work(self) -> tuple[float, float, int]:
        """(flops, bytes, nodes) still to run in the current graph, from the template
        (or the nodes scanned so far when there is no template yet)."""
        k = min(self.nodes_done, len(self._cum_flops) - 1)
        return (
            self._cum_flops[-1] - self._cum_flops[k],
            self._cum_bytes[-1] - self._cum_bytes[k],
            len(self._cum_flops) - 1 - k,
        )

    def next_stall(self) -> StallKind:
        """The kind of stall that follows the current position."""
        if self.in_graph:
            return StallKind.INTER_KERNEL if self.remaining_work()[2] > 1 else StallKind.SAMPLE
        return StallKind.SAMPLE


class Forecaster:
    """All stall kinds plus the engine position, fed from events by the controller."""

    def __init__(self, cost_fn=None, **stats_kw) -> None:
        self.stalls = {k: StallStats(**stats_kw) for k in StallKind}
        self.position = EnginePosition(cost_fn)

    def observe(self, kind: StallKind, dur_ns: float) -> None:
        self.stalls[kind].update(dur_ns)

    def estimate(self, kind: StallKind) -> StallEstimate:
        return self.stalls[kind].estimate()
