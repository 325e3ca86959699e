"""Workload model: how kernel time and energy depend on the clock, identified online.

* **Intensity** (:class:`Intensity`) is the paper's instructions / frequency: PMU
  instructions per cycle at the current clock. High means the clock is too low for
  the work, low means it is too high. Without a PMU we fall back to busy time
  (busy fraction of the window). A jump in intensity re-opens the estimator below.
* **Time model** (:class:`PhaseModel`), one per phase (prefill, decode, kv):
  each node's time at clock ``f`` is a roofline on the cost model's numbers with a
  minimum kernel time, ``max(max(a, b) + th_x * min(a, b), th_o * launch)`` with
  ``a = th_c * c * f_max/f`` and ``b = th_m * m``, where ``c``/``m`` are the node's
  compute/memory times at the top clock from ``engine.graph`` and ``th`` are
  efficiency factors (``th_o`` in units of 1 us: the floor a launched kernel never
  goes below -- dispatch, wave launch, cache flush; on small models about half the
  decode kernels sit on it, and their time does not scale with the clock). Given
  which side of each max a node is on, observed time is linear in ``th``, so
  recursive least squares with forgetting identifies them from (work, clock, time)
  observations; a node that a clock switch landed in is fitted at its time-weighted
  mean clock. The compute-bound fraction at ``f`` follows: the share of predicted
  time on the compute side.
* **Sweet spot**: the level minimising predicted busy energy ``P_busy(f) * t(f)`` for
  a phase's graph under current conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..devices.base import Counters
from ..engine.graph import REF_BYTES_PER_S, REF_OPS_PER_S
from .plan_native import coupling_of, features_numpy, kernel_times_numpy, rls_step

# The floor term th_o is in units of 1 us (plan_native.LAUNCH_NS). Its prior ``th_o =
# 3`` (3 us) is a typical mobile-GPU minimum kernel time; it must not start far below
# the true floor, or no kernel is classified as floor-bound and the RLS cannot find it.
# lower bounds of (th_c, th_m, th_x, th_o, th_d): efficiencies stay positive, the
# coupling may be absent
_TH_MIN = np.array([0.05, 0.05, 0.05, 0.05, 0.0])


@dataclass(frozen=True)
class PowerTable:
    """Power per level. ``busy_w`` while computing, ``idle_w`` while stalled (clock on,
    GPU waiting), ``switch_j`` per frequency change. ``source`` names where the numbers
    come from (a device profile, or the labelled assumption of :meth:`assumed`)."""

    levels_hz: np.ndarray
    busy_w: np.ndarray
    idle_w: np.ndarray
    switch_j: float
    source: str
    # DRAM time at each level relative to the top level's (>= 1), where the SoC ties a
    # DDR bandwidth vote to each GPU level and the device publishes it (the simulated
    # profiles' bus votes; Adreno's qcom,gpu-pwrlevel bus indices); None: unknown, the
    # model learns a smooth coupling instead
    mem_slowdown: np.ndarray | None = None

    @classmethod
    def assumed(cls, levels_hz: list[int], *, top_busy_w: float = 3.0) -> PowerTable:
        """ASSUMPTION (no vendor power numbers): voltage linear in frequency from 0.60 V
        at the lowest level to 0.90 V at the top (typical mobile GPU DVFS range; the
        Adreno device tree gives only RPMh corners), dynamic power C*V^2*f scaled so
        the top level draws ``top_busy_w``, leakage 0.25 W * (V/0.9)^3, a stalled GPU
        keeps leakage plus 15% of dynamic power (clock tree), 20 uJ per switch."""
        f = np.asarray(sorted(levels_hz), dtype=np.float64)
        span = max(f[-1] - f[0], 1.0)
        v = 0.60 + 0.30 * (f - f[0]) / span
        leak = 0.25 * (v / 0.9) ** 3
        dyn = v**2 * f
        dyn = dyn / dyn[-1] * (top_busy_w - leak[-1])
        return cls(f, leak + dyn, leak + 0.15 * dyn, 20e-6, "assumed (model.PowerTable.assumed)")

    @classmethod
    def from_device(cls, device: object) -> PowerTable:
        """The device's own table when it publishes one (``power_table()`` returning
        ``(levels_hz, busy_w, idle_w, switch_j, source)``, or the simulator's
        ``power_w(hz, state)``), else :meth:`assumed`."""
        get = getattr(device, "power_table", None)
        if callable(get):
            levels, busy, idle, switch_j, source = get()
            return cls(
                np.asarray(levels, dtype=np.float64),
                np.asarray(busy, dtype=np.float64),
                np.asarray(idle, dtype=np.float64),
                float(switch_j),
                str(source),
            )
        power_w = getattr(device, "power_w", None)
        levels = device.frequencies_hz()  # type: ignore[attr-defined]
        if callable(power_w):  # the simulator's own power model
            profile = getattr(device, "profile", None)
            slow = None
            if profile is not None and hasattr(profile, "bandwidth_factor"):
                bw = np.array([profile.bandwidth_factor(h) for h in levels])
                slow = bw[-1] / bw
            return cls(
                np.asarray(levels, dtype=np.float64),
                np.array([power_w(h, "busy") for h in levels]),
                np.array([power_w(h, "idle") for h in levels]),
                0.0,
                f"{device.name} power model (simulated)",  # type: ignore[attr-defined]
                slow,
            )
        return cls.assumed(levels)


class Intensity:
    """Instructions per cycle at the current clock, from successive counter readings;
    busy fraction when the device has no PMU (``source`` says which)."""

    def __init__(self) -> None:
        self._last: Counters | None = None
        self.value: float | None = None
        self.source = "none"

    def update(self, c: Counters) -> float | None:
        last, self._last = self._last, c
        if last is None:
            return None
        dt_ns = c.total_ns - last.total_ns
        if dt_ns <= 0:
            return self.value
        if c.instructions is not None and last.instructions is not None and c.freq_hz > 0:
            cycles = dt_ns * 1e-9 * c.freq_hz
            self.value, self.source = (c.instructions - last.instructions) / cycles, "pmu"
        else:
            self.value, self.source = (c.busy_ns - last.busy_ns) / dt_ns, "busy"
        return self.value


def node_times(flops: np.ndarray, bytes_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-node compute and memory time (ns) at the top clock, from cost-model work."""
    return flops / REF_OPS_PER_S * 1e9, bytes_ / REF_BYTES_PER_S * 1e9


class PhaseModel:
    """RLS with forgetting over ``th = (th_c, th_m, th_x, th_o, th_d)`` for one phase.

    ``th_d`` is the GPU-DDR coupling: on SoCs where each GPU level carries a DRAM
    bandwidth vote (Qualcomm's ``qcom,gpu-pwrlevel`` bus indices), memory-bound work
    also slows at low clocks. Its regressor is the memory time times the level's
    extra DRAM time: from the device's published vote table (``mem_slowdown``, prior
    ``th_d = 1``) when known, else an assumed smooth shape ``f_max/f - 1`` whose size
    the data give (prior 0; stays 0 on uncoupled GPUs). A 4-vector ``theta`` set from
    outside is read with ``th_d = 0``."""

    def __init__(
        self,
        f_max_hz: float,
        *,
        forget: float = 0.95,
        levels_hz: np.ndarray | None = None,
        mem_slowdown: np.ndarray | None = None,
    ) -> None:
        self.f_max_hz = float(f_max_hz)
        self.forget = forget
        known = levels_hz is not None and mem_slowdown is not None
        self._lv = np.asarray(levels_hz, dtype=np.float64) if known else None
        self._extra = np.asarray(mem_slowdown, dtype=np.float64) - 1.0 if known else None
        self.theta = np.array([1.0, 1.0, 0.2, 3.0, 1.0 if known else 0.0])
        self._p0 = np.diag([0.5, 0.5, 0.05, 0.5, 0.1])
        self._p0_trace = float(self._p0.trace())
        # (levels_hz it was made for, clock ratio, coupling) per level: fixed per table
        self._level_terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.P = self._p0.copy()
        self.n_obs = 0
        self.last_residual = 0.0

    def features(
        self, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray, f_hz: np.ndarray | float
    ) -> np.ndarray:
        """Summed regressors of nodes run at ``f_hz`` (scalar or per node): compute time
        of compute-bound nodes, memory time of memory-bound ones, the partly hidden
        shorter side (at the current estimate), launches."""
        f = np.asarray(f_hz, dtype=np.float64)
        return features_numpy(
            c_ns, m_ns, launches, f, self._th(), self.f_max_hz, *self.coupling_table
        )

    @property
    def coupling_table(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(levels, extra DRAM time) of the device's published vote table, or
        (None, None): the assumed smooth shape ``f_max/f - 1``."""
        return self._lv, self._extra

    def _coupling(self, f_hz: np.ndarray) -> np.ndarray:
        """Extra DRAM time (relative) at clock ``f_hz``: the vote table's at the level
        at or below, else the assumed smooth shape."""
        return coupling_of(f_hz, self.f_max_hz, self._lv, self._extra)

    def theta_now(self) -> np.ndarray:
        """The current estimate as a 5-vector (a 4-vector set from outside gets
        ``th_d = 0``)."""
        return self._th()

    def _th(self) -> np.ndarray:
        th = self.theta
        if len(th) == 4:  # set from outside without the coupling term
            th = self.theta = np.append(th, 0.0)
        return th

    def update(self, x: np.ndarray, y_ns: float) -> None:
        """One observation: regressors ``x`` took ``y_ns``. The row is scaled by
        ``1/y_ns`` (relative-error least squares), so graphs and kernels of any size
        move the estimate alike."""
        if y_ns <= 0:
            return
        self.theta, self.P, err = rls_step(
            self._th(), self.P, x, y_ns, self.forget, _TH_MIN, 20.0, self._p0_trace
        )
        self.n_obs += 1
        self.last_residual = err

    def reopen(self) -> None:
        """Forget confidence (not the estimate): the workload changed."""
        self.P = self._p0.copy()

    def level_times(
        self, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray, levels_hz: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-node time at every level, shape (nodes, levels), and the part of it that
        scales with the clock (for the compute-bound fraction)."""
        t, a, b, roof, floor = self._level_terms_of(c_ns, m_ns, launches, levels_hz)
        scaling = np.where(roof >= floor, np.where(a >= b, a, self._th()[2] * a), 0.0)
        return t, scaling

    def times_at_levels(
        self, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray, levels_hz: np.ndarray
    ) -> np.ndarray:
        """Per-node time at every level, shape (nodes, levels): :meth:`level_times`
        without the compute-bound part (the planner's per-graph table)."""
        return self._level_terms_of(c_ns, m_ns, launches, levels_hz)[0]

    def _level_terms_of(
        self, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray, levels_hz: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lt = self.level_terms(levels_hz)
        return kernel_times_numpy(c_ns, m_ns, launches, self._th(), lt[1], lt[2])

    def level_terms(self, levels_hz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(levels_hz, clock ratio f_max/f, extra DRAM time) per level, kept while the
        same levels array is asked for."""
        lt = self._level_terms
        if lt is None or lt[0] is not levels_hz:
            lv = np.asarray(levels_hz, dtype=np.float64)
            lt = self._level_terms = (levels_hz, self.f_max_hz / lv, self._coupling(lv))
        return lt


class WorkloadModel:
    """Per-phase time models, intensity tracking and the sweet-spot frequency."""

    PHASES = ("prefill", "decode", "kv")

    def __init__(self, power: PowerTable, *, intensity_jump: float = 0.25) -> None:
        self.power = power
        self.levels_hz = power.levels_hz
        f_max = float(power.levels_hz[-1])
        self.phases = {
            p: PhaseModel(f_max, levels_hz=power.levels_hz, mem_slowdown=power.mem_slowdown)
            for p in self.PHASES
        }
        self.intensity = Intensity()
        self._intensity_ewma: float | None = None
        self.intensity_jump = intensity_jump
        self.reopened = 0

    def observe_counters(self, c: Counters, phase: str) -> None:
        """Track intensity; a jump of more than ``intensity_jump`` against its running
        mean means the workload changed, so that phase's estimator is re-opened."""
        val = self.intensity.update(c)
        if val is None:
            return
        ref = self._intensity_ewma
        if ref is not None and ref > 0 and abs(val - ref) / ref > self.intensity_jump:
            if phase in self.phases:
                self.phases[phase].reopen()
                self.reopened += 1
            self._intensity_ewma = val
        else:
            self._intensity_ewma = val if ref is None else 0.8 * ref + 0.2 * val

    def compute_bound_fraction(
        self, phase: str, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray
    ) -> np.ndarray:
        """Compute-bound fraction of a graph's time at each level."""
        t, comp = self.phases[phase].level_times(c_ns, m_ns, launches, self.levels_hz)
        return comp.sum(axis=0) / np.maximum(t.sum(axis=0), 1e-9)

    def sweet_spot_hz(
        self, phase: str, c_ns: np.ndarray, m_ns: np.ndarray, launches: np.ndarray
    ) -> int:
        """Level with the least busy energy for this work under the current model."""
        t, _ = self.phases[phase].level_times(c_ns, m_ns, launches, self.levels_hz)
        energy = self.power.busy_w * t.sum(axis=0)
        return int(self.levels_hz[int(np.argmin(energy))])
