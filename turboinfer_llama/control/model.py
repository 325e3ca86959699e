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
  time on the compute side. Which side a node is on is judged at the current
  estimate, so an estimate that starts on the wrong side cannot leave it by RLS alone:
  while the recent fit is poor, :meth:`PhaseModel.refit` re-fits the last graphs over a
  grid of compute and memory efficiencies, every side judged afresh.
* **Sweet spot**: the level minimising predicted busy energy ``P_busy(f) * t(f)`` for
  a phase's graph under current conditions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..devices.base import Counters
from ..engine.graph import REF_BYTES_PER_S, REF_OPS_PER_S
from .plan_native import (
    LAUNCH_NS,
    coupling_of,
    features_numpy,
    kernel_times_numpy,
    mean_hz_numpy,
    rls_step,
)

# The floor term th_o is in units of 1 us (plan_native.LAUNCH_NS). Its prior ``th_o =
# 3`` (3 us) is a typical mobile-GPU minimum kernel time; it must not start far below
# the true floor, or no kernel is classified as floor-bound and the RLS cannot find it.
# lower bounds of (th_c, th_m, th_x, th_o, th_d): efficiencies stay positive, the
# coupling may be absent
_TH_MIN = np.array([0.05, 0.05, 0.05, 0.05, 0.0])
_TH_MAX = 20.0

# Refit (PhaseModel.refit): the RLS is linear only given which side of each roofline a
# node is on, and that is judged at the current estimate. Started on the wrong side
# (a GPU whose compute is 3x slower than the reference machine's, taken as memory-
# bound) it never leaves: the compute regressor of a node judged memory-bound is 0, so
# the compute efficiency cannot move, and the memory one grows instead (sim mali-g76:
# th_c 1.15 / th_m 2.3 learnt against 3.39 / 1.31 true; a graph at 200 MHz predicted
# 1.16x its top-level time against 2.87x). So, while the recent fit is poor, the last
# graphs are fitted again over a grid of compute and memory efficiencies around the
# estimate, every side judged afresh for each candidate.
REFIT_KEEP = 12  # graphs kept for a refit
REFIT_EVERY = 8  # updates between two refits at least
REFIT_MIN_GRAPHS = 6  # graphs needed, at clocks at least REFIT_CLOCK_SPREAD apart
REFIT_CLOCK_SPREAD = 1.15
REFIT_RESID = 0.15  # mean |relative residual| above which the fit may be stuck
REFIT_GAIN = 0.25  # a candidate replaces the estimate below this share of its error
REFIT_FACTORS = np.array([0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0])
# grids tried at most, each moved to the last one's best where that is on its edge
REFIT_ROUNDS = 3
REFIT_FINE = np.array([0.8, 0.87, 0.93, 1.0, 1.07, 1.15, 1.23])  # around the best


def _least_nearest(err: np.ndarray, cand_c: np.ndarray, cand_m: np.ndarray, th: np.ndarray) -> int:
    """The candidate of least error; among those equal to it but for rounding (a side
    no node is on leaves its efficiency free), the nearest to the estimate ``th``, so
    that rounding never picks."""
    tie = err <= err.min() * (1.0 + 1e-9) + 1e-12
    dist = np.abs(np.log(cand_c / th[0])) + np.abs(np.log(cand_m / th[1]))
    return int(np.flatnonzero(tie)[np.argmin(dist[tie])])


class FitGraph(NamedTuple):
    """One graph kept for a refit: its nodes' work and spans, the clock over them
    (boundaries and the clock between), and its measured busy time, ns."""

    c_ns: np.ndarray
    m_ns: np.ndarray
    launch: np.ndarray
    starts_ns: np.ndarray
    ends_ns: np.ndarray
    seg_t_ns: np.ndarray
    seg_hz: np.ndarray
    busy_ns: float


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
                # what the simulator charges every applied change
                float(getattr(profile, "switch_energy_j", 0.0) or 0.0),
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
        self._recent: deque[FitGraph] = deque(maxlen=REFIT_KEEP)
        self._resid_mean = 0.0  # EWMA of |relative residual|
        self._since_refit = 0
        self.refits = 0  # times a refit replaced the estimate
        self._grid_scale = np.ones(1)  # each candidate's fitted scale (last _grid_error)

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

    def update(self, x: np.ndarray, y_ns: float, graph: FitGraph | None = None) -> None:
        """One observation: regressors ``x`` took ``y_ns``. The row is scaled by
        ``1/y_ns`` (relative-error least squares), so graphs and kernels of any size
        move the estimate alike. ``graph``: the same observation node by node, kept
        for :meth:`refit`."""
        if y_ns <= 0:
            return
        self.theta, self.P, err = rls_step(
            self._th(), self.P, x, y_ns, self.forget, _TH_MIN, _TH_MAX, self._p0_trace
        )
        self.n_obs += 1
        self.last_residual = err
        self._resid_mean = 0.7 * self._resid_mean + 0.3 * abs(err)
        self._since_refit += 1
        if graph is not None:
            self._recent.append(graph)

    def refit_due(self) -> bool:
        """The recent fit is poor and enough graphs at different clocks are kept for
        :meth:`refit` to tell the roofline's sides apart."""
        if self._since_refit < REFIT_EVERY or self._resid_mean < REFIT_RESID:
            return False
        if len(self._recent) < REFIT_MIN_GRAPHS:
            return False
        clocks = [float(g.seg_hz.mean()) for g in self._recent]
        return max(clocks) >= REFIT_CLOCK_SPREAD * min(clocks)

    def refit(self) -> bool:
        """Fit the kept graphs again over a grid of compute and memory efficiencies
        (``REFIT_FACTORS`` times the estimate's, the other terms kept), each node's side
        judged at each candidate; take the best where its squared relative error is
        under ``REFIT_GAIN`` of the estimate's, and re-open the estimator from it.
        Returns whether the estimate changed."""
        self._since_refit = 0
        th = self._th()
        cand_c, cand_m, err = self._grid_error(th, th[0] * REFIT_FACTORS, th[1] * REFIT_FACTORS)
        here = int(np.argmin(np.abs(cand_c - th[0]) + np.abs(cand_m - th[1])))
        err_here = float(err[here])
        best = _least_nearest(err, cand_c, cand_m, th)
        for _ in range(REFIT_ROUNDS - 1):
            # the best on the grid's edge: the truth may lie beyond it (a GPU computing
            # 10x slower than the prior), so the grid moves there
            on_edge = cand_c[best] in (cand_c.min(), cand_c.max()) or cand_m[best] in (
                cand_m.min(),
                cand_m.max(),
            )
            if not on_edge or err[best] >= REFIT_GAIN * err_here:
                break
            c0, m0 = cand_c[best], cand_m[best]
            cand_c, cand_m, err = self._grid_error(th, c0 * REFIT_FACTORS, m0 * REFIT_FACTORS)
            best = _least_nearest(err, cand_c, cand_m, th)
        if err[best] >= REFIT_GAIN * err_here:
            return False
        # then a finer grid around the best (the RLS refines only a side a node is on)
        fine_c, fine_m, fine_err = self._grid_error(
            th, cand_c[best] * REFIT_FINE, cand_m[best] * REFIT_FINE
        )
        k = _least_nearest(fine_err, fine_c, fine_m, th)
        scale = float(self._grid_scale[k])
        self.theta = th.copy()
        # the shape's candidate at its fitted scale (the floor term is left as it is)
        self.theta[0] = min(fine_c[k] * scale, _TH_MAX)
        self.theta[1] = min(fine_m[k] * scale, _TH_MAX)
        self.theta[4] = th[4] * scale
        self.P = self._p0.copy()
        self._resid_mean = 0.0
        self.refits += 1
        return True

    def _grid_error(
        self, th: np.ndarray, tc: np.ndarray, tm: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pair of compute (``tc``) and memory (``tm``) efficiencies, with ``th``'s
        other terms: the pairs and their summed squared relative error over the kept
        graphs."""
        tc = np.clip(tc, _TH_MIN[0], _TH_MAX)
        tm = np.clip(tm, _TH_MIN[1], _TH_MAX)
        cand_c = np.repeat(tc, len(tm))
        cand_m = np.tile(tm, len(tc))
        ratios: list[np.ndarray] = []
        for g in self._recent:
            f = mean_hz_numpy(g.starts_ns, g.ends_ns, g.seg_t_ns, g.seg_hz)
            cf = g.c_ns * (self.f_max_hz / f)
            md = g.m_ns * coupling_of(f, self.f_max_hz, self._lv, self._extra)
            a = cf[:, None] * cand_c[None, :]
            b = g.m_ns[:, None] * cand_m[None, :] + (th[4] * md)[:, None]
            t = np.maximum(a, b)
            t += th[2] * np.minimum(a, b)
            np.maximum(t, (th[3] * LAUNCH_NS * g.launch)[:, None], out=t)
            ratios.append(t.sum(axis=0) / g.busy_ns)
        # the shape only: each candidate at the common scale that fits it best (tmpc
        # carries the absolute level in its time scale; an absolute fit explained a
        # model 2.3x short at the top by memory alone and walked compute to the floor,
        # where the kept graphs had slowed 1.4x at 55% of the clock)
        q = np.array(ratios)
        scale = q.sum(axis=0) / np.maximum((q * q).sum(axis=0), 1e-300)
        err = ((q * scale - 1.0) ** 2).sum(axis=0)
        self._grid_scale = scale
        return cand_c, cand_m, err

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
