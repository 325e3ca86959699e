"""The default governor at several phases of its polling timer (simulated).

simple_ondemand decides on a fixed polling timer (``ondemand_polling_ms``) that runs
from the device's boot, so where its polls fall against a run is arbitrary, and on a
multi-stable GPU it decides which level the default settles at. On sim mali-g76 (stop
37's gemma recording) the first request's 11-token prompt keeps a 100 ms window at most
95.5% busy: at 4 of 8 phases a window holds it (over the 90% threshold), the default
goes to the top and settles at 39.4-39.9 ms a token; at the other 4 the polls split
it and the default stays at or below its 260 MHz initial level, 49.8-60.7 ms a token.
The benchmark's default runs at one phase (its first poll one
period after the start); this runs the same timeline at ``PHASES`` phases, evenly
spread, so a reader sees how much of each controller's figure against the default is
the timer's luck -- and the hindsight baselines (``phase``, ``static-best``, the
oracle), which set their levels against that one run, bank it. A causal controller
cannot: its budget must hold whatever the phase (``control.default_bound``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ..accounting import PhoneTrace, default_shadow
from ..devices.sim import SimProfile
from ..engine.segments import Segment

PHASES = 8


def _spread(values: list[float], this_run: float) -> dict[str, float]:
    return {
        "min": min(values),
        "mean": statistics.fmean(values),
        "max": max(values),
        "this_run": this_run,
    }


def default_phase_spread(
    segments: Sequence[Segment], profile: SimProfile, phases: int = PHASES
) -> dict[str, Any] | None:
    """The default's TTFT, TPOT and energy per token over ``phases`` timer phases
    (``SimGpu``'s ``governor_phase_ns``: ``k * polling / phases``; phase 0 is the
    benchmark's own default run), or None where the default governor has no polling
    timer (msm-adreno-tz decides at the GPU's own events). All simulated."""
    if profile.default_governor != "simple_ondemand" or phases < 1:
        return None
    period = profile.ondemand_polling_ns
    trace = PhoneTrace.shared(segments, profile)
    runs = [
        default_shadow(trace, profile, governor_phase_ns=k * period // phases)
        for k in range(phases)
    ]
    ttft = [a.ttft_ms for a in runs]
    tpot = [a.tpot_ms for a in runs]
    energy = [a.energy_per_token_j for a in runs]
    return {
        "governor": "simple_ondemand",
        "polling_ms": period / 1e6,
        "phases": phases,
        "ttft_ms": _spread(ttft, ttft[0]),
        "tpot_ms": _spread(tpot, tpot[0]),
        "energy_per_token_j": _spread(energy, energy[0]),
        "simulated": True,
    }


def spread_line(report: dict[str, Any]) -> str | None:
    """One line for the table's footer."""
    s = report.get("default_timer_phases")
    if not s:
        return None
    tp, tt, e = s["tpot_ms"], s["ttft_ms"], s["energy_per_token_j"]
    return (
        f"default governor ({s['governor']}, {s['polling_ms']:.0f} ms polls) at "
        f"{s['phases']} timer phases (simulated): TPOT {tp['min']:.2f}-{tp['max']:.2f} ms "
        f"(this run {tp['this_run']:.2f}), TTFT {tt['min']:.1f}-{tt['max']:.1f} ms "
        f"(this run {tt['this_run']:.1f}), energy/token {e['min'] * 1e3:.2f}-"
        f"{e['max'] * 1e3:.2f} mJ (this run {e['this_run'] * 1e3:.2f}): every figure "
        f"against the default is against this run's phase"
    )
