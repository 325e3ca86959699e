"""Oracle: the offline minimum-energy level schedule for a whole recorded trace.

It reads the entire trace (the only controller allowed to) and the simulator's
physical model, cuts the run into blocks -- each graph's compute split at layer
boundaries, and every submit/sample/idle stall -- and tabulates each block's exact
time and energy at every level. The latency budget is the same as everyone's:
``(1 + latency_slack)`` times the default governor's time, per phase (prefill time
sets TTFT, decode time TPOT), measured by replaying the trace with the default
governor. Lagrangian relaxation turns the budget into a
price ``lam`` on time; for a given price a Viterbi DP over blocks x levels (switch
energy on transitions) finds the best schedule, and bisection on ``lam`` finds the
cheapest schedule within the budget; identical blocks tie at that price, so the gap
between the two bracketing schedules is closed greedily block by block (``_mix``).
The schedule is then checked by replay and each phase's target moved by its miss
(the block model ignores the first switch, slumber edges and switches landing inside
short kernels; the miss is about 0.1%), keeping the cheapest schedule the replay
finds within budget. Switch latency is included by issuing each
switch one switch latency before its block starts, so it lands on time (the replay
applies decisions at their instant, inside kernels too).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...engine.events import Event, EventKind, StallKind
from ...engine.graph import cost
from ...engine.segments import Segment
from ..base import Decision


def _items(segments: Sequence[Segment], dev: Any) -> list[tuple[int, str, Any, str, Any]]:
    """The trace as the replay runs it: (block id, 'busy'|'gap', payload, phase,
    anchor) where the payload is per-level kernel ns (array) or the gap's ns, and the
    anchor names the event that marks the item's start (None if no event does)."""
    levels = dev.frequencies_hz()
    timed = all(s.timed for s in segments if s.kind == "kernel")
    host_ns = dev.profile.host_submission_ns
    cache: dict[tuple[float, float], np.ndarray] = {}
    out: list[tuple[int, str, Any, str, Any]] = []
    block = -1
    last_graph = -1
    key: tuple[Any, ...] | None = None
    from ..replay import with_graphs

    for s in with_graphs(segments):
        k: tuple[Any, ...]
        if s.kind == "kernel":
            k = ("c", s.graph, s.layer)
            c = cost(s.op, s.shape)
            if c.is_noop:
                continue
        elif s.stall is StallKind.INTER_KERNEL and key is not None and key[0] == "c":
            k = key
        else:
            k = ("s", s.stall, s.t_ns)
        if k != key:
            block += 1
            key = k
        anchor: tuple[Any, ...] | None
        if s.kind == "stall":
            anchor = None
            if s.stall is StallKind.SUBMIT:
                anchor = ("begin", s.graph)
            elif s.stall is StallKind.SAMPLE:
                anchor = ("end", s.graph)
            out.append((block, "gap", int(s.dur_ns), s.phase, anchor))
            continue
        if not timed:
            out.append((block, "gap", host_ns, s.phase, None))
        ck = (c.flops, c.bytes)
        if ck not in cache:
            cache[ck] = np.array([dev.kernel_ns(c.flops, c.bytes, h) for h in levels])
        # without per-kernel timing the asks all come at the graph's start (the scan):
        # only the first one marks a known instant
        anchor = ("node", s.graph, s.node) if timed or s.graph != last_graph else None
        last_graph = s.graph
        out.append((block, "busy", cache[ck], s.phase, anchor))
    return out


def _phase_times(result: Any) -> dict[str, float]:
    return dict(result.time_by_phase_ns)


class Oracle:
    name = "oracle"
    offline = True  # reads the whole trace; replay gives it per-node events
    uses_device_governor = False

    def __init__(
        self,
        segments: Sequence[Segment],
        device_factory: Callable[[], Any],
        *,
        latency_slack: float = 0.02,
        budgets_ns: dict[str, float] | None = None,
        refine: int = 8,
    ) -> None:
        from ..replay import replay
        from .simple import DefaultGovernor

        if budgets_ns is None:
            ref_dev = device_factory()
            replay(segments, DefaultGovernor(), ref_dev)
            budgets_ns = {
                ph: (1.0 + latency_slack) * ns for ph, ns in ref_dev.time_by_phase_ns.items()
            }
        self.budgets_ns = dict(budgets_ns)
        dev = device_factory()
        self.levels = dev.frequencies_hz()
        self.s_ns = dev.capabilities.switch_latency_ns
        p = dev.profile
        busy_w = np.array([dev.power_w(h, "busy") for h in self.levels])
        idle_w = np.array([dev.power_w(h, "idle") for h in self.levels])
        items = _items(segments, dev)
        n_blocks = items[-1][0] + 1 if items else 0
        L = len(self.levels)
        t = np.zeros((n_blocks, L))
        e = np.zeros((n_blocks, L))
        phase_of = [""] * n_blocks
        idle_for = 0.0
        for b, kind, val, phase, _ in items:
            phase_of[b] = phase
            if kind == "busy":
                t[b] += val
                e[b] += busy_w * val * 1e-9
                idle_for = 0.0
            else:
                awake = max(0.0, min(val, p.idle_timeout_ns - idle_for))
                t[b] += val
                e[b] += (idle_w * awake + p.slumber_power_w * (val - awake)) * 1e-9
                idle_for += val
        self.block_t, self.block_e = t, e
        self._items = items
        self._t0: int | None = None
        self._offset = 0.0
        # one budget per phase (TTFT and TPOT each within the slack); blocks of
        # different phases do not interact, so each phase is its own problem
        groups = {
            ph: np.array([i for i, q in enumerate(phase_of) if q == ph]) for ph in set(phase_of)
        }
        targets = {ph: self.budgets_ns.get(ph, float("inf")) for ph in groups}
        self.schedule = np.zeros(n_blocks, dtype=np.int64)
        # per phase: the cheapest slice the replay found within budget, and the
        # tightest target seen to overshoot (targets stay below it: a bracket)
        best: dict[str, tuple[float, np.ndarray]] = {}
        bad = {ph: float("inf") for ph in groups}
        tried: set[bytes] = set()
        step = {ph: 1_000.0 for ph in groups}
        over: set[str] = set()
        for _ in range(refine + 1):
            for ph, idx in groups.items():
                self.schedule[idx] = self._solve(t[idx], e[idx], targets[ph])
            if self.schedule.tobytes() in tried:
                if not over:
                    break  # the targets cycle between schedules already replayed
                for ph in over:  # still over budget: tighten harder
                    step[ph] *= 4.0
                    targets[ph] -= step[ph]
                continue
            tried.add(self.schedule.tobytes())
            self._timeline()
            # check by replay; move each phase's target by its miss (the block model
            # drifts by about 0.1% from switches landing inside short kernels)
            res = replay(segments, self, device_factory())
            self._t0 = None
            got = _phase_times(res)
            done = True
            over = set()
            for ph, idx in groups.items():
                if ph not in self.budgets_ns:
                    continue
                miss = got.get(ph, 0) - self.budgets_ns[ph]
                e_ph = res.energy_by_phase_j.get(ph, 0.0)
                if miss <= 0 and (ph not in best or e_ph < best[ph][0]):
                    best[ph] = (e_ph, self.schedule[idx].copy())
                if miss > 0:
                    over.add(ph)
                    bad[ph] = min(bad[ph], targets[ph])
                    targets[ph] -= max(1.1 * miss, step[ph])
                    done = False
                elif miss < -2e-4 * self.budgets_ns[ph]:
                    targets[ph] = min(targets[ph] - 0.9 * miss, 0.5 * (targets[ph] + bad[ph]))
                    done = False
            if done:
                break
        for ph, idx in groups.items():
            if ph in best:
                self.schedule[idx] = best[ph][1]
            elif ph in self.budgets_ns:  # never within budget: the fastest schedule
                self.schedule[idx] = self._solve(t[idx], e[idx], 0.0)
        self._timeline()
        rows = np.arange(n_blocks)
        self.energy_j = float(e[rows, self.schedule].sum())
        self.time_ns = float(t[rows, self.schedule].sum())

    def _dp(self, cost_: np.ndarray, switch_j: float) -> np.ndarray:
        n, L = cost_.shape
        trans = switch_j * (1.0 - np.eye(L))
        acc = cost_[0].copy()
        back = np.zeros((n, L), dtype=np.int64)
        for b in range(1, n):
            tot = acc[:, None] + trans
            back[b] = np.argmin(tot, axis=0)
            acc = tot[back[b], np.arange(L)] + cost_[b]
        path = np.zeros(n, dtype=np.int64)
        path[-1] = int(np.argmin(acc))
        for b in range(n - 1, 0, -1):
            path[b - 1] = back[b, path[b]]
        return path

    def _solve(
        self, t: np.ndarray, e: np.ndarray, budget: float, switch_j: float = 0.0
    ) -> np.ndarray:
        """Cheapest level per block with total time within ``budget``."""
        idx = np.arange(len(t))
        lo, hi = 0.0, 1e-6  # J per ns
        fastest = self._dp(e + 1e3 * t, switch_j)
        if t[idx, fastest].sum() > budget:
            return fastest  # infeasible even flat out: the fastest schedule
        while t[idx, self._dp(e + hi * t, switch_j)].sum() > budget:
            hi *= 4.0
        best = self._dp(e + hi * t, switch_j)
        over = self._dp(e + lo * t, switch_j)
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            path = self._dp(e + mid * t, switch_j)
            if t[idx, path].sum() <= budget:
                hi, best = mid, path
            else:
                lo, over = mid, path
        return self._mix(t, e, best, over, budget)

    @staticmethod
    def _mix(
        t: np.ndarray, e: np.ndarray, best: np.ndarray, over: np.ndarray, budget: float
    ) -> np.ndarray:
        """Close the duality gap. Identical blocks (every decode token's layers) tie at
        the critical price, so the DP moves them all at once and the price alone jumps
        from a schedule over budget to one far under it. Between the two, take the
        over-budget schedule's level block by block, best energy saved per ns first,
        while the total stays within budget."""
        idx = np.arange(len(t))
        diff = np.nonzero(best != over)[0]
        if diff.size == 0:
            return best
        de = e[diff, best[diff]] - e[diff, over[diff]]
        dt = t[diff, over[diff]] - t[diff, best[diff]]
        gain = diff[(de > 0) & (dt <= 0)]
        out = best.copy()
        out[gain] = over[gain]  # cheaper and no slower: always
        keep = (de > 0) & (dt > 0)
        cand, de, dt = diff[keep], de[keep], dt[keep]
        room = budget - t[idx, out].sum()
        for j in np.argsort(-de / dt):
            if dt[j] <= room:
                out[cand[j]] = over[cand[j]]
                room -= dt[j]
        return out

    def _timeline(self) -> None:
        """The schedule on the oracle's own clock (0 = first request): switch issue
        times, one switch latency before each block whose level changes, and the
        predicted start of every event that anchors it to the run."""
        sched = self.schedule
        block_start: dict[int, float] = {}
        self._anchor_ns: dict[Any, float] = {}
        now = 0.0
        for b, kind, val, _, anchor in self._items:
            block_start.setdefault(b, now)
            if anchor is not None:
                self._anchor_ns.setdefault(anchor, now)
            now += float(val[sched[b]]) if kind == "busy" else float(val)
        self._rel: list[tuple[float, int]] = []
        prev = None
        for b in range(len(sched)):
            lvl = int(sched[b])
            if lvl != prev:
                self._rel.append((block_start[b] - self.s_ns, self.levels[lvl]))
                prev = lvl
        self._rel_at = [r[0] for r in self._rel]

    def on_event(self, event: Event) -> Decision | None:
        """Re-anchor the schedule on each event, so model error cannot accumulate
        into switches landing in the wrong block; a shift of over 2 us re-publishes."""
        if self._t0 is None:
            if event.kind is not EventKind.REQUEST_BEGIN:
                return None
            self._t0 = event.t_ns
            self._offset = 0.0
            # switches that should have been issued before the run began: the last wins
            i = max(bisect.bisect_right(self._rel_at, 0.0) - 1, 0)
            return Decision(self._rel[i][1], event.t_ns, "oracle")
        k = event.kind
        key: Any = None
        if k is EventKind.NODE_ASK:
            key = ("node", event.graph, event.node)
        elif k is EventKind.DECODE_BEGIN:
            key = ("begin", event.graph)
        elif k is EventKind.SAMPLE_BEGIN:
            key = ("end", event.graph)
        pred = self._anchor_ns.get(key) if key is not None else None
        if pred is None:
            return None
        offset = event.t_ns - self._t0 - pred
        if abs(offset - self._offset) <= 2_000:
            return None
        self._offset = offset
        i = bisect.bisect_right(self._rel_at, event.t_ns - self._t0 - offset) - 1
        return Decision(self._rel[max(i, 0)][1], event.t_ns, "oracle: re-anchor")

    def plan(self, now_ns: int) -> list[Decision]:
        if self._t0 is None:
            return []
        base = self._t0 + self._offset
        i = bisect.bisect_left(self._rel_at, now_ns - base)
        return [Decision(hz, int(base + at), "oracle") for at, hz in self._rel[i : i + 128]]
