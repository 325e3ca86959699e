"""The default governors' decision rules, once: msm-adreno-tz and simple_ondemand.

Pure functions of a window's busy and total time, used by the simulator
(``devices.sim.SimGpu``, which the accounting's default-governor pass also runs). What
calls them, and when (KGSL idle/retire notifications throttled to one per call interval for
msm-adreno-tz, a fixed polling timer for simple_ondemand), stays with the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GOVERNORS: tuple[str, ...] = ("msm-adreno-tz", "simple_ondemand")


@dataclass(frozen=True, slots=True)
class TzRules:
    """governor_msm_adreno_tz.c: FLOOR (minimum window), MIN_BUSY, CEILING (jump to
    top); TrustZone's own step is closed source and modelled as simple_gpu_algorithm
    does (up one level when idle time in the window is under ``ramp_up_idle_ns``, down
    one after ``laziness`` decisions that did not ramp up)."""

    floor_ns: int
    min_busy_ns: int
    ceiling_ns: int
    ramp_up_idle_ns: int
    laziness: int


def tz_ready(total_ns: float, busy_ns: float, rules: TzRules) -> bool:
    """Whether a call decides at all: enough window and enough busy time. When it does
    not, the window keeps accumulating."""
    return total_ns > 0 and total_ns >= rules.floor_ns and busy_ns >= rules.min_busy_ns


def tz_step(
    level: int, top: int, total_ns: float, busy_ns: float, lazy: int, rules: TzRules
) -> tuple[int, int]:
    """One msm-adreno-tz decision (call only when ``tz_ready``): the new level index
    (0 = slowest, ``top`` = fastest) and the new laziness counter."""
    if busy_ns > rules.ceiling_ns:
        return top, lazy
    if total_ns - busy_ns < rules.ramp_up_idle_ns:
        return min(level + 1, top), rules.laziness
    lazy -= 1
    if lazy <= 0:
        return max(level - 1, 0), rules.laziness
    return level, lazy


def ondemand_target_hz(
    total_ns: float,
    busy_ns: float,
    cur_hz: int,
    levels_hz: Sequence[int],
    up_threshold: int,
    down_differential: int,
) -> int:
    """devfreq_simple_ondemand_func, in the kernel's integer arithmetic; devfreq then
    takes the lowest level at or above the target. ``levels_hz`` ascends."""
    total, busy = int(total_ns), int(busy_ns)
    top = int(levels_hz[-1])
    if total <= 0 or busy * 100 > total * up_threshold:
        return top
    if busy * 100 > total * (up_threshold - down_differential):
        return int(cur_hz)
    target = busy * int(cur_hz) // total * 100 // (up_threshold - down_differential // 2)
    return next((int(lv) for lv in levels_hz if lv >= target), top)
