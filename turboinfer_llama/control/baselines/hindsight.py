"""The baselines a skeptic would pick: the best fixed clock, and a prefill/decode split.

Both are offline: they see the whole recorded run and try every level on it (with
``accounting``, the simulator's vectorised pass, which gives the same figures as a
replay of a pinned clock), then play back the choice like any controller.

* ``static-best``: the one level with the least energy whose TTFT and TPOT both stay
  within ``(1 + latency_slack)`` of the default governor's.
* ``phase``: prefill at the lowest level whose TTFT stays in budget, decode at the
  lowest level whose TPOT does; the pair is checked as a whole and a level raised
  while its budget is missed.
* ``phase-request``: the same split with each request's own TTFT within the budget,
  the promise tmpc keeps (as ``oracle-request`` is the oracle held to it). The run's
  TTFT pools the requests, so ``phase`` may run a long prompt past its budget where
  the short ones came in under theirs (sim mali-g76, the stored gemma recording, 2%:
  the 1,000-token prompt +5.1%, the run's TTFT -1.0%).
* ``phase-prefix``: the same split with its TTFT and TPOT within the budget whatever
  request the run ends at (every prefix of the run's requests), the least a live
  controller must keep: it cannot know which request is the last, so it cannot spend
  slack that only later requests would earn. ``phase`` breaks it where it runs a long
  prompt early on the short prompts that come after (sim mali-g76, the stored gemma
  recording, 2%: TTFT +2.97% over the first two requests).

If no level keeps the budget, both fall back to the top level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ...accounting import Account, PhoneTrace, Switches, applied_energy, default_shadow, phase_split
from ...engine.events import Event, EventKind
from ...engine.segments import Segment
from ..base import ControllerDefaults, Decision


def _within(
    acc: Account, ref: Account, slack: float, per_request: bool = False, prefix: bool = False
) -> tuple[bool, bool]:
    """(TTFT in budget, TPOT in budget); a figure the run does not have is in budget.
    ``per_request``: also each request's own TTFT against the same request's.
    ``prefix``: also both over the first k requests, for every k (the run ending
    after any request)."""
    ttft_ok = math.isnan(ref.ttft_ms) or acc.ttft_ms <= (1 + slack) * ref.ttft_ms
    if per_request and ttft_ok:
        ttft_ok = all(
            a.ttft_ns <= (1 + slack) * r.ttft_ns
            for a, r in zip(acc.requests_latency, ref.requests_latency, strict=True)
        )
    tpot_ok = math.isnan(ref.tpot_ms) or acc.tpot_ms <= (1 + slack) * ref.tpot_ms
    if prefix:
        ttft_a = ttft_r = gaps_a = gaps_r = 0
        for a, r in zip(acc.requests_latency, ref.requests_latency, strict=True):
            ttft_a, ttft_r = ttft_a + a.ttft_ns, ttft_r + r.ttft_ns
            gaps_a, gaps_r = gaps_a + a.gaps_ns, gaps_r + r.gaps_ns
            # the same tokens on both sides: the sums of the gaps stand for the TPOTs
            ttft_ok = ttft_ok and ttft_a <= (1 + slack) * ttft_r
            tpot_ok = tpot_ok and (gaps_r == 0 or gaps_a <= (1 + slack) * gaps_r)
    return ttft_ok, tpot_ok


class _Hindsight(ControllerDefaults):  # static-best: set at the first event
    def __init__(
        self,
        segments: Sequence[Segment],
        device_factory: Callable[[], Any],
        *,
        latency_slack: float = 0.02,
    ) -> None:
        dev = device_factory()
        self.profile = dev.profile
        self.levels = [int(h) for h in dev.frequencies_hz()]
        self.slack = latency_slack
        self._factory = device_factory
        # the segments are the ones replay runs (host model already applied); every
        # figure on a fresh device from the factory (its background load included)
        self.trace = PhoneTrace.shared(segments, self.profile)
        self.reference = default_shadow(self.trace, dev)
        self.by_level = {
            hz: applied_energy(self.trace, device_factory(), Switches.at_times([0], [hz]))
            for hz in self.levels
        }
        self._choose()

    def _choose(self) -> None:
        """Pick the schedule from ``by_level`` and ``reference`` (subclasses)."""
        raise NotImplementedError

    def account(self, device: Any = None) -> Account:
        """The chosen schedule's figures (simulated, by the arrays-based accounting):
        those found while choosing, or run again on ``device`` when one is given."""
        raise NotImplementedError


class StaticBest(_Hindsight):
    """The least-energy single level within the TTFT and TPOT budget."""

    name = "static-best"

    def _choose(self) -> None:
        ok = [hz for hz, a in self.by_level.items() if all(_within(a, self.reference, self.slack))]
        self.freq_hz = min(ok, key=lambda hz: self.by_level[hz].energy_j) if ok else self.levels[-1]
        self._set = False

    def account(self, device: Any = None) -> Account:
        if device is None:
            return self.by_level[self.freq_hz]
        return applied_energy(self.trace, device, Switches.at_times([0], [self.freq_hz]))

    def on_event(self, event: Event) -> Decision | None:
        if self._set:
            return None
        self._set = True
        return Decision(self.freq_hz, event.t_ns, "static-best")

    def plan(self, now_ns: int) -> list[Decision]:
        return []


class PhaseSplit(_Hindsight):
    """Prefill at one level, decode at another, each the lowest within its budget."""

    name = "phase"
    event_kinds = frozenset({EventKind.PREFILL_BEGIN, EventKind.PREFILL_END})

    def __init__(
        self,
        segments: Sequence[Segment],
        device_factory: Callable[[], Any],
        *,
        latency_slack: float = 0.02,
        per_request_ttft: bool = False,
        prefix: bool = False,
    ) -> None:
        """``per_request_ttft``: each request's TTFT within the budget (``phase-request``).
        ``prefix``: the budget kept wherever the run ends (``phase-prefix``)."""
        self.per_request_ttft = per_request_ttft
        self.prefix = prefix
        if per_request_ttft:
            self.name = "phase-request"
        elif prefix:
            self.name = "phase-prefix"
        super().__init__(segments, device_factory, latency_slack=latency_slack)

    def _choose(self) -> None:
        ref, top, each = self.reference, len(self.levels) - 1, self.per_request_ttft
        pre = self.prefix
        checks = {hz: _within(a, ref, self.slack, each, pre) for hz, a in self.by_level.items()}
        p = next((i for i, hz in enumerate(self.levels) if checks[hz][0]), top)
        d = next((i for i, hz in enumerate(self.levels) if checks[hz][1]), top)
        # the pair as a whole: a switch lands one latency late, so check and raise
        while True:
            acc = phase_split(self.trace, self._factory(), self.levels[p], self.levels[d])
            ttft_ok, tpot_ok = _within(acc, ref, self.slack, each, pre)
            if (ttft_ok or p == top) and (tpot_ok or d == top):
                break
            if not ttft_ok and p < top:
                p += 1
            if not tpot_ok and d < top:
                d += 1
        self.prefill_hz, self.decode_hz = self.levels[p], self.levels[d]
        self._account = acc

    def account(self, device: Any = None) -> Account:
        if device is None:
            return self._account
        return phase_split(self.trace, device, self.prefill_hz, self.decode_hz)

    def on_event(self, event: Event) -> Decision | None:
        if event.kind is EventKind.PREFILL_BEGIN:
            return Decision(self.prefill_hz, event.t_ns, "phase: prefill")
        if event.kind is EventKind.PREFILL_END:
            return Decision(self.decode_hz, event.t_ns, "phase: decode")
        return None

    def plan(self, now_ns: int) -> list[Decision]:
        return []
