"""Energy of a recorded timeline under a given switch sequence, vectorised.

With the simulated device, the live loop's executor records the switches it actually
issued (RECORD actuator). Their energy is accounted here against the real recorded
timeline -- every kernel and stall keeps its measured duration; the clock in effect
at each instant is the one the switches set (landing one switch latency after the
call). A replay of the same recording through a fresh controller in pass-through
timing is accounted with the same function, so the two figures differ only by the
decisions. Everything here is simulated (the power model is the profile's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.events import StallKind
from ..engine.segments import Segment


@dataclass(frozen=True)
class TimelineEnergy:
    energy_j: float
    busy_j: float
    idle_j: float
    switches: int
    duration_s: float
    simulated: bool = True


def energy_on_timeline(
    segments: Sequence[Segment],
    switches: Sequence[tuple[int, int]],
    device: object,
    *,
    initial_level: int | None = None,
) -> TimelineEnergy:
    """Energy (J, simulated) of ``segments`` when the clock follows ``switches``
    (``(t_ns call, level)``, on the segments' clock) on the simulated ``device``'s
    power model. Kernels draw busy power, stalls idle power, and an idle stall slumbers
    after the profile's idle timeout."""
    levels = list(device.frequencies_hz())  # type: ignore[attr-defined]
    power_w = device.power_w  # type: ignore[attr-defined]
    profile = device.profile  # type: ignore[attr-defined]
    s_ns = int(device.capabilities.switch_latency_ns)  # type: ignore[attr-defined]
    busy_w = np.array([power_w(h, "busy") for h in levels])
    idle_w = np.array([power_w(h, "idle") for h in levels])
    if not segments:
        return TimelineEnergy(0.0, 0.0, 0.0, 0, 0.0)
    start = np.array([s.t_ns for s in segments], dtype=np.float64)
    dur = np.array([max(s.dur_ns, 0) for s in segments], dtype=np.float64)
    busy = np.array([s.kind == "kernel" for s in segments])
    idle_kind = np.array([s.stall is StallKind.IDLE for s in segments])
    if initial_level is None:
        initial_level = levels.index(device.current_hz()) if hasattr(device, "current_hz") else 0  # type: ignore[attr-defined]
    sw = sorted((int(t) + s_ns, int(lv)) for t, lv in switches)
    t_sw = np.array([-np.inf] + [t for t, _ in sw])
    lv_sw = np.array([initial_level] + [lv for _, lv in sw], dtype=np.int64)
    # breakpoints of the level step function; integral of each power curve over time
    t0 = float(min(start.min(), t_sw[1]) if len(sw) else start.min())
    tb = np.concatenate([[t0], t_sw[1:][t_sw[1:] > t0]])
    lvb = np.concatenate(
        [[lv_sw[np.searchsorted(t_sw, t0, side="right") - 1]], lv_sw[1:][t_sw[1:] > t0]]
    )

    def integral(power: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = power[lvb]
        cum = np.concatenate([[0.0], np.cumsum(np.diff(tb) * p[:-1])])
        return cum, p

    def at(cum: np.ndarray, p: np.ndarray, t: np.ndarray) -> np.ndarray:
        k = np.clip(np.searchsorted(tb, t, side="right") - 1, 0, len(tb) - 1)
        return cum[k] + (t - tb[k]) * p[k]

    cb, pb = integral(busy_w)
    ci, pi = integral(idle_w)
    end = start + dur
    # an idle stall slumbers after the timeout (level-independent power)
    awake_end = np.where(idle_kind, np.minimum(end, start + profile.idle_timeout_ns), end)
    slumber_ns = float((end - awake_end).sum())
    e_busy = float((at(cb, pb, end[busy]) - at(cb, pb, start[busy])).sum()) * 1e-9
    e_idle = (
        float((at(ci, pi, awake_end[~busy]) - at(ci, pi, start[~busy])).sum())
        + slumber_ns * float(power_w(levels[0], "slumber"))
    ) * 1e-9
    switch_j = float(getattr(profile, "switch_energy_j", 0.0) or 0.0)
    total = e_busy + e_idle + switch_j * len(sw)
    return TimelineEnergy(total, e_busy, e_idle, len(sw), float(dur.sum()) * 1e-9)
