"""Oracle: the offline minimum-energy level schedule for a whole recorded trace.

It reads the entire trace (the only controller allowed to) and the simulator's
physical model, cuts the run into blocks -- each graph's compute split at layer
boundaries, and every submit/sample/idle stall -- and tabulates each block's exact
time and energy at every level. The latency budget is the same as everyone's:
``(1 + latency_slack)`` times the default governor's time, per phase (prefill time
sets TTFT, decode time TPOT), measured by the arrays-based accounting
(``accounting.default_shadow``, the same figures as a replay). Lagrangian relaxation
turns the budget into a price ``lam`` on time; for a given price a Viterbi DP over
blocks x levels (switch energy on transitions) finds the best schedule, and
bisection on ``lam`` finds the cheapest schedule within the budget; identical blocks
tie at that price, so the gap between the two bracketing schedules is closed
greedily block by block (``_mix``).
The schedule is then checked on the simulator -- the arrays-based accounting, per
graph, re-anchored at every step as replay re-anchors on events
(``accounting.scheduled_energy``) -- and each phase's target moved by its miss (the
block model ignores the first switch, slumber edges, the minimum dwell and switches
landing inside short kernels; the miss is about 0.1%), keeping the cheapest schedule
the check finds within budget. Switch latency is included by issuing each switch one
switch latency before its block starts, so it lands on time. ``account()`` gives the
final schedule's figures the same way; the oracle still plays back as a controller
(``on_event``/``plan``) in a per-kernel replay, the reference the tests compare with.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...engine.events import Event, EventKind
from ...engine.segments import Segment
from ..base import Decision


def _blocks(
    trace: Any, dev: Any
) -> tuple[np.ndarray, np.ndarray, list[str], list[int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The trace's blocks, as ``accounting`` runs it: every stall step is one block, a
    graph step one block per run of kernels of one layer. A kernel's host gap belongs to
    the block before it (the level in effect while the host enqueues), the graph's
    first gap to its first block. Returns per-block time and energy at every level
    (blocks x levels), each block's phase, each step's first block, and the blocks
    that start inside a graph (block, its first kernel's global index, the gap before
    that kernel)."""
    levels = [int(h) for h in dev.frequencies_hz()]
    p = dev.profile
    share = 1.0 - float(getattr(dev, "background_share", 0.0))
    busy_w = np.array([dev.power_w(h, "busy") for h in levels])
    idle_w = np.array([dev.power_w(h, "idle") for h in levels])
    slumber_w = p.slumber_power_w
    timeout = p.idle_timeout_ns
    t_rows: list[np.ndarray] = []
    e_rows: list[np.ndarray] = []
    phase_of: list[str] = []
    first_block: list[int] = []
    # compute blocks after a graph's first: the block, its first kernel (global index)
    # and the host gap before that kernel (the block starts after it)
    kb: list[np.ndarray] = []
    kk: list[np.ndarray] = []
    kg: list[np.ndarray] = []
    idle_for = 0.0
    n_blocks = 0
    for step in trace.steps:
        first_block.append(n_blocks)
        if not hasattr(step, "flops"):  # a stall
            val = float(step.dur_ns)
            awake = max(0.0, min(val, timeout - idle_for))
            t_rows.append(np.full((1, len(levels)), val))
            e_rows.append(((idle_w * awake + slumber_w * (val - awake)) * 1e-9)[None, :])
            phase_of.append(step.phase)
            idle_for += val
            n_blocks += 1
            continue
        f, b, g = step.flops, step.bytes_, step.gaps_ns.astype(np.float64)
        n = len(f)
        layers = step.layers if step.layers is not None else np.zeros(n, dtype=np.int64)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(layers)) + 1))
        k_ns = np.stack([p.kernel_ns_array(f, b, h, share) for h in levels], axis=1)
        busy = np.add.reduceat(k_ns, starts, axis=0)  # blocks x levels
        awake = np.minimum(g, timeout)
        awake[0] = max(0.0, min(g[0], timeout - idle_for))
        after = np.append(g[1:], 0.0)  # the gap before the next kernel
        awake_after = np.append(awake[1:], 0.0)
        gap = np.add.reduceat(after, starts)
        gap_awake = np.add.reduceat(awake_after, starts)
        gap[0] += g[0]
        gap_awake[0] += awake[0]
        t_rows.append(busy + gap[:, None])
        e_rows.append(
            (busy * busy_w + gap_awake[:, None] * idle_w + (gap - gap_awake)[:, None] * slumber_w)
            * 1e-9
        )
        phase_of += [step.phase] * len(starts)
        kb.append(n_blocks + np.arange(1, len(starts)))
        kk.append(step.first_kernel + starts[1:])
        kg.append(g[starts[1:]])
        idle_for = 0.0
        n_blocks += len(starts)
    L = len(levels)
    t = np.concatenate(t_rows) if t_rows else np.zeros((0, L))
    e = np.concatenate(e_rows) if e_rows else np.zeros((0, L))
    inner = (
        np.concatenate(kb).astype(np.int64) if kb else np.zeros(0, dtype=np.int64),
        np.concatenate(kk).astype(np.int64) if kk else np.zeros(0, dtype=np.int64),
        np.concatenate(kg) if kg else np.zeros(0),
    )
    return t, e, phase_of, first_block, inner


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
        trace: Any = None,
    ) -> None:
        from ...accounting import PhoneTrace, default_shadow, scheduled_energy

        self._factory = device_factory
        self._account: Any = None
        dev = device_factory()
        # the segments are the ones replay runs (host model already applied)
        self.trace = trace if trace is not None else PhoneTrace.shared(segments, dev.profile)
        self._timed = all(s.timed for s in segments if s.kind == "kernel")
        if budgets_ns is None:
            ref = default_shadow(self.trace, device_factory())
            budgets_ns = {ph: (1.0 + latency_slack) * ns for ph, ns in ref.time_by_phase_ns.items()}
        self.budgets_ns = dict(budgets_ns)
        self.levels = dev.frequencies_hz()
        self.s_ns = dev.capabilities.switch_latency_ns
        self._profile = dev.profile
        self._share = 1.0 - float(getattr(dev, "background_share", 0.0))
        t, e, phase_of, self._step_block, inner = _blocks(self.trace, dev)
        self._block_kernel_block, self._block_kernel, self._block_gap = inner
        n_blocks = len(phase_of)
        self.block_t, self.block_e = t, e
        self._t0: int | None = None
        self._offset = 0.0
        # one budget per phase (TTFT and TPOT each within the slack); blocks of
        # different phases do not interact, so each phase is its own problem
        groups = {
            ph: np.array([i for i, q in enumerate(phase_of) if q == ph]) for ph in set(phase_of)
        }
        targets = {ph: self.budgets_ns.get(ph, float("inf")) for ph in groups}
        self.schedule = np.zeros(n_blocks, dtype=np.int64)
        # per phase: the cheapest slice the check run found within budget, and the
        # tightest target seen to overshoot (targets stay below it: a bracket)
        best: dict[str, tuple[float, np.ndarray]] = {}
        bad = {ph: float("inf") for ph in groups}
        tried: set[bytes] = set()
        checked: dict[bytes, Any] = {}  # schedule -> its check run's figures
        step = {ph: 1_000.0 for ph in groups}
        over: set[str] = set()
        for _ in range(refine + 1):
            for ph, idx in groups.items():
                self.schedule[idx] = self._solve(t[idx], e[idx], targets[ph])
            if self.schedule.tobytes() in tried:
                if not over:
                    break  # the targets cycle between schedules already checked
                for ph in over:  # still over budget: tighten harder
                    step[ph] *= 4.0
                    targets[ph] -= step[ph]
                continue
            tried.add(self.schedule.tobytes())
            self._timeline()
            # check on the simulator (the arrays-based run, re-anchored per step as
            # replay re-anchors on events); move each phase's target by its miss (the
            # block model drifts by about 0.1% from switches landing inside kernels)
            res = scheduled_energy(self.trace, device_factory(), self.plan_schedule())
            checked[self.schedule.tobytes()] = res
            got = dict(res.time_by_phase_ns)
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
        self._account = checked.get(self.schedule.tobytes())  # already run: no need again
        rows = np.arange(n_blocks)
        self.energy_j = float(e[rows, self.schedule].sum())
        self.time_ns = float(t[rows, self.schedule].sum())

    def account(self, device: Any = None) -> Any:
        """The final schedule run by the arrays-based accounting on ``device`` (default:
        a fresh one from the factory): what ``turboinfer bench`` and ``sweep`` report
        (simulated; within 0.5% of a per-kernel replay of this controller)."""
        from ...accounting import scheduled_energy

        if device is None and self._account is not None:
            return self._account
        dev = device if device is not None else self._factory()
        return scheduled_energy(self.trace, dev, self.plan_schedule())

    def plan_schedule(self) -> Any:
        """The schedule as ``accounting.Schedule`` (issue times on the oracle's clock and
        every step's predicted start)."""
        from ...accounting import Schedule

        n = self.trace.n_kernels
        kernel_ns = np.zeros(n)
        kernel_hz = np.zeros(n, dtype=np.int64)
        levels = np.asarray(self.levels, dtype=np.int64)
        for si, step in enumerate(self.trace.steps):
            if hasattr(step, "flops"):
                sl = slice(step.first_kernel, step.first_kernel + len(step.flops))
                kernel_ns[sl] = self._kernel_starts(si) - step.gaps_ns
                kernel_hz[sl] = levels[self.schedule[self._kernel_blocks(si)]]
        return Schedule(
            np.asarray(self._rel_at, dtype=np.float64),
            np.asarray([hz for _, hz in self._rel], dtype=np.int64),
            self._step_ns,
            anchor_kernel=self._block_kernel,
            anchor_ns=self._block_start[self._block_kernel_block] - self._block_gap,
            kernel_ns=kernel_ns,
            kernel_hz=kernel_hz,
        )

    def _kernel_blocks(self, si: int) -> np.ndarray:
        """The block of every kernel of graph step ``si``."""
        step: Any = self.trace.steps[si]
        n = len(step.flops)
        layers = step.layers if step.layers is not None else np.zeros(n, dtype=np.int64)
        return self._step_block[si] + np.concatenate(([0], np.cumsum(np.diff(layers) != 0)))

    def _dp(self, cost_: np.ndarray, switch_j: float) -> np.ndarray:
        n, L = cost_.shape
        if switch_j == 0.0 or n == 0:  # no transition cost: every block on its own
            return np.argmin(cost_, axis=1).astype(np.int64)
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
        """The schedule on the oracle's own clock (0 = the run's start): switch issue
        times, one switch latency before each block whose level changes, and the
        predicted start of every step (node anchors for replay are derived lazily)."""
        sched = self.schedule
        n = len(sched)
        dur = self.block_t[np.arange(n), sched]
        block_start = np.concatenate(([0.0], np.cumsum(dur)[:-1])) if n else np.zeros(0)
        self._block_start = block_start
        first = np.asarray(self._step_block, dtype=np.int64)
        self._step_ns = block_start[np.minimum(first, max(n - 1, 0))] if n else np.zeros(0)
        change = np.ones(n, dtype=bool)
        change[1:] = sched[1:] != sched[:-1]
        at = np.flatnonzero(change)
        self._rel = [
            (float(block_start[b]) - self.s_ns, self.levels[int(sched[b])]) for b in at.tolist()
        ]
        self._rel_at = [r[0] for r in self._rel]
        self._anchor_ns: dict[Any, float] | None = None

    def _kernel_starts(self, si: int) -> np.ndarray:
        """Predicted start (after its host gap) of every kernel of graph step ``si``
        under the current schedule, on the oracle's clock."""
        step: Any = self.trace.steps[si]
        p = self._profile
        hz = np.asarray(self.levels, dtype=np.float64)[self.schedule[self._kernel_blocks(si)]]
        k_ns = np.empty(len(step.flops))
        for h in np.unique(hz):
            m = hz == h
            k_ns[m] = p.kernel_ns_array(step.flops[m], step.bytes_[m], int(h), self._share)
        return float(self._step_ns[si]) + np.cumsum(step.gaps_ns + k_ns) - k_ns

    def _anchors(self) -> dict[Any, float]:
        """The predicted start of every event replay anchors the schedule on: each
        graph's DECODE_BEGIN (its submit stall), SAMPLE_BEGIN (its sample stall) and
        node asks (every kernel's start after its gap; without per-kernel timing only
        the graph's first, as the asks all come at the scan)."""
        if self._anchor_ns is not None:
            return self._anchor_ns
        out: dict[Any, float] = {}
        for si, step in enumerate(self.trace.steps):
            t0 = float(self._step_ns[si])
            if not hasattr(step, "flops"):
                key = {"submit": "begin", "sample": "end"}.get(step.kind)
                if key is not None and step.graph >= 0:
                    out.setdefault((key, step.graph), t0)
                continue
            start = self._kernel_starts(si)
            nodes = step.node_ids.tolist()
            for j, (node, t) in enumerate(zip(nodes, start.tolist(), strict=True)):
                if self._timed or j == 0:
                    out.setdefault(("node", step.graph, node), t)
        self._anchor_ns = out
        return out

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
        pred = self._anchors().get(key) if key is not None else None
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
