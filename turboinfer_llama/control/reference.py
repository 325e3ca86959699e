"""The latency reference: what the device's default governor would have taken.

TMPC's latency debt is measured against the default governor, not against the top
clock (on small models the default often sits near the bottom level, and a top-clock
reference would make us burn energy to beat it). The default cannot be observed while
we control the clock, so we run a shadow of it: the same governor rules
(msm-adreno-tz or simple_ondemand, parameters from the device profile, else the
values in BRIEF.md) driven by the work we observe -- kernel time predicted at the
shadow's own level by the workload model, stalls as measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..devices.governors import TzRules, ondemand_target_hz, tz_ready, tz_step


@dataclass(frozen=True)
class ShadowParams:
    """Governor rules. Defaults: governor_msm_adreno_tz.c / governor_simple_ondemand.c
    values from BRIEF.md; the tz ramp-up idle threshold and laziness are assumptions
    (TrustZone's step is closed source) shared with the simulator profile."""

    governor: str | None = "msm-adreno-tz"
    tz_call_interval_ns: int = 10_000_000
    tz_floor_ns: int = 5_000_000
    tz_min_busy_ns: int = 1_000_000
    tz_ceiling_ns: int = 50_000_000
    tz_ramp_up_idle_ns: int = 6_000_000
    tz_laziness: int = 5
    ondemand_up: int = 90
    ondemand_down: int = 5
    ondemand_polling_ns: int = 50_000_000
    initial_hz: int | None = None

    @classmethod
    def from_device(cls, device: object) -> ShadowParams:
        """Rules of ``device``'s default governor (its profile when it is simulated)."""
        gov = device.snapshot().governor  # type: ignore[attr-defined]
        p = getattr(device, "profile", None)
        if p is None:
            return cls(governor=gov, initial_hz=device.current_hz())  # type: ignore[attr-defined]
        return cls(
            governor=gov,
            tz_call_interval_ns=p.tz_call_interval_ns,
            tz_floor_ns=p.tz_floor_ns,
            tz_min_busy_ns=p.tz_min_busy_ns,
            tz_ceiling_ns=p.tz_ceiling_ns,
            tz_ramp_up_idle_ns=p.tz_ramp_up_idle_ns,
            tz_laziness=p.tz_laziness,
            ondemand_up=p.ondemand_up_threshold,
            ondemand_down=p.ondemand_down_differential,
            ondemand_polling_ns=p.ondemand_polling_ns,
            initial_hz=device.current_hz(),  # type: ignore[attr-defined]
        )


class DefaultShadow:
    """Shadow of the default governor on a virtual clock of its own.

    ``run_compute(busy_ns_by_level, host_ns)`` advances through one block of compute
    (kernel time at every level, plus level-independent host gaps spread evenly);
    ``run_stall(dur_ns)`` through a stall. ``elapsed_ns`` is the reference time.
    """

    def __init__(self, levels_hz: np.ndarray, params: ShadowParams) -> None:
        self.levels_hz = levels_hz
        self.p = params
        init = params.initial_hz if params.initial_hz is not None else int(levels_hz[-1])
        self.level = int(np.argmin(np.abs(levels_hz - init)))
        self.fixed = params.governor is None  # userspace: the clock as found
        self.elapsed_ns = 0.0
        self._win_t = 0.0
        self._win_busy = 0.0
        self._last_call = -1e30
        self._next_poll = float(params.ondemand_polling_ns)
        self._lazy = params.tz_laziness
        self._rules = TzRules(
            params.tz_floor_ns,
            params.tz_min_busy_ns,
            params.tz_ceiling_ns,
            params.tz_ramp_up_idle_ns,
            params.tz_laziness,
        )
        self._levels_list = [int(h) for h in levels_hz]

    def _advance(self, dt: float, busy_rate: float) -> None:
        self.elapsed_ns += dt
        self._win_t += dt
        self._win_busy += dt * busy_rate

    def _next_call(self) -> float:
        if self.fixed:
            return float("inf")
        if self.p.governor == "simple_ondemand":
            return self._next_poll
        return self._last_call + self.p.tz_call_interval_ns

    def _decide(self) -> None:
        """One call of the governor; the rules are ``devices.governors``' (the same code
        the simulator runs)."""
        p, top = self.p, len(self.levels_hz) - 1
        total, busy = self._win_t, self._win_busy
        if p.governor == "simple_ondemand":
            self._next_poll += p.ondemand_polling_ns
            self._win_t = self._win_busy = 0.0
            hz = ondemand_target_hz(
                total,
                busy,
                self._levels_list[self.level],
                self._levels_list,
                p.ondemand_up,
                p.ondemand_down,
            )
            self.level = self._levels_list.index(hz)
            return
        self._last_call = self.elapsed_ns
        if not tz_ready(total, busy, self._rules):
            return
        self._win_t = self._win_busy = 0.0
        self.level, self._lazy = tz_step(self.level, top, total, busy, self._lazy, self._rules)

    def run_stall(self, dur_ns: float) -> None:
        """msm-adreno-tz is called on KGSL idle/retire notifications, so only at the
        stall's start; simple_ondemand polls on a timer, also inside stalls."""
        left = float(dur_ns)
        if self.p.governor == "msm-adreno-tz" and self.elapsed_ns >= self._next_call():
            self._decide()
        while left > 0:
            step = left
            if self.p.governor == "simple_ondemand":
                step = min(left, max(self._next_call() - self.elapsed_ns, 0.0))
            self._advance(step, 0.0)
            left -= step
            if self.p.governor == "simple_ondemand" and self.elapsed_ns >= self._next_call():
                self._decide()

    def run_compute(self, busy_ns_by_level: np.ndarray, host_ns: float) -> float:
        """Advance through a compute block; returns its reference duration."""
        start = self.elapsed_ns
        work_left = 1.0
        while work_left > 1e-12:
            busy = float(busy_ns_by_level[self.level])
            full = busy + host_ns
            if full <= 0:
                break
            rate = busy / full
            need = work_left * full
            room = self._next_call() - self.elapsed_ns
            if need <= room:
                self._advance(need, rate)
                break
            step = max(room, 0.0)
            self._advance(step, rate)
            work_left -= step / full
            self._decide()
        return self.elapsed_ns - start
