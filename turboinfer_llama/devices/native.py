"""What the native plan executor (``hooks/ti_exec.c``) writes, per backend.

A backend describes its actuation as one of these for its current level table, so the
executor can switch the clock inside ``llama_decode`` without calling back into
Python. The values are the exact strings the backend's own ``set_hz`` writes for each
level (already capped), indexed like ``frequencies_hz()`` (ascending). The executor
opens the files once, ``O_WRONLY|O_CLOEXEC``, and writes with ``pwrite`` at offset 0.

Kept here, below ``engine/``, so that ``devices/`` imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecordActuator:
    """No device write: the executor only logs ``(t_ns, level)`` (simulated device,
    tests). ``cost_ns`` > 0 makes each switch spin that long, standing in for a slow
    actuator in tests and benchmarks (0 in production)."""

    cost_ns: int = 0


@dataclass(frozen=True, slots=True)
class KmodActuator:
    """``ioctl(TI_SET_FREQ)`` on the turboinfer character device. The executor holds its
    own fd, so its PM QoS request lasts until the executor is destroyed."""

    path: str


@dataclass(frozen=True, slots=True)
class SysfsPairActuator:
    """A floor and a ceiling file (devfreq ``min_freq``/``max_freq``, KGSL
    ``min_pwrlevel``/``max_pwrlevel``). ``initial_floor``/``initial_ceiling``: the levels
    the files hold now, so the first write keeps floor <= ceiling too."""

    floor_path: str
    ceiling_path: str
    floor_values: tuple[str, ...]
    ceiling_values: tuple[str, ...]
    initial_floor: int = 0
    initial_ceiling: int = -1  # -1: the top level

    def __post_init__(self) -> None:
        if len(self.floor_values) != len(self.ceiling_values):
            raise ValueError("floor_values and ceiling_values need one value per level each")


@dataclass(frozen=True, slots=True)
class SysfsOneActuator:
    """One file taking the target directly (devfreq ``userspace/set_freq``)."""

    path: str
    values: tuple[str, ...]


NativeActuator = RecordActuator | KmodActuator | SysfsPairActuator | SysfsOneActuator


def level_index(levels_hz: list[int], hz: int) -> int:
    """Index of the level nearest to ``hz`` in the ascending table (ties go up)."""
    return min(range(len(levels_hz)), key=lambda i: (abs(levels_hz[i] - hz), -levels_hz[i]))


__all__ = [
    "KmodActuator",
    "NativeActuator",
    "RecordActuator",
    "SysfsOneActuator",
    "SysfsPairActuator",
    "level_index",
]
