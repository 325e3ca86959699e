"""The tube MPC's optimisation, as pure functions: arrays in, levels out.

Kept apart from the event-driven state in ``tmpc.py`` so it can be tested and timed on
its own, and so live and replay run the very same arithmetic.

* :class:`PhaseTemplate`: per-node work of the last graph of a phase, tabulated per
  level (cumulative kernel time, host gaps shared by launches, per-block energy/time).
* :func:`solve_horizon`: the exhaustive search over the compute levels of the next
  ``n_compute`` graphs (all ``L ** n_compute`` combinations at once, by outer sums),
  minimising predicted energy subject to the (tube-tightened) latency budget.
* :func:`block_levels`: per-block levels inside one graph under a time cap, by a price
  on time (Lagrangian relaxation): each block takes its cheapest level at that price,
  the cheapest price whose blocks fit wins, and blocks of the next cheaper price are
  taken in order while the time left allows.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from . import plan_native
from .model import PowerTable

PLAN_BLOCKS = 24  # blocks of a graph that may each get their own level (~1 per layer)
# prices on time (W = J/s) for the per-block Lagrangian search, cheapest first
PRICES_W = np.concatenate([[0.0], np.geomspace(0.01, 1000.0, 63)])

_COMBOS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def level_combinations(n_levels: int, n_segments: int) -> tuple[np.ndarray, np.ndarray]:
    """All level combinations (rows, in ``itertools.product`` order) and the number of
    level changes inside each."""
    key = (n_levels, n_segments)
    if key not in _COMBOS:
        combos = np.array(
            list(itertools.product(range(n_levels), repeat=n_segments)), dtype=np.int64
        )
        changes = (np.diff(combos, axis=1) != 0).sum(axis=1).astype(np.float64)
        _COMBOS[key] = (combos, changes)
    return _COMBOS[key]


class PhaseTemplate:
    """Per-node work of one graph of a phase: compute/memory time at the top clock and
    launches, tabulated per level by :meth:`tabulate`."""

    __slots__ = (
        "block_energy_j",
        "block_ns",
        "c_ns",
        "edges",
        "energy_j",
        "gap_blocks",
        "graph_ns",
        "host_ns",
        "kernel_ns",
        "launch",
        "layer_out",
        "m_ns",
        "n",
        "safe",
        "safe_seen",
    )

    def __init__(
        self,
        c_ns: np.ndarray,
        m_ns: np.ndarray,
        launch: np.ndarray,
        layer_out: np.ndarray | None = None,
    ) -> None:
        self.c_ns, self.m_ns, self.launch = c_ns, m_ns, launch
        self.n = len(c_ns)
        self.layer_out = layer_out if layer_out is not None else np.zeros(self.n, dtype=bool)
        self.kernel_ns = np.zeros((self.n, 1))
        self.host_ns = np.zeros(self.n)
        self.energy_j = self.graph_ns = np.zeros(1)
        self.safe: tuple = ()
        self.safe_seen = -1
        self.gap_blocks: np.ndarray | None = None

    def tabulate(
        self,
        theta: np.ndarray,
        ratio: np.ndarray,
        coupling: np.ndarray,
        host_ns: float,
        power: PowerTable,
        time_scale: float = 1.0,
        host_node: np.ndarray | None = None,
        worst: np.ndarray | None = None,
        seen: int = 0,
        min_gap_ns: float = 0.0,
    ) -> None:
        """Tabulate under the time model ``theta`` (``PhaseModel``: each level's clock
        ratio ``f_max/f`` and extra DRAM time ``coupling``) times ``time_scale`` (the
        recent measured/predicted ratio); the graph's measured host time
        (level-independent) where ``host_node`` puts it (the measured gap before each
        node, summing to ``host_ns``), else shared out by kernel launches; whole-graph
        and per-block energy (J x 1e9, i.e. W x ns) and time per level; and the same
        with the levels below ``seen`` at their worst case (``worst``: per level, the
        top level's kernel time times it), ``safe``, made for ``safe_seen``. A gap gets
        a block of its own only if at least ``min_gap_ns`` long (a switch latency: a
        shorter run of one level is merged away, ``dwell_merge``)."""
        edges = _edges(self.n) if host_node is None else _gap_edges(self.n, host_node, min_gap_ns)
        self.edges = edges
        host_block = None if host_node is None else plan_native._block_sums(host_node, edges)
        t = plan_native.tabulate(
            self.c_ns, self.m_ns, self.launch, theta, ratio, coupling, power.busy_w,
            power.idle_w, time_scale, host_ns, edges, host_node, worst, seen,
            host_block=host_block,
        )  # fmt: skip
        self.safe = (t.safe_graph_ns, t.safe_energy, t.safe_block_ns, t.safe_block_energy)
        # blocks that are mostly host time (a measured gap): their raise is timed
        self.gap_blocks = None if host_block is None else host_block > 0.5 * t.block_ns[:, -1]
        self.safe_seen = seen if worst is not None and 0 < seen < len(ratio) else 0
        self.kernel_ns = t.kernel_ns
        if host_node is None:
            self.host_ns = self.launch * (host_ns / max(float(self.launch.sum()), 1.0))
        else:
            self.host_ns = host_node
        self.graph_ns, self.energy_j = t.graph_ns, t.energy
        self.block_ns, self.block_energy_j = t.block_ns, t.block_energy

    def node_ns(self, level_of_node: np.ndarray) -> np.ndarray:
        """Predicted time of each node (kernel + its host share) at the given levels."""
        return self.kernel_ns[np.arange(self.n), level_of_node] + self.host_ns


_EDGES: dict[int, np.ndarray] = {}


def _edges(n: int) -> np.ndarray:
    """Block boundaries (node ordinals) of an ``n``-node graph: about ``PLAN_BLOCKS``
    equal blocks."""
    got = _EDGES.get(n)
    if got is None:
        got = np.unique(np.linspace(0, n, min(n, PLAN_BLOCKS) + 1).astype(np.int64))
        got.setflags(write=False)
        if len(_EDGES) < 4096:
            _EDGES[n] = got
    return got


GAP_BLOCKS = 32  # host gaps (a backend's batch recording) that get blocks of their own
GAP_SHARE = 0.02  # ... when at least this share of the graph's host time


def _gap_edges(n: int, host_node: np.ndarray, min_ns: float = 0.0) -> np.ndarray:
    """Block boundaries of an ``n``-node graph whose host time sits at ``host_node``:
    the equal blocks of :func:`_edges`, plus a block of its own for each node preceded
    by a large gap (the GPU idle while a backend records the next batch; at least
    ``min_ns``), so a plan can give the gap a level of its own."""
    base = _edges(n)
    total = float(host_node.sum())
    if total <= 0:
        return base
    big = np.nonzero(host_node >= max(GAP_SHARE * total, min_ns))[0]
    if len(big) == 0:
        return base
    if len(big) > GAP_BLOCKS:
        big = np.sort(big[np.argsort(host_node[big])[-GAP_BLOCKS:]])
    return np.unique(np.concatenate((base, big, np.minimum(big + 1, n))))


class HorizonSolution(NamedTuple):
    levels: np.ndarray  # compute level of each graph in the horizon
    used_ns: float  # predicted time of the chosen plan
    budget_ns: float  # time the budget allows for the horizon's compute
    feasible: bool  # False: nothing fits, the fastest plan was taken


def solve_horizon(
    energy: np.ndarray,
    time_ns: np.ndarray,
    budget_ns: float,
    switch_penalty: np.ndarray,
    combos: np.ndarray,
    first_budget_ns: float | None = None,
    *,
    native: bool = True,
) -> HorizonSolution:
    """Cheapest combination of per-segment levels whose total time fits ``budget_ns``
    (and whose first segment fits ``first_budget_ns``: the horizon spreads its slack
    evenly, but the graph about to run may not spend slack that later graphs would
    have to earn).

    ``energy``/``time_ns``: (segments, levels) tables; ``switch_penalty``: per
    combination, the energy its level changes cost; ``combos``: the rows of
    :func:`level_combinations` (row-major, the order the outer sums produce).
    ``native``: the C twin (``hooks/ti_plan.c``) where built."""
    got = plan_native.horizon(energy, time_ns, switch_penalty, budget_ns, first_budget_ns)
    if native and got is not None:
        return HorizonSolution(got[0], got[1], float(budget_ns), got[2])
    flat_e, flat_d = energy[0], time_ns[0]
    for i in range(1, len(energy)):
        flat_e = (flat_e[..., None] + energy[i]).ravel()
        flat_d = (flat_d[..., None] + time_ns[i]).ravel()
    flat_e = flat_e + switch_penalty
    ok = flat_d <= budget_ns
    if first_budget_ns is not None:
        ok &= time_ns[0][combos[:, 0]] <= first_budget_ns
    masked = np.where(ok, flat_e, np.inf)
    best = int(masked.argmin())
    feasible = bool(masked[best] < np.inf)
    if not feasible:
        best = int(flat_d.argmin())
    return HorizonSolution(combos[best], float(flat_d[best]), float(budget_ns), feasible)


def block_levels(
    block_energy: np.ndarray, block_ns: np.ndarray, cap_ns: float, *, native: bool = True
) -> tuple[np.ndarray, float] | None:
    """Per-block levels with the least energy whose total time fits ``cap_ns``, or None
    when even the fastest price does not fit. Returns (levels, predicted time).
    ``native``: the C twin (``hooks/ti_plan.c``) where built."""
    if native:
        got = plan_native.block_levels(block_energy, block_ns, PRICES_W, cap_ns)
        if got is not False:
            return got  # type: ignore[return-value]
    choice = (block_energy[None] + PRICES_W[:, None, None] * block_ns[None]).argmin(axis=2)
    nb = len(block_ns)
    rows = np.arange(nb)
    tot = block_ns[rows[None, :], choice].sum(axis=1)
    ok = tot <= cap_ns
    if not ok.any():
        return None
    i = int(ok.argmax())
    a = choice[i].copy()
    if i > 0:  # take the next cheaper price's blocks, in order, while time allows
        b = choice[i - 1]
        dt = block_ns[rows, b] - block_ns[rows, a]
        fits = np.cumsum(dt) <= cap_ns - tot[i]
        k = int(fits.argmin()) if not fits.all() else nb
        a[:k] = b[:k]
    return a, float(block_ns[rows, a].sum())


def dwell_merge(
    levels: np.ndarray, block_ns: np.ndarray, min_ns: float, *, native: bool = True
) -> np.ndarray:
    """Per-block levels with no run of one level shorter than ``min_ns`` (predicted):
    a device takes a switch latency to land a level and holds each for a minimum
    dwell, so shorter runs would land late and push the later switches back, out of
    place. One pass, left to right: a short run joins the next block at the higher
    of the two levels (the last run, if short, joins the run before it the same
    way): never slower than planned. ``native``: the C twin (``hooks/ti_plan.c``)
    where built."""
    if native:
        got = plan_native.dwell(levels, block_ns, min_ns)
        if got is not None:
            return got
    nb = len(levels)
    if nb < 2 or min_ns <= 0:
        return levels
    lv = levels.tolist()
    if lv.count(lv[0]) == nb:
        return levels
    t = block_ns[np.arange(nb), levels].tolist()
    # the common case first: no short run (a whole pass, no change)
    start, dur = 0, t[0]
    for i in range(1, nb):
        if lv[i] != lv[start]:
            if dur < min_ns:
                break
            start, dur = i, 0.0
        dur += t[i]
    else:
        if dur >= min_ns:
            return levels
    at = block_ns.item  # a block's time at a level
    start, dur, changed = 0, t[0], False
    for i in range(1, nb):
        if lv[i] == lv[start]:
            dur += t[i]
            continue
        if dur >= min_ns:
            start, dur = i, t[i]
            continue
        # the run [start, i) is short: it and block i go on at the higher level
        new = max(lv[start], lv[i])
        if lv[start] != new:
            for j in range(start, i):
                lv[j], t[j] = new, at(j, new)
            dur = sum(t[start:i])
        lv[i], t[i] = new, at(i, new)
        dur += t[i]
        changed = True
    while dur < min_ns and start > 0:  # the last run is short: join the one before it
        p0 = start - 1
        while p0 > 0 and lv[p0 - 1] == lv[start - 1]:
            p0 -= 1
        new = max(lv[start - 1], lv[start])
        for j in range(p0, nb):
            if lv[j] != new:
                lv[j], t[j] = new, at(j, new)
        start, dur, changed = p0, sum(t[p0:]), True
    return np.asarray(lv, dtype=np.int64) if changed else levels
