"""Oracle: the offline minimum-energy level schedule for a whole recorded trace.

It reads the entire trace (the only controller allowed to) and the simulator's
physical model, and plans one level per *segment* of the run with a Lagrangian DP.

The time model is the accounting's (``accounting.scheduled_energy``), block by block:
each graph's compute split at layer boundaries plus its host gaps, every
submit/sample/idle stall, the slumber after the idle timeout and the wake-up before
the next kernel, and the energy of every switch. What the model cannot see block by
block is *when a switch lands*: the device applies a level one switch latency after
it is asked and no sooner than ``min_dwell_ns`` after the previous change. A schedule
that changes level every few hundred microseconds (the old oracle's ~6,000 planned
switches/s against a 0.5-1 ms dwell) has its switches queue up behind the dwell and
land late, in the wrong blocks, so the run it predicted is not the run the
accounting times (on the 96-token gemma recording, sim:adreno650, 2% slack: +8% TPOT
and TTFT). So blocks are merged into segments each at least one minimum dwell long
at the fastest level, and the DP changes level only at segment starts; each switch
is issued one switch latency before its segment, so it lands on time. A segment is
also at least one switch latency long: a switch issued further ahead is timed on the
steps before its segment, and where the latency spans several steps their drift from
the model moves it (at 80 ms a schedule switching inside every stall ran 5% over its
modelled TPOT).

The budget is the one every controller is judged by: TTFT and TPOT each within
``(1 + latency_slack)`` of the default governor's, as the accounting measures them.
Blocks fall in a request's TTFT window (its first step to its first token), its TPOT
window (first token to last), or neither (idle between requests), and each window's
total time has its own budget (mean TTFT and mean TPOT times their counts). The
Lagrangian relaxation prices each window's time (``lam``); for given prices a Viterbi
DP over segments x levels (switch energy on transitions) finds the cheapest schedule,
and bisection on the prices finds the cheapest within the budgets. Identical
segments tie at the critical price, so the gap between the two bracketing schedules
is closed greedily segment by segment (``_mix``). The best Lagrangian value seen,
``min_x E(x) + sum lam (T(x) - B)``, is a lower bound on any schedule's modelled
energy within the budget: ``bound`` reports it with the gap to the schedule found.

The schedule is then checked on the simulator by the same accounting the other
controllers are judged by (``accounting.scheduled_energy``, per graph, re-anchored
at every step as replay re-anchors on events), and each window's target moved by
its miss, keeping the cheapest schedule found within budget. ``account()`` gives the
final schedule's figures; the oracle still plays back as a controller
(``on_event``/``plan``) in a per-kernel replay, the reference the tests compare with.

``per_request_ttft`` holds each request's own TTFT window to its own budget (the
default's TTFT for that request times ``1 + latency_slack``) instead of pooling them:
the promise tmpc keeps. On stop 37's gemma recording (sim, 2%) that oracle saved
15.29% against the pooled one's 15.57% on adreno640 and 24.04% against 24.20% on
adreno650 (simulated): the pooled oracle moves the first request's TTFT headroom to the
long prompt, and the per-request one spends it on the first prompt instead.

``budgets_ns`` may instead give budgets per phase (``prefill``/``decode``/``idle``
time, ``time_by_phase_ns``), to hold the oracle to another run's time phase by phase.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine.events import Event, EventKind
from ...engine.segments import Segment
from ..base import ControllerDefaults, Decision

TTFT = "ttft"
WINDOWS = (TTFT, "tpot")
# a refinement that makes no progress (see Oracle.__init__) moves every target down by
# this share of its budget, doubled each time
STALL_STEP = 0.0005


@dataclass(frozen=True)
class _Blocks:
    """The trace's blocks (``_blocks``): time and energy at every level (blocks x
    levels), each block's step, each step's first block and wake-up, and the blocks
    that start inside a graph (block, its first kernel's global index, the gap before
    that kernel)."""

    t_ns: np.ndarray
    energy_j: np.ndarray
    step: np.ndarray
    first_block: list[int]
    wake_ns: list[float]
    inner: tuple[np.ndarray, np.ndarray, np.ndarray]


def _blocks(trace: Any, dev: Any, step_share: np.ndarray | None = None) -> _Blocks:
    """The trace's blocks, as ``accounting`` runs it: every stall step is one block, a
    graph step one block per run of kernels of one layer. A kernel's host gap belongs to
    the block before it (the level in effect while the host enqueues), the graph's
    first gap and any wake-up from slumber to its first block. The energy includes
    the DRAM traffic's (the same at every level), so modelled totals compare with the
    accounting's. ``step_share``: the bandwidth share other apps leave, per step
    (default: the device's, throughout)."""
    levels = [int(h) for h in dev.frequencies_hz()]
    p = dev.profile
    share = 1.0 - float(getattr(dev, "background_share", 0.0))
    busy_w = np.array([dev.power_w(h, "busy") for h in levels])
    idle_w = np.array([dev.power_w(h, "idle") for h in levels])
    slumber_w = p.slumber_power_w
    timeout = p.idle_timeout_ns
    wakeup = float(getattr(p, "wakeup_ns", 0) or 0)
    dram_j = float(getattr(p, "dram_energy_j_per_byte", 0.0) or 0.0)
    t_rows: list[np.ndarray] = []
    e_rows: list[np.ndarray] = []
    step_of: list[np.ndarray] = []
    first_block: list[int] = []
    wake_of: list[float] = []
    kb: list[np.ndarray] = []
    kk: list[np.ndarray] = []
    kg: list[np.ndarray] = []
    idle_for = 0.0
    n_blocks = 0
    for si, step in enumerate(trace.steps):
        first_block.append(n_blocks)
        if not hasattr(step, "flops"):  # a stall
            val = float(step.dur_ns)
            awake = max(0.0, min(val, timeout - idle_for))
            t_rows.append(np.full((1, len(levels)), val))
            e_rows.append(((idle_w * awake + slumber_w * (val - awake)) * 1e-9)[None, :])
            step_of.append(np.array([si]))
            wake_of.append(0.0)
            idle_for += val
            n_blocks += 1
            continue
        f, b, g = step.flops, step.bytes_, step.gaps_ns.astype(np.float64)
        n = len(f)
        layers = step.layers if step.layers is not None else np.zeros(n, dtype=np.int64)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(layers)) + 1))
        sh = share if step_share is None else float(step_share[si])
        k_ns = np.stack([np.rint(p.kernel_ns_array(f, b, h, sh)) for h in levels], axis=1)
        busy = np.add.reduceat(k_ns, starts, axis=0)  # blocks x levels
        awake = np.minimum(g, timeout)
        awake[0] = max(0.0, min(g[0], timeout - idle_for))
        after = np.append(g[1:], 0.0)  # the gap before the next kernel
        awake_after = np.append(awake[1:], 0.0)
        gap = np.add.reduceat(after, starts)
        gap_awake = np.add.reduceat(awake_after, starts)
        gap[0] += g[0]
        gap_awake[0] += awake[0]
        # slumbering when the first kernel comes: it waits for the wake-up (idle power)
        wake = wakeup if idle_for + g[0] >= timeout and timeout > 0 else 0.0
        gap[0] += wake
        gap_awake[0] += wake
        dram = np.add.reduceat(b, starts) * dram_j
        t_rows.append(busy + gap[:, None])
        e_rows.append(
            (busy * busy_w + gap_awake[:, None] * idle_w + (gap - gap_awake)[:, None] * slumber_w)
            * 1e-9
            + dram[:, None]
        )
        step_of.append(np.full(len(starts), si))
        wake_of.append(wake)
        kb.append(n_blocks + np.arange(1, len(starts)))
        kk.append(step.first_kernel + starts[1:])
        kg.append(g[starts[1:]])
        idle_for = 0.0
        n_blocks += len(starts)
    L = len(levels)
    return _Blocks(
        np.concatenate(t_rows) if t_rows else np.zeros((0, L)),
        np.concatenate(e_rows) if e_rows else np.zeros((0, L)),
        np.concatenate(step_of).astype(np.int64) if step_of else np.zeros(0, dtype=np.int64),
        first_block,
        wake_of,
        (
            np.concatenate(kb).astype(np.int64) if kb else np.zeros(0, dtype=np.int64),
            np.concatenate(kk).astype(np.int64) if kk else np.zeros(0, dtype=np.int64),
            np.concatenate(kg) if kg else np.zeros(0),
        ),
    )


def latency_windows(trace: Any, *, per_request: bool = False) -> tuple[list[str | None], int, int]:
    """Each step's latency window as the accounting measures it: ``ttft`` from a
    request's first step to its first token (the end of that sample stall), ``tpot``
    from there to its last token, None outside (idle between requests). Also the
    number of requests with a token (TTFT's count) and of token gaps (TPOT's).
    ``per_request``: each request's TTFT window is its own, ``ttft#k`` for the k-th
    request in the accounting's order (``engine.latency.per_request``: by index)."""
    n = len(trace.steps)
    begin: dict[int, int] = {}
    for si in sorted(trace.request_begin):
        begin[trace.request_begin[si]] = si  # the accounting keeps the last
    tokens: dict[int, list[int]] = {}
    for si, step in enumerate(trace.steps):
        req = getattr(step, "token_request", -1)
        if req is not None and req >= 0:
            tokens.setdefault(req, []).append(si)
    win: list[str | None] = [None] * n
    n_gaps = 0
    served = sorted(r for r in tokens if r in begin)
    for k, req in enumerate(served):
        toks = tokens[req]
        ttft = f"{TTFT}#{k}" if per_request else TTFT
        for si in range(begin[req], toks[0] + 1):
            win[si] = ttft
        for si in range(toks[0] + 1, toks[-1] + 1):
            win[si] = "tpot"
        n_gaps += len(toks) - 1
    return win, len(served), n_gaps


def _request_of(group: str) -> int | None:
    """The request index of a per-request TTFT window (``ttft#k``), else None."""
    head, sep, k = group.partition("#")
    return int(k) if sep and head == TTFT else None


def dwell_segments(
    t_min_ns: np.ndarray, step: np.ndarray, is_stall: np.ndarray, min_ns: float
) -> np.ndarray:
    """Cut the blocks into segments, each at least ``min_ns`` long at its fastest
    (the first index of each segment). A level holds for a whole segment, so no two
    switches land closer than ``min_ns``. Every stall is a piece of its own, each graph
    cut at block boundaries into pieces of at least ``min_ns`` (a short tail joins the
    piece before); a piece still too short (a short stall, a short graph) joins the
    pieces after it (the last one, the pieces before)."""
    n = len(t_min_ns)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if min_ns <= 0:
        return np.arange(n, dtype=np.int64)
    # pieces: [start, dur]
    starts: list[int] = []
    durs: list[float] = []
    i = 0
    while i < n:
        j = i + 1
        while j < n and step[j] == step[i]:
            j += 1
        if is_stall[i] or j - i == 1:
            starts.append(i)
            durs.append(float(t_min_ns[i:j].sum()))
        else:  # a graph: pieces of at least min_ns, cut at block boundaries
            first = len(starts)
            cut, acc = i, 0.0
            for k in range(i, j):
                if acc >= min_ns:
                    starts.append(cut)
                    durs.append(acc)
                    cut, acc = k, 0.0
                acc += float(t_min_ns[k])
            if acc < min_ns and len(starts) > first:
                durs[-1] += acc  # the short tail joins the piece before
            else:
                starts.append(cut)
                durs.append(acc)
        i = j
    out_s: list[int] = []
    out_d: list[float] = []
    cur_s, cur_d = starts[0], durs[0]
    for s, d in zip(starts[1:], durs[1:], strict=True):
        if cur_d >= min_ns:
            out_s.append(cur_s)
            out_d.append(cur_d)
            cur_s, cur_d = s, d
        else:
            cur_d += d  # too short: joins the next
    if cur_d >= min_ns or not out_s:
        out_s.append(cur_s)
        out_d.append(cur_d)
    else:
        out_d[-1] += cur_d
    return np.asarray(out_s, dtype=np.int64)


def viterbi(cost: np.ndarray, switch_j: float) -> np.ndarray:
    """The level per segment minimising the summed ``cost`` (segments x levels) plus
    ``switch_j`` per level change."""
    n, L = cost.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if switch_j <= 0.0:
        return np.argmin(cost, axis=1).astype(np.int64)
    stay = np.zeros((n, L), dtype=bool)
    from_ = np.zeros(n, dtype=np.int64)
    acc = cost[0].copy()
    rows = list(cost)
    for b in range(1, n):
        j = int(acc.argmin())
        move = acc[j] + switch_j
        keep = acc <= move
        stay[b] = keep
        from_[b] = j
        acc = np.where(keep, acc, move) + rows[b]
    path = np.zeros(n, dtype=np.int64)
    lv = int(np.argmin(acc))
    path[-1] = lv
    for b in range(n - 1, 0, -1):
        if not stay[b, lv]:
            lv = int(from_[b])
        path[b - 1] = lv
    return path


@dataclass
class Bound:
    """The Lagrangian dual bound of one solve (modelled, simulated figures): no
    schedule of the segment model within ``targets_ns`` spends less than
    ``dual_j``; the schedule found spends ``model_energy_j``."""

    targets_ns: dict[str, float]
    prices_j_per_ns: dict[str, float]
    dual_j: float
    model_energy_j: float

    @property
    def gap(self) -> float:
        return 1.0 - self.dual_j / self.model_energy_j if self.model_energy_j else float("nan")


class Oracle(ControllerDefaults):
    name = "oracle"
    offline = True  # reads the whole trace; replay gives it per-node events
    # re-anchored on graph begins, sample begins and asks (offline: replay gives them)
    event_kinds = frozenset(
        {
            EventKind.REQUEST_BEGIN,
            EventKind.DECODE_BEGIN,
            EventKind.SAMPLE_BEGIN,
            EventKind.NODE_ASK,
        }
    )

    def __init__(
        self,
        segments: Sequence[Segment],
        device_factory: Callable[[], Any],
        *,
        latency_slack: float = 0.02,
        budgets_ns: dict[str, float] | None = None,
        refine: int = 8,
        trace: Any = None,
        per_request_ttft: bool = False,
    ) -> None:
        from ...accounting import PhoneTrace, default_shadow, scheduled_energy

        self._factory = device_factory
        self._account: Any = None
        dev = device_factory()
        # the segments are the ones replay runs (host model already applied)
        self.trace = trace if trace is not None else PhoneTrace.shared(segments, dev.profile)
        self._timed = all(s.timed for s in segments if s.kind == "kernel")
        if budgets_ns is not None:  # the windows follow the budgets given
            given = any(_request_of(k) is not None for k in budgets_ns)
            if per_request_ttft and not given:
                raise ValueError("per_request_ttft: budgets_ns must give ttft#k windows")
            per_request_ttft = given
        window, self._n_requests, self._n_gaps = latency_windows(
            self.trace, per_request=per_request_ttft
        )
        if budgets_ns is None:
            ref = default_shadow(self.trace, device_factory())
            budgets_ns = {}
            if per_request_ttft:
                if len(ref.requests_latency) != self._n_requests:
                    raise ValueError(
                        f"per-request TTFT: the default's run served "
                        f"{len(ref.requests_latency)} requests, the trace {self._n_requests}"
                    )
                for k, q in enumerate(ref.requests_latency):
                    budgets_ns[f"{TTFT}#{k}"] = (1.0 + latency_slack) * q.ttft_ns
            elif self._n_requests and ref.ttft_ms == ref.ttft_ms:
                budgets_ns["ttft"] = (1.0 + latency_slack) * ref.ttft_ms * 1e6 * self._n_requests
            if self._n_gaps and ref.tpot_ms == ref.tpot_ms:
                budgets_ns["tpot"] = (1.0 + latency_slack) * ref.tpot_ms * 1e6 * self._n_gaps
        self.budgets_ns = {k: float(v) for k, v in budgets_ns.items()}
        windowed = [k in WINDOWS or _request_of(k) is not None for k in self.budgets_ns]
        by_window = any(windowed)
        if by_window and not all(windowed):
            raise ValueError("budgets_ns: either TTFT/TPOT windows or phases, not both")
        self.levels = dev.frequencies_hz()
        self.s_ns = dev.capabilities.switch_latency_ns
        self._profile = dev.profile
        self._dev = dev
        n_steps = len(self.trace.steps)
        self._step_share = np.full(n_steps, 1.0 - float(getattr(dev, "background_share", 0.0)))
        # other apps' load changing at set times (the sweep's mid-run load): the share in
        # effect where the schedule puts each step (SimGpu keeps them as device times)
        t_dev0 = float(dev.now_ns()) if hasattr(dev, "now_ns") else 0.0
        self._loads = [
            (float(t) - t_dev0, 1.0 - float(sh)) for t, sh in getattr(dev, "_load_changes", ())
        ]
        blk = _blocks(self.trace, dev, self._step_share)
        self._step_block = blk.first_block
        self._wake_ns = blk.wake_ns
        self._block_kernel_block, self._block_kernel, self._block_gap = blk.inner
        self.block_t, self.block_e = blk.t_ns, blk.energy_j
        n_blocks, n_levels = self.block_t.shape
        self._t0: int | None = None
        self._offset = 0.0

        # the segments the level holds over: at least one minimum dwell long
        steps = self.trace.steps
        is_stall = np.array([not hasattr(steps[s], "flops") for s in blk.step.tolist()], bool)
        # and at least one switch latency (module docstring; sim adreno640 at 80 ms:
        # modelled TPOT 0.954 of the budget, accounted 1.001, then the top level)
        dwell = float(getattr(self._profile, "min_dwell_ns", 0) or 0)
        dwell = max(dwell, float(self.s_ns))
        self.min_segment_ns = dwell * 1.01 + 2_000.0 if dwell > 0 else 0.0
        self.seg_start = dwell_segments(
            self.block_t.min(axis=1) if n_blocks else np.zeros(0),
            blk.step,
            is_stall,
            self.min_segment_ns,
        )
        self._seg_len = np.diff(np.append(self.seg_start, n_blocks))
        self.switch_j = float(getattr(self._profile, "switch_energy_j", 0.0) or 0.0)
        # each block's budget group (a window or a phase); others are free
        group_of_step = window if by_window else [getattr(s, "phase", None) for s in steps]
        self.groups = list(self.budgets_ns)
        block_group = [group_of_step[s] for s in blk.step.tolist()]
        self._group_mask = np.array(
            [[q == g for g in self.groups] for q in block_group], dtype=bool
        ).reshape(n_blocks, len(self.groups))
        self._aggregate()

        # solve, check by the accounting, move each group's target by the model's
        # error there; keep the cheapest checked schedule within budget
        targets = dict(self.budgets_ns)
        bad = {g: float("inf") for g in self.groups}
        best: tuple[float, np.ndarray, Any, Bound] | None = None
        checked: dict[bytes, Any] = {}
        stalls = 0
        missed: set[str] = set()
        self.checks = 0
        self.budget_bound: Bound | None = None
        self.bound: Bound | None = None
        for _ in range(refine + 1):
            seg, bound = self._solve(targets)
            for _ in range(3 if self._loads else 0):  # the loads where this schedule runs
                self._set(seg)
                shares = self._shares_at(self._step_ns)
                if np.allclose(shares, self._step_share):
                    break
                self._rebuild(shares)
                seg, bound = self._solve(targets)
            if self.budget_bound is None:
                self.budget_bound = bound  # the dual at the true budget
            self._set(seg)
            key = seg.tobytes()
            res = checked.get(key)
            repeat = res is not None
            if res is None:
                res = scheduled_energy(self.trace, device_factory(), self.plan_schedule())
                checked[key] = res
                self.checks += 1
            got = self._measure(res)
            model = self._group_t(seg)
            if all(got[g] <= self.budgets_ns[g] for g in self.groups) and (
                best is None or res.energy_j < best[0]
            ):
                best = (res.energy_j, seg.copy(), res, bound)
            done = True
            for gi, g in enumerate(self.groups):
                budget = self.budgets_ns[g]
                miss = got[g] - budget
                err = got[g] - float(model[gi])  # what the model does not see
                if miss > 0:
                    bad[g] = min(bad[g], targets[g])
                    targets[g] = min(budget - err, targets[g] - miss) - 1e-5 * budget
                    done = False
                elif miss < -1e-4 * budget:
                    new = budget - err
                    if new >= bad[g]:
                        new = 0.5 * (targets[g] + bad[g])
                    if abs(new - targets[g]) > 1e-6 * budget:
                        targets[g] = new
                        done = False
            over = {g for g in self.groups if got[g] > self.budgets_ns[g]}
            if over and (repeat or (missed and over != missed)):
                # no progress: the solve gave back a schedule already checked and
                # over, or the miss moved to another group (the groups share what
                # moves between them: another app's load lands where the schedule puts
                # it, so a faster prompt moves the decode under it; the sweep's first
                # Latin-hypercube point alternated TTFT and TPOT 0.01-0.1% over
                # through every refinement and fell back to the top level). Every
                # target steps down, further each time
                stalls += 1
                for g in self.groups:
                    targets[g] -= STALL_STEP * self.budgets_ns[g] * 2**stalls
                done = False
            missed = over
            if done:
                break
        if best is not None:
            seg, self._account, self.bound = best[1], best[2], best[3]
        else:  # never within budget: the fastest schedule
            seg = np.full(len(self.seg_start), n_levels - 1, dtype=np.int64)
            self.bound = None
            self._account = None
        self._set(seg)
        if self._account is None:
            self._account = checked.get(seg.tobytes())
        self.segment_levels = seg
        rows = np.arange(n_blocks)
        self.energy_j = float(self.block_e[rows, self.schedule].sum())
        self.time_ns = float(self.block_t[rows, self.schedule].sum())

    # ---- the model and its solve ---------------------------------------------------

    def _aggregate(self) -> None:
        """Segment energy and per-group time (segments x levels) from the blocks'."""
        n_blocks, n_levels = self.block_t.shape
        G = len(self.groups)
        if not n_blocks:
            self._seg_e = np.zeros((0, n_levels))
            self._seg_t = np.zeros((G, 0, n_levels))
            return
        self._seg_e = np.add.reduceat(self.block_e, self.seg_start, axis=0)
        self._seg_t = np.zeros((G, len(self.seg_start), n_levels))
        for gi in range(G):
            masked = self.block_t * self._group_mask[:, gi, None]
            self._seg_t[gi] = np.add.reduceat(masked, self.seg_start, axis=0)

    def _shares_at(self, step_ns: np.ndarray) -> np.ndarray:
        """The bandwidth share in effect at each step's predicted start."""
        out = self._step_share.copy()
        if not self._loads:
            return out
        base = 1.0 - float(getattr(self._dev, "background_share", 0.0))
        times = np.array([t for t, _ in self._loads])
        vals = np.array([base] + [v for _, v in self._loads])
        return vals[np.searchsorted(times, step_ns, side="right")]

    def _rebuild(self, shares: np.ndarray) -> None:
        """The blocks again with these per-step shares (same blocks, new times)."""
        self._step_share = shares
        blk = _blocks(self.trace, self._dev, shares)
        self.block_t, self.block_e = blk.t_ns, blk.energy_j
        self._aggregate()

    def _set(self, seg: np.ndarray) -> None:
        """Make ``seg`` (a level per segment) the schedule, block by block."""
        self.schedule = np.repeat(seg, self._seg_len).astype(np.int64)
        self._timeline()

    def _group_t(self, seg: np.ndarray) -> np.ndarray:
        idx = np.arange(len(seg))
        return self._seg_t[:, idx, seg].sum(axis=1)

    def _measure(self, acc: Any) -> dict[str, float]:
        """Each budget group's time in an accounting pass (ns in total)."""
        out: dict[str, float] = {}
        for g in self.groups:
            req = _request_of(g)
            if req is not None:
                out[g] = float(acc.requests_latency[req].ttft_ns)
            elif g == "ttft":
                out[g] = acc.ttft_ms * 1e6 * self._n_requests
            elif g == "tpot":
                out[g] = acc.tpot_ms * 1e6 * self._n_gaps
            else:
                out[g] = float(acc.time_by_phase_ns.get(g, 0))
        return out

    def _solve(self, targets: dict[str, float]) -> tuple[np.ndarray, Bound]:
        """Cheapest level per segment with each group's modelled time within its
        target: bisection on the groups' prices, then ``_mix``. Returns the schedule
        and the best Lagrangian dual value met (a lower bound at these targets)."""
        E, T, sw = self._seg_e, self._seg_t, self.switch_j
        n, G = len(E), len(self.groups)
        tgt = np.array([targets[g] for g in self.groups], dtype=np.float64)
        idx = np.arange(n)
        dual = -np.inf
        dual_lam = np.zeros(G)

        def run(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            nonlocal dual, dual_lam
            cost = E + np.tensordot(lam, T, axes=1) if G else E
            path = viterbi(cost, sw)
            tg = T[:, idx, path].sum(axis=1)
            e = float(E[idx, path].sum()) + sw * float(np.count_nonzero(np.diff(path)))
            lagr = e + float(lam @ (tg - tgt))
            if lagr > dual:
                dual, dual_lam = lagr, lam.copy()
            return path, tg

        big = np.full(G, 1e3)  # J per ns: the fastest schedule
        _, tg_fast = run(big)
        fixed = tg_fast > tgt  # out of reach even flat out: held at the fastest
        lo = np.where(fixed, big, 0.0)
        hi = np.where(fixed, big, 1e-8)
        for _ in range(40):
            _, tg = run(hi)
            over = (tg > tgt) & ~fixed
            if not over.any():
                break
            hi[over] *= 4.0
        for _ in range(36):
            mid = np.where(fixed, big, 0.5 * (lo + hi))
            _, tg = run(mid)
            ok = tg <= tgt
            hi = np.where(ok & ~fixed, mid, hi)
            lo = np.where(~ok & ~fixed, mid, lo)
        best, tg = run(hi)
        for _ in range(20):  # the groups share segments at their edges: settle them
            over = (tg > tgt) & ~fixed
            if not over.any():
                break
            hi[over] *= 1.05
            best, tg = run(hi)
        over_path, _ = run(lo)
        out = self._mix(best, over_path, tgt, fixed)
        e_out = float(E[idx, out].sum()) + sw * float(np.count_nonzero(np.diff(out)))
        bound = Bound(
            targets_ns=dict(targets),
            prices_j_per_ns=dict(zip(self.groups, dual_lam.tolist(), strict=True)),
            dual_j=float(dual),
            model_energy_j=e_out,
        )
        return out, bound

    def _mix(
        self, best: np.ndarray, over: np.ndarray, tgt: np.ndarray, fixed: np.ndarray
    ) -> np.ndarray:
        """Close the duality gap. Identical segments (every decode token's) tie at the
        critical price, so the DP moves them all at once and the price alone jumps from
        a schedule over budget to one far under it. Between the two, take the
        over-budget schedule's level segment by segment, most energy saved per ns
        first, while every group's time stays within its target."""
        E, T = self._seg_e, self._seg_t
        diff = np.nonzero(best != over)[0]
        if diff.size == 0:
            return best
        de = E[diff, best[diff]] - E[diff, over[diff]]
        dt = T[:, diff, over[diff]] - T[:, diff, best[diff]]  # groups x diff
        out = best.copy()
        free = (de > 0) & (dt <= 0).all(axis=0)
        out[diff[free]] = over[diff[free]]  # cheaper and no slower: always
        keep = (de > 0) & (dt > 0).any(axis=0)
        cand, de, dt = diff[keep], de[keep], dt[:, keep]
        room = tgt - self._group_t(out)
        room[fixed] = -np.inf
        for j in np.argsort(-de / np.maximum(dt.clip(min=0).sum(axis=0), 1e-9)):
            if (dt[:, j] <= room).all():
                out[cand[j]] = over[cand[j]]
                room -= dt[:, j]
        return out

    def bound_summary(self) -> dict[str, Any]:
        """The Lagrangian dual bound, for the JSON (all figures simulated, on the
        oracle's segment model): ``gap`` is the schedule's modelled energy over the
        dual at the targets it was solved for (how far from optimal the DP's schedule
        can be, on the model); ``budget_dual_j`` the dual at the true budget (no
        schedule of the model within the budget spends less), and ``accounted_gap``
        the accounted energy over that."""
        b, bb = self.bound, self.budget_bound
        acc = self.account()
        return {
            "model": "segments of at least one minimum dwell, one level each (simulated)",
            "segments": len(self.seg_start),
            "budgets_ns": {g: round(v) for g, v in self.budgets_ns.items()},
            "targets_ns": {g: round(v) for g, v in b.targets_ns.items()} if b else None,
            "model_energy_j": b.model_energy_j if b else None,
            "dual_bound_j": b.dual_j if b else None,
            "gap": b.gap if b else None,
            "budget_dual_j": bb.dual_j if bb else None,
            "accounted_energy_j": acc.energy_j,
            "accounted_gap": 1.0 - bb.dual_j / acc.energy_j if bb and acc.energy_j else None,
            "checks": self.checks,
        }

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
            k_ns[m] = np.rint(
                p.kernel_ns_array(
                    step.flops[m], step.bytes_[m], int(h), float(self._step_share[si])
                )
            )
        t0 = float(self._step_ns[si]) + self._wake_ns[si]  # a wake-up delays the graph
        return t0 + np.cumsum(step.gaps_ns + k_ns) - k_ns

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
