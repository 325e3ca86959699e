"""A lower bound of the default governor's time, where its rule is deterministic.

tmpc's latency reference is the top clock's measured time (``tmpc.TubeMPC._reference_ns``):
safe on any GPU, but where the default governor runs well below the top clock
(simple_ondemand on the simulated ``mali-g76`` and ``generic``: 20-38% slower) that
slowness is left unspent. simple_ondemand is a plain formula of one window's busy
share, decided on a fixed polling timer (``devices.governors.ondemand_target_hz``), so
its level over a run can be bounded from above -- and the default's time from below --
from what tmpc measures anyway: the stalls and host gaps (GPU idle, the same at every
clock), each graph's busy time per level (the model, at the levels the phase has run),
and the governor's tunables (``ShadowParams``, known only for a profiled device).

``OndemandBound`` runs simple_ondemand on a virtual timeline of the default's run, every
choice taken towards a *faster* default (a higher level, hence less time):

* the timer's phase against the workload is unknown: ``N_PHASES`` timelines with their
  polls shifted by ``polling / N_PHASES``; each graph's bound is the least of them, and
  the level tmpc may follow (``level_hi``) the highest;
* a window's busy time is the caller's upper estimate (tmpc: the lesser of the model's,
  widened by the tube and the learnt gain, and a measured bound -- the graph's kernel
  time at the clocks it ran at, grown by at most the clock ratio): a busier window only
  ever picks a level at least as high (``ondemand_target_hz`` rises with the busy
  share, and above ``up_threshold`` it jumps to the top);
* the timelines start at the device's level when tmpc starts (``initial_level``; the top
  where unknown), each first poll's window taken as busy before the start;
* a graph runs through them in pieces, in its nodes' order, each at most 1/8 of a
  poll long (``graph_pieces``): busy time spread evenly over a graph misses the window
  that falls wholly inside one long kernel, which puts the default at the top;
* a prompt graph runs on them like any other (tmpc);
* ``envelope``: the highest level any timeline can reach over a wholly busy stretch
  (a prompt) from a snapshot of their state, for a prompt to follow: the clock at or
  above it throughout, the prompt is no slower than the default's;
* a raise lands at its poll, a drop one switch latency later (one already on its way
  when the next poll asks again lands when it is due);
* a graph's time at a level is the caller's lower estimate (tmpc: the greatest of the
  model's less the tube, the graph's measured time less what running its lower-clock
  parts faster could save, and the same of the request's earlier graphs -- a longer
  context is never faster).

What this does not bound: errors beyond those margins (the model's tube is a quantile,
not a bound), and a timer phase between two of the ``N_PHASES``. tmpc takes
``max(top-level time, this bound)``, so the bound only ever adds reference where it
says the default is slower than the top clock. Any other governor (msm-adreno-tz: a
closed-source threshold step that a model-driven shadow misjudged by 3-34%), or
simple_ondemand with tunables not known (a real device: its driver sets them), gets no
bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..devices.governors import ondemand_target_hz

N_PHASES = 12  # timer phases tried (see the module docstring)


class _Timeline:
    """simple_ondemand on one virtual timeline of the default's run."""

    __slots__ = ("drop_at", "drop_to", "level", "next_poll", "t", "win_busy", "win_t0")

    def __init__(self, first_poll_ns: float, level: int) -> None:
        self.t = 0.0
        self.next_poll = first_poll_ns
        self.win_t0 = 0.0
        self.win_busy = 0.0
        self.level = level
        self.drop_at = np.inf  # a pending drop lands at drop_at (ns), to drop_to
        self.drop_to = level


class OndemandBound:
    """Upper envelope of simple_ondemand's level; lower bound of the default's time."""

    def __init__(
        self,
        levels_hz: Sequence[int],
        *,
        up_threshold: int,
        down_differential: int,
        polling_ns: int,
        switch_latency_ns: int,
        n_phases: int = N_PHASES,
        initial_level: int | None = None,
    ) -> None:
        if polling_ns <= 0:
            raise ValueError(f"polling interval must be > 0, got {polling_ns}")
        self.levels_hz = [int(x) for x in sorted(levels_hz)]
        self.top = len(self.levels_hz) - 1
        self.up = int(up_threshold)
        self.down = int(down_differential)
        self.poll_ns = float(polling_ns)
        self.switch_ns = float(switch_latency_ns)
        step = self.poll_ns / n_phases
        start = self.top if initial_level is None else int(initial_level)
        self._tl = [_Timeline((k + 1) * step, start) for k in range(n_phases)]
        # each timeline's total lower-bound time of the pooled graphs, and its least
        self._total_ns = np.zeros(len(self._tl))
        self._least_ns = 0.0
        for tl in self._tl:
            # the first poll's window began before the run: taken as busy throughout
            tl.win_t0 = tl.next_poll - self.poll_ns
            tl.win_busy = -tl.win_t0

    # ---- one timeline ------------------------------------------------------------

    def _poll(self, tl: _Timeline) -> None:
        total = tl.t - tl.win_t0
        hz = ondemand_target_hz(
            total,
            tl.win_busy,
            self.levels_hz[tl.level],
            self.levels_hz,
            self.up,
            self.down,
        )
        new = self.levels_hz.index(hz)
        if new >= tl.level:  # a raise (or none) lands at once; it cancels a pending drop
            tl.level = new
            tl.drop_at = np.inf
        elif tl.drop_at == np.inf:
            tl.drop_at, tl.drop_to = tl.t + self.switch_ns, new
        else:
            # a drop on its way (a switch slower than the poll) lands when it is due, at
            # the higher of the two: each poll re-timing it kept it from ever landing,
            # and at an 80 ms switch the bound held the default at the top throughout
            tl.drop_to = max(tl.drop_to, new)
        tl.win_t0, tl.win_busy = tl.t, 0.0
        tl.next_poll += self.poll_ns

    def _run(
        self,
        tl: _Timeline,
        dur_ns: np.ndarray | float,
        busy_share: np.ndarray | float,
        lo_ns: np.ndarray | float,
    ) -> float:
        """Advance ``tl`` through one piece of work that takes ``dur_ns[level]`` at each
        level (busy ``busy_share[level]`` of it); return its lower-bound time
        (``lo_ns[level]`` for the whole piece, shared out by the work done at each
        level). Scalars: the same at every level (GPU-idle time)."""
        scalar = np.ndim(dur_ns) == 0
        left = 1.0  # share of the piece's work still to do
        lo = 0.0
        while left > 1e-12:
            lv = tl.level
            d = float(dur_ns if scalar else dur_ns[lv])  # type: ignore[index]
            b = float(busy_share if np.ndim(busy_share) == 0 else busy_share[lv])  # type: ignore[index]
            lo_lv = float(lo_ns if np.ndim(lo_ns) == 0 else lo_ns[lv])  # type: ignore[index]
            if d <= 0:
                break
            event = min(tl.next_poll, tl.drop_at)
            need = left * d
            dt = min(need, max(event - tl.t, 0.0))
            share = dt / d
            tl.t += dt
            tl.win_busy += b * dt
            lo += share * lo_lv
            left -= share
            if dt >= need:
                left = 0.0
            if tl.t >= tl.drop_at:
                tl.level, tl.drop_at = tl.drop_to, np.inf
            if tl.t >= tl.next_poll:
                self._poll(tl)
        return lo

    # ---- the run ---------------------------------------------------------------

    def _idle_one(self, tl: _Timeline, dur_ns: float) -> None:
        end = tl.t + float(dur_ns)
        # once a poll has seen an idle window the level is the bottom and every
        # later poll of the gap decides the same: whole periods are skipped (a
        # server idle for an hour is not 72,000 polls per timeline)
        self._run(tl, min(float(dur_ns), tl.next_poll + self.poll_ns - tl.t), 0.0, 0.0)
        skip = int((end - tl.t) // self.poll_ns) - 1
        if skip > 0 and tl.level == 0 and tl.drop_at == np.inf and tl.win_busy == 0.0:
            tl.t += skip * self.poll_ns
            tl.next_poll += skip * self.poll_ns
            tl.win_t0 = tl.next_poll - self.poll_ns
        if end > tl.t:
            self._run(tl, end - tl.t, 0.0, 0.0)

    def idle(self, dur_ns: float) -> None:
        """GPU-idle time (a stall, a host gap between graphs, an idle gap)."""
        if dur_ns <= 0:
            return
        for tl in self._tl:
            self._idle_one(tl, dur_ns)

    def snapshot(self) -> tuple[tuple[float, ...], ...]:
        """The timelines' state, for :meth:`envelope` from another thread."""
        return tuple(
            (tl.t, tl.next_poll, tl.win_t0, tl.win_busy, tl.level, tl.drop_at, tl.drop_to)
            for tl in self._tl
        )

    def envelope(
        self,
        snap: tuple[tuple[float, ...], ...],
        busy_ns: float,
        idle_ns: float,
        busy_share: np.ndarray | float = 1.0,
    ) -> list[tuple[float, int]]:
        """The highest level any timeline can be at over a stretch of wholly busy GPU
        time (a prompt) that follows ``busy_ns`` of work not yet accounted for (busy
        ``busy_share`` of it, per level or one for all -- by default throughout: a
        busier window only ever picks a level at least as high) and then ``idle_ns``
        of GPU idle, from the timelines' state ``snap``
        (:meth:`snapshot`): ``(offset ns from the stretch's start, level)`` at each
        change, the first at offset 0, up to the top level (a wholly busy window puts
        every timeline there by its second poll). The state is not changed."""
        per: list[list[tuple[float, int]]] = []
        for st in snap:
            tl = _Timeline(0.0, 0)
            tl.t, tl.next_poll, tl.win_t0, tl.win_busy = st[0], st[1], st[2], st[3]
            tl.level, tl.drop_at, tl.drop_to = int(st[4]), st[5], int(st[6])
            if busy_ns > 0:
                self._run(tl, float(busy_ns), busy_share, 0.0)
            if idle_ns > 0:
                self._idle_one(tl, float(idle_ns))
            t0 = tl.t
            steps = [(0.0, tl.level)]
            for _ in range(16):  # a poll or a drop each; the top by the second poll
                if tl.level >= self.top and tl.drop_at == np.inf:
                    break
                event = min(tl.next_poll, tl.drop_at)
                self._run(tl, max(event - tl.t, 0.0) + 1.0, 1.0, 0.0)
                if tl.level != steps[-1][1]:
                    steps.append((tl.t - t0, tl.level))
            per.append(steps)
        times = sorted({t for steps in per for t, _ in steps})
        out: list[tuple[float, int]] = []
        for t in times:
            lv = max(next(lv for tt, lv in reversed(steps) if tt <= t) for steps in per)
            if not out or lv != out[-1][1]:
                out.append((t, lv))
            if lv >= self.top:
                break
        return out

    def graph(
        self,
        dur_ns: np.ndarray,
        busy_share: np.ndarray,
        lo_ns: np.ndarray,
        *,
        pooled: bool = False,
        pieces: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> float:
        """A graph: its lower-bound time in the default's run, the least over the timer
        phases. ``pooled`` (decode graphs, whose budget is kept over the run): the
        growth of the least *total* over the pooled graphs so far instead. The timer
        has one phase for the whole run, so the default's total is at least the least
        of the timelines' totals -- not only the sum of each graph's least, which takes
        the fastest phase anew for every graph (sim mali-g76, 92 decode graphs: 3.71 s
        against 3.60 s, the default's own ~3.97 s).

        ``pieces``: the graph's consecutive parts, (time share, busy share) per part and
        level, each row summing to 1 over the parts (:func:`graph_pieces`); the graph
        runs through them in order, each busy at its own share. Without them the busy
        time is spread evenly over the graph, which a window shorter than the graph
        misjudges where the busy time bunches up (one long kernel: a window wholly
        inside it is wholly busy and puts the default at the top)."""
        if pieces is None:
            got = np.array([self._run(tl, dur_ns, busy_share, lo_ns) for tl in self._tl])
        else:
            t_share, b_share = pieces
            busy_ns = busy_share * dur_ns
            parts = []
            for t, b in zip(t_share, b_share, strict=True):
                piece_ns = dur_ns * t
                share = np.minimum(1.0, busy_ns * b / np.maximum(piece_ns, 1.0))
                parts.append((piece_ns, share, lo_ns * t))
            got = np.array(
                [sum(self._run(tl, d, sh, lo) for d, sh, lo in parts) for tl in self._tl]
            )
        if not pooled:
            return float(got.min())
        self._total_ns += got
        least = float(self._total_ns.min())
        grew, self._least_ns = least - self._least_ns, least
        return grew

    def level_hi(self) -> int:
        """The highest level any timeline is at now."""
        return max(tl.level for tl in self._tl)

    def next_lo(self, lo_ns: np.ndarray) -> float:
        """Lower-bound time of a pooled graph with times ``lo_ns`` run at each
        timeline's present level (the next graph's, were no poll to come first): the
        growth of the least total, as :meth:`graph` gives it."""
        nxt = self._total_ns + np.array([float(lo_ns[tl.level]) for tl in self._tl])
        return float(nxt.min()) - self._least_ns


PIECES_PER_POLL = 8  # a piece of a graph lasts at most this share of a polling window


def graph_pieces(
    kernel_ns: np.ndarray, host_ns: np.ndarray, poll_ns: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """A graph cut into consecutive pieces of its nodes, each at most ``poll_ns /
    PIECES_PER_POLL`` long at the slowest level (a longer single node is a piece of its
    own): each piece's share of the graph's time and of its busy time, per level,
    ``(pieces, levels)`` arrays for :meth:`OndemandBound.graph`. ``kernel_ns``: (nodes,
    levels) kernel time; ``host_ns``: the GPU-idle time before each node. None where
    the graph fits in one piece."""
    n = len(host_ns)
    if n == 0 or kernel_ns.shape[0] != n:
        return None
    node_ns = kernel_ns.max(axis=1) + host_ns
    span = poll_ns / PIECES_PER_POLL
    ends = np.cumsum(node_ns)
    if ends[-1] <= span:
        return None
    # a piece ends at the node where the running time crosses a multiple of ``span``
    cut = np.unique(np.searchsorted(ends, np.arange(span, float(ends[-1]), span), side="left"))
    edges = np.unique(np.concatenate(([0], np.minimum(cut + 1, n), [n])))
    k = np.add.reduceat(kernel_ns, edges[:-1], axis=0)
    h = np.add.reduceat(host_ns, edges[:-1])[:, None]
    k_tot = np.maximum(k.sum(axis=0), 1e-9)
    return (k + h) / (k_tot + float(host_ns.sum())), k / k_tot
