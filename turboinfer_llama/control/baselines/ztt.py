"""zTT-style learning governor (after zTT, MobiSys'21), reimplemented small.

Tabular Q-learning over the GPU clock, one decision per decode step (graph end):

* **State**: (current level index, busy-fraction bucket of the last step from the
  device counters -- 4 buckets, latency bucket -- ahead of / within / behind the
  latency budget against the measured top-level reference, the same latency
  bookkeeping TMPC uses).
* **Action**: step the level down one, keep it, or step it up one.
* **Reward**: performance per power, as in zTT: tokens per joule of the last step
  (1 / (step time x estimated power, from the device's power table and busy
  fraction)), normalised by its running maximum, minus a penalty proportional to how
  far latency debt exceeds the budget (zTT penalises missing its target frame rate).

Every ``tmpc.PROBE_EVERY`` steps one runs at the top level, outside learning: the
latency reference's probe, as in TMPC.

Epsilon-greedy with decaying epsilon, learning rate 0.2, discount 0.9; the seeded RNG
makes replays deterministic.

A safety shield bounds it (our addition; zTT has no prefill and penalises a missed
frame rate only through its reward): while the decode latency is behind its budget
the action is "step up" (no exploration, no greedy step down), and each prefill runs
at the top level (zTT decides per frame/token; a prefill at a level learnt for decode
steps multiplied TTFT: +88% on adreno650, +191% on mali-g76, simulated). Without the
shield it ran to +288% TPOT on mali-g76 in an earlier stop.

The Q table persists across replays of one instance, so a caller can train it for a few
episodes first (zTT's training phase).
"""

from __future__ import annotations

import random

import numpy as np

from ...engine.events import Event, EventKind
from ..base import ControllerDefaults, Decision
from ..model import PowerTable
from ..reference import ShadowParams

_BUSY_EDGES = (0.25, 0.5, 0.75)


class ZttQLearning(ControllerDefaults):
    name = "ztt"
    # its reference's (tmpc's event_kinds) and each step's end
    event_kinds = frozenset(
        {
            EventKind.REQUEST_BEGIN,
            EventKind.REQUEST_END,
            EventKind.IDLE,
            EventKind.DECODE_BEGIN,
            EventKind.DECODE_END,
        }
    )

    def __init__(
        self,
        levels_hz: list[int],
        *,
        power: PowerTable,
        shadow: ShadowParams | None = None,
        latency_slack: float = 0.02,
        seed: int = 0,
        alpha: float = 0.2,
        gamma: float = 0.9,
        epsilon: float = 0.3,
        epsilon_decay: float = 0.995,
        penalty: float = 20.0,
    ) -> None:
        from ..tmpc import TubeMPC

        self.levels = sorted(int(h) for h in levels_hz)
        self.L = len(self.levels)
        self.power = power
        self.slack = latency_slack
        # latency bookkeeping only (debt vs the default's shadow); its decisions are unused
        self._ref = TubeMPC(
            self.levels, latency_slack=latency_slack, power=power, shadow=shadow, planning=False
        )
        self.q = np.zeros((self.L, len(_BUSY_EDGES) + 1, 3, 3))
        self.alpha, self.gamma = alpha, gamma
        self.epsilon, self.epsilon_decay = epsilon, epsilon_decay
        self.penalty = penalty
        self._rng = random.Random(seed)
        self.level = self.L - 1
        self._prev: tuple[tuple[int, int, int], int] | None = None
        self._busy_last: tuple[int, int] | None = None
        self._busy_frac = 0.5
        self._t_last: int | None = None
        self._best_rate = 1e-12
        self._prefilled = False  # a prefill ran at the top level since the last decode
        self._probing = False  # the next step runs at the top level for the reference

    def reseed(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def on_counters(self, counters) -> None:
        self._ref.on_counters(counters)
        if self._busy_last is not None:
            dt = counters.total_ns - self._busy_last[1]
            if dt > 0:
                self._busy_frac = (counters.busy_ns - self._busy_last[0]) / dt
        self._busy_last = (counters.busy_ns, counters.total_ns)

    def _state(self) -> tuple[int, int, int]:
        busy = int(np.searchsorted(_BUSY_EDGES, self._busy_frac))
        ref = self._ref
        allowance = self.slack * max(ref.ref_elapsed_ns, 1.0)
        lat = 0 if ref.debt_ns < 0 else (1 if ref.debt_ns <= allowance else 2)
        return (self.level, busy, lat)

    def on_event(self, event: Event) -> Decision | None:
        self._ref.on_event(event)
        if event.kind is EventKind.REQUEST_BEGIN:
            self._t_last = event.t_ns
            # shield: the prefill at the top level; decode resumes at the learnt level
            return Decision(self.levels[-1], event.t_ns, "ztt")
        if event.kind is EventKind.DECODE_BEGIN and event.n_tokens == 1:
            if self._prefilled:
                self._prefilled = False
                return Decision(self.levels[self.level], event.t_ns, "ztt")
            return None
        if event.kind is EventKind.DECODE_BEGIN:
            self._prefilled = True
            return None
        if event.kind is not EventKind.DECODE_END:
            return None
        t = event.t_ns
        step_ns = t - self._t_last if self._t_last is not None else 0
        self._t_last = t
        if self._probing:  # the probe step ran at the top level: back to the learnt one
            self._probing = False
            self._prev = None
            return Decision(self.levels[self.level], t, "ztt")
        if self._ref.probe_due("decode"):
            # the latency reference's top-level probe (as TMPC's): one step at the top,
            # outside learning
            self._probing = True
            self._prev = None
            return Decision(self.levels[-1], t, "ztt")
        state = self._state()
        if self._prev is not None and step_ns > 0:
            b = self._busy_frac
            p_w = b * self.power.busy_w[self.level] + (1 - b) * self.power.idle_w[self.level]
            rate = 1.0 / (step_ns * 1e-9 * p_w)
            self._best_rate = max(self._best_rate, rate)
            ref = self._ref
            over = ref.debt_ns / max(ref.ref_elapsed_ns, 1.0) - self.slack
            reward = rate / self._best_rate - self.penalty * max(0.0, over)
            s0, a0 = self._prev
            target = reward + self.gamma * float(self.q[state].max())
            self.q[s0][a0] += self.alpha * (target - self.q[s0][a0])
        if state[2] == 2:  # shield: behind the budget, climb
            action = 2
        elif self._rng.random() < self.epsilon:
            action = self._rng.randrange(3)
        else:
            action = int(np.argmax(self.q[state]))
        self.epsilon *= self.epsilon_decay
        self._prev = (state, action)
        new = min(self.L - 1, max(0, self.level + action - 1))
        if new == self.level:
            return None
        self.level = new
        return Decision(self.levels[new], t, "ztt")

    def on_graph(self, batch) -> None:
        """Latency bookkeeping only (the reference's debt); zTT decides per token."""
        self._ref.on_graph(batch)

    def on_applied(self, applied: list[tuple[int, int]]) -> None:
        self._ref.on_applied(applied)

    def plan(self, now_ns: int) -> list[Decision]:
        return []
