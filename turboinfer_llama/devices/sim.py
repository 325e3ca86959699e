"""SimGpu: a virtual mobile GPU on a virtual clock, the default device.

It consumes the engine's stream (kernels as ops/bytes, host gaps as measured ns),
times each kernel with a roofline at the current clock (compute scales with 1/f,
DRAM time does not), applies frequency changes only after the profile's switch
latency, emulates the default governors (msm-adreno-tz, simple_ondemand) with their
real parameters, and integrates power P = static(V) + busy*C*V^2*f + clock-gated idle
share. Every figure it produces is simulated; the profile files in ``profiles/`` name
the source or assumption behind each parameter.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import random
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from .base import (
    Capabilities,
    Counters,
    DeviceGone,
    DeviceNotFound,
    DeviceState,
    InvalidFrequency,
    snap_hz,
)
from .governors import GOVERNORS, TzRules, ondemand_target_hz, tz_ready, tz_step
from .native import RecordActuator

log = logging.getLogger(__name__)

__all__ = ["GOVERNORS", "BatchResult", "SimGpu", "SimProfile", "list_profiles", "load_profile"]
SWITCH_PATHS: tuple[str, ...] = ("direct", "thermal")
DEFAULT_PROFILE = "adreno650"
PowerState = Literal["busy", "idle", "slumber"]

_US = 1000
_MS = 1_000_000


def list_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    folder = resources.files(__package__).joinpath("profiles")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


@dataclass(frozen=True)
class SimProfile:
    """One GPU's parameters (SI units; times in ns). ``notes`` maps each parameter to
    its ``source``/``assumption`` text from the profile file.

    The fields after ``ondemand_polling_ns`` have neutral defaults (no coupling, no
    cost) so that a profile file without them still loads; the shipped profiles set
    them all, each with its note."""

    name: str
    gpu: str
    levels_hz: tuple[int, ...]
    voltages_v: tuple[float, ...]
    initial_hz: int
    default_governor: str | None
    effective_capacitance_f: float
    static_power_w: float
    static_voltage_exponent: float
    clock_gated_idle_fraction: float
    idle_timeout_ns: int
    slumber_power_w: float
    peak_ops_per_cycle: float
    compute_efficiency: float
    dram_bandwidth_bytes_per_s: float
    memory_efficiency: float
    compute_memory_overlap: float
    kernel_floor_ns: int
    host_submission_ns: int
    switch_latency_direct_ns: int
    switch_latency_thermal_ns: int
    instructions_per_op: float
    instructions_per_byte: float
    alwayson_hz: float
    tz_call_interval_ns: int
    tz_floor_ns: int
    tz_min_busy_ns: int
    tz_ceiling_ns: int
    tz_ramp_up_idle_ns: int
    tz_laziness: int
    ondemand_up_threshold: int
    ondemand_down_differential: int
    ondemand_polling_ns: int
    # phone host model: the CPU side that feeds the GPU
    host_enqueue_ns: int = 0
    submit_batch_nodes: int = 1
    submit_flush_ns: int = 0
    host_cpu_factor: float = 1.0
    # GPU-DDR coupling: each GPU level's DDR bandwidth vote
    bus_vote_index: tuple[int, ...] = ()
    bus_index_bandwidth_fraction: tuple[float, ...] = ()
    bus_coupling: float = 0.0
    dram_energy_j_per_byte: float = 0.0
    # power state and switching costs
    wakeup_ns: int = 0
    switch_energy_j: float = 0.0
    min_dwell_ns: int = 0
    notes: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.bus_vote_index:
            if len(self.bus_vote_index) != len(self.levels_hz):
                raise ValueError(f"profile {self.name}: bus_vote_index needs one vote per level")
            n = len(self.bus_index_bandwidth_fraction)
            fr = self.bus_index_bandwidth_fraction
            if any(not 0 <= i < n or not 0 < fr[i] <= 1 for i in self.bus_vote_index):
                raise ValueError(
                    f"profile {self.name}: bus_vote_index must index "
                    f"bus_index_bandwidth_fraction (0..{n - 1}) at fractions in (0, 1]"
                )
        if not 0.0 <= self.bus_coupling <= 1.0:
            raise ValueError(f"profile {self.name}: bus_coupling must be within 0..1")
        if self.submit_batch_nodes < 1 or self.host_cpu_factor <= 0:
            raise ValueError(
                f"profile {self.name}: submit_batch_nodes >= 1 and host_cpu_factor > 0"
            )
        factors = tuple(self._bus_factor(i) for i in range(len(self.levels_hz)))
        object.__setattr__(self, "_bw_factor_by_level", factors)
        object.__setattr__(self, "_level_index", {h: i for i, h in enumerate(self.levels_hz)})
        object.__setattr__(self, "_power_cache", {})
        object.__setattr__(self, "_ns_coef_cache", {})

    def _bus_factor(self, i: int) -> float:
        if not self.bus_vote_index or self.bus_coupling == 0.0:
            return 1.0
        frac = float(self.bus_index_bandwidth_fraction[self.bus_vote_index[i]])
        return 1.0 - self.bus_coupling * (1.0 - frac)

    def bandwidth_factor(self, hz: int) -> float:
        """Share of peak DRAM bandwidth the GPU's bus vote at ``hz`` allows (1 when
        uncoupled: Mali, or ``bus_coupling`` 0). Between levels: the level below."""
        i = self._level_index.get(hz)  # type: ignore[attr-defined]
        if i is None:
            i = max(sum(1 for h in self.levels_hz if h <= hz) - 1, 0)
        return self._bw_factor_by_level[i]  # type: ignore[attr-defined,no-any-return]

    def voltage_v(self, hz: int) -> float:
        """Voltage of a level; between levels, linear interpolation."""
        levels, volts = self.levels_hz, self.voltages_v
        if hz <= levels[0]:
            return volts[0]
        for i in range(1, len(levels)):
            if hz <= levels[i]:
                frac = (hz - levels[i - 1]) / (levels[i] - levels[i - 1])
                return volts[i - 1] + frac * (volts[i] - volts[i - 1])
        return volts[-1]

    def power_w(self, hz: int, state: PowerState) -> float:
        """Instantaneous GPU power at clock ``hz`` in ``state`` (DRAM energy is per byte,
        charged by the kernels, not here)."""
        cache: dict[tuple[int, str], float] = self._power_cache  # type: ignore[attr-defined]
        w = cache.get((hz, state))
        if w is None:
            w = cache[(hz, state)] = self._power_w(hz, state)
        return w

    def _power_w(self, hz: int, state: PowerState) -> float:
        if state == "slumber":
            return self.slumber_power_w
        v = self.voltage_v(hz)
        static = self.static_power_w * (v / self.voltages_v[-1]) ** self.static_voltage_exponent
        dynamic = self.effective_capacitance_f * v * v * hz
        if state == "busy":
            return static + dynamic
        return static + self.clock_gated_idle_fraction * dynamic

    def kernel_ns(
        self, flops: float, bytes_: float, hz: int, bandwidth_share: float = 1.0
    ) -> float:
        """Roofline time of one kernel: compute at ``hz``, DRAM at the bandwidth the
        level's bus vote and other apps leave, the shorter partly hidden under the
        longer, never below the floor."""
        t_c = flops / (self.peak_ops_per_cycle * self.compute_efficiency * hz) * 1e9
        bw = (
            self.dram_bandwidth_bytes_per_s
            * self.memory_efficiency
            * bandwidth_share
            * self.bandwidth_factor(hz)
        )
        t_m = bytes_ / bw * 1e9
        t = max(t_c, t_m) + (1.0 - self.compute_memory_overlap) * min(t_c, t_m)
        return max(t, float(self.kernel_floor_ns))

    def kernel_ns_coefs(
        self, hz: int, bandwidth_share: float = 1.0
    ) -> tuple[float, float, float, float]:
        """``kernel_ns_array``'s scalars at one clock and share, computed as it does
        (cached): ns per flop, ns per byte, the weight of the shorter of the two, the
        floor."""
        cache: dict[tuple[int, float], tuple[float, float, float, float]]
        cache = self._ns_coef_cache  # type: ignore[attr-defined]
        co = cache.get((hz, bandwidth_share))
        if co is None:
            bw = (
                self.dram_bandwidth_bytes_per_s
                * self.memory_efficiency
                * bandwidth_share
                * self.bandwidth_factor(hz)
            )
            co = cache[(hz, bandwidth_share)] = (
                1e9 / (self.peak_ops_per_cycle * self.compute_efficiency * hz),
                1e9 / bw,
                1.0 - self.compute_memory_overlap,
                float(self.kernel_floor_ns),
            )
        return co

    def kernel_ns_array(
        self, flops: np.ndarray, bytes_: np.ndarray, hz: int, bandwidth_share: float = 1.0
    ) -> np.ndarray:
        """``kernel_ns`` over arrays of kernels at one clock (same formula)."""
        t_c = flops * (1e9 / (self.peak_ops_per_cycle * self.compute_efficiency * hz))
        bw = (
            self.dram_bandwidth_bytes_per_s
            * self.memory_efficiency
            * bandwidth_share
            * self.bandwidth_factor(hz)
        )
        t_m = bytes_ * (1e9 / bw)
        hi = np.maximum(t_c, t_m)
        lo = np.minimum(t_c, t_m)
        return np.maximum(
            hi + (1.0 - self.compute_memory_overlap) * lo, float(self.kernel_floor_ns)
        )

    def host_gaps_ns(self, n_kernels: int) -> np.ndarray:
        """The phone host's gap before each of a graph's ``n_kernels`` kernels: the
        GPU waits while the CPU enqueues (OpenCL, ``submit_batch_nodes`` 1: every
        kernel) or records a batch of nodes and submits it (Vulkan, ~100 nodes: before
        the first kernel of each batch). Replaces the recording host's inter-kernel
        gaps; no CPU/GPU overlap is assumed (see the profile notes)."""
        n = int(n_kernels)
        gaps = np.zeros(n, dtype=np.int64)
        if n == 0:
            return gaps
        b = self.submit_batch_nodes
        starts = np.arange(0, n, b)
        sizes = np.minimum(b, n - starts)
        gaps[starts] = sizes * self.host_enqueue_ns + self.submit_flush_ns
        return gaps

    def scale_host_ns(self, dur_ns: float) -> int:
        """Per-token CPU work (graph build before a submit, sampling) measured on the
        recording host, as it would take on the phone's CPU."""
        return round(dur_ns * self.host_cpu_factor)


_SCALES = {"_us": _US, "_ms": _MS}
_TUPLES = ("bus_vote_index", "bus_index_bandwidth_fraction")


def load_profile(name_or_path: str) -> SimProfile:
    """A shipped profile by name (``adreno650``) or a JSON file by path."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") and path.is_file():
        text = path.read_text()
    else:
        names = list_profiles()
        if name_or_path not in names:
            raise DeviceNotFound(
                f"no simulator profile {name_or_path!r}; choose one of {', '.join(names)} "
                "or give a path to a profile .json"
            )
        text = (resources.files(__package__) / "profiles" / f"{name_or_path}.json").read_text()
    return _parse_profile(json.loads(text), name_or_path)


def _parse_profile(raw: dict[str, Any], origin: str) -> SimProfile:
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for key, entry in raw.items():
        if key in ("name", "gpu"):
            continue
        if not isinstance(entry, dict) or "value" not in entry:
            raise ValueError(f"profile {origin}: {key} must be an object with a 'value'")
        why = [f"{k}: {entry[k]}" for k in ("source", "assumption") if k in entry]
        if not why:
            raise ValueError(f"profile {origin}: {key} needs a 'source' or 'assumption' note")
        notes[key] = "; ".join(why)
        value = entry["value"]
        for suffix, scale in _SCALES.items():
            if key.endswith(suffix):
                key, value = key[: -len(suffix)] + "_ns", round(value * scale)
        values[key] = tuple(value) if key in _TUPLES else value
    levels = tuple(int(h) for h in values.pop("levels_hz"))
    volts = tuple(float(v) for v in values.pop("voltages_v"))
    if len(levels) != len(volts) or list(levels) != sorted(set(levels)):
        raise ValueError(f"profile {origin}: levels must ascend and match voltages one to one")
    try:
        return SimProfile(
            name=raw.get("name", origin),
            gpu=raw.get("gpu", ""),
            levels_hz=levels,
            voltages_v=volts,
            notes=notes,
            **values,
        )
    except TypeError as e:
        raise ValueError(f"profile {origin}: {e}") from e


@dataclass
class _Window:
    """Busy/total accumulated since the governor last decided."""

    t0_ns: int = 0
    busy0_ns: int = 0


class BatchResult(NamedTuple):
    """What ``SimGpu.run_batch`` did. ``end_ns`` holds the virtual end time of each
    completed kernel. When it stopped at ``stop_at_ns`` inside kernel ``n_done``'s
    gap, ``gap_left_ns`` of that gap is still to run; inside the kernel itself (split
    linearly above its floor), ``work_left`` of its work (1.0: not started)."""

    n_done: int
    end_ns: np.ndarray
    gap_left_ns: int
    work_left: float


def _landing(q: tuple[int, int]) -> int:
    return q[0]


_CHUNK_MIN = 128  # kernels timed per vectorised step; grows while no event cuts it
_CHUNK_MAX = 4096
# fewer kernels than this left in a batch: ``_small_span`` (Python numbers, quicker
# than numpy's calls below about 30 kernels)
_SMALL_SPAN = 25


def _np_sum(xs: list[float]) -> float:
    """``float(np.asarray(xs).sum())`` for a float64 list of at most 128 (numpy's
    pairwise block): under 8 one by one from 0.0; else eight running sums, combined
    pairwise, then the rest one by one -- the same additions in the same order, so
    the same result to the bit."""
    n = len(xs)
    if n < 8:
        res = 0.0
        for x in xs:
            res += x
        return res
    if n > 128:
        return float(np.asarray(xs, dtype=np.float64).sum())
    r0, r1, r2, r3, r4, r5, r6, r7 = xs[:8]
    i = 8
    lim = n - n % 8
    while i < lim:
        r0 += xs[i]
        r1 += xs[i + 1]
        r2 += xs[i + 2]
        r3 += xs[i + 3]
        r4 += xs[i + 4]
        r5 += xs[i + 5]
        r6 += xs[i + 6]
        r7 += xs[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += xs[i]
        i += 1
    return res


class SimGpu:
    """A simulated GPU implementing ``GpuDevice`` plus the replay API.

    ``governor`` is ``"msm-adreno-tz"``, ``"simple_ondemand"`` or None (userspace: only
    ``set_hz`` moves the clock); ``"default"`` picks the profile's. ``switch_path``
    chooses the profile's switch latency for ``set_hz``: ``"direct"`` (KGSL/kernel
    module) or ``"thermal"`` (Android's thermal framework). ``background_share`` is the
    fraction of DRAM bandwidth other apps take. ``pmu_noise`` is the relative standard
    deviation of the simulated instruction counter (seeded by ``seed``).
    ``background_schedule`` changes that share at virtual times (ns after
    ``start_ns``): a photo backup starting and stopping mid-run, say.

    Every applied level change costs the profile's ``switch_energy_j`` and no change
    lands sooner than ``min_dwell_ns`` after the previous one, whoever asked for it
    (a controller or the device's own governor).
    """

    def __init__(
        self,
        profile: str | SimProfile = DEFAULT_PROFILE,
        *,
        governor: str | None = "default",
        switch_path: str = "direct",
        background_share: float = 0.0,
        pmu_noise: float = 0.0,
        seed: int = 0,
        start_ns: int = 0,
        record_intervals: bool = False,
        background_schedule: list[tuple[int, float]] | None = None,
        governor_phase_ns: int = 0,
        host_model: bool = False,
    ) -> None:
        self.profile = profile if isinstance(profile, SimProfile) else load_profile(profile)
        if governor_phase_ns < 0:
            raise ValueError(f"governor_phase_ns must be >= 0, got {governor_phase_ns}")
        # simple_ondemand's polling timer: its first poll comes this much (modulo the
        # period) sooner than one period after the governor is set. A real device's
        # timer runs from its own boot, so where its polls fall against the workload
        # is arbitrary: bench.default_phases runs the default at several
        self._governor_phase_ns = int(governor_phase_ns)
        if switch_path not in SWITCH_PATHS:
            raise ValueError(f"switch_path must be one of {', '.join(SWITCH_PATHS)}")
        p = self.profile
        self.name = f"sim:{p.name}"
        self.switch_path = switch_path
        self._switch_latency_ns = (
            p.switch_latency_direct_ns if switch_path == "direct" else p.switch_latency_thermal_ns
        )
        self.capabilities = Capabilities(
            can_set=True,
            has_pmu=True,
            simulated=True,
            switch_latency_ns=self._switch_latency_ns,
            switch_latency_source=f"profile {p.name}: "
            + p.notes.get(f"switch_latency_{switch_path}_us", ""),
            notes=("simulated",),
            # ``host_model``: the work it runs comes through the profile's phone host
            # model (``accounting.phone_segments``; the benchmark, the sweep and the live
            # account), so it can say where the backend submits. A trace replayed as it
            # is (a synthetic one: a gap before every kernel) has its own host, and the
            # profile's batches would be a false claim there
            submit_batch_nodes=p.submit_batch_nodes if host_model else None,
        )
        self._lock = threading.RLock()
        self._levels = list(p.levels_hz)
        self._tz_rules = TzRules(
            p.tz_floor_ns, p.tz_min_busy_ns, p.tz_ceiling_ns, p.tz_ramp_up_idle_ns, p.tz_laziness
        )
        self._t = int(start_ns)
        self._t0 = int(start_ns)
        self._hz = snap_hz(self._levels, p.initial_hz)
        self._pending: list[tuple[int, int]] = []
        self._last_switch_ns: int | None = None
        self._min_hz = self._levels[0]
        self._max_hz = self._levels[-1]
        self._pin_hz: int | None = None
        self._thermal_cap_hz: int | None = None
        self._phase = "idle"
        self._idle_since: int | None = self._t
        self._slumber = False
        self._rng = random.Random(seed)
        self.pmu_noise = pmu_noise
        self._bw_share = 1.0
        self.background_share = background_share
        # other apps' DRAM load changing at virtual times (t_ns after start, share)
        self._load_changes = sorted(
            (int(start_ns) + int(t), float(sh)) for t, sh in (background_schedule or [])
        )
        for _, sh in self._load_changes:
            if not 0.0 <= sh < 1.0:
                raise ValueError(f"background_schedule shares must be in [0, 1), got {sh}")
        self.energy_j = 0.0
        self.energy_by_phase_j: dict[str, float] = {}
        self.time_by_phase_ns: dict[str, int] = {}
        self.gap_ns_by_kind: dict[str, int] = {}
        self.busy_ns = 0
        self.busy_cycles = 0.0
        self.kernels = 0
        self.switches = 0
        self.switch_log: list[tuple[int, int]] = []
        self.switch_energy_j = 0.0
        self.dram_bytes = 0.0
        self.dram_energy_j = 0.0
        self.wakeups = 0
        self._instructions = 0.0
        self.record_intervals = record_intervals
        self.intervals: list[tuple[int, int, int, str, str, float]] = []
        self._window = _Window(self._t, 0)
        self._tz_last_call_ns: int | None = None
        self._tz_lazy = p.tz_laziness
        self.governor_decisions = 0
        self._next_poll_ns: int | None = None
        self._governor: str | None = None
        self.governor = p.default_governor if governor == "default" else governor
        self._closed = False
        self._initial = self.snapshot()

    # ---- GpuDevice ---------------------------------------------------------------

    def frequencies_hz(self) -> list[int]:
        return list(self._levels)

    def current_hz(self) -> int:
        return self._hz

    def set_hz(self, hz: int) -> int:
        """Pin the clock (like min = max on a real device); the change lands after the
        switch latency. Returns the level that will apply."""
        with self._lock:
            self._check_open()
            if hz <= 0:
                raise InvalidFrequency(f"{hz} Hz: frequencies must be positive; {self._table()}")
            level = self._clamp(snap_hz(self._levels, int(hz)), pinned=False)
            self._pin_hz = level
            self._request(level, self._switch_latency_ns)
            return level

    def set_range(self, min_hz: int, max_hz: int) -> None:
        with self._lock:
            self._check_open()
            if min_hz <= 0 or max_hz < min_hz:
                raise InvalidFrequency(
                    f"range {min_hz}-{max_hz} Hz: need 0 < min <= max; {self._table()}"
                )
            self._min_hz = snap_hz(self._levels, int(min_hz))
            self._max_hz = snap_hz(self._levels, int(max_hz))
            self._pin_hz = None
            self._request(self._clamp(self._target_hz()), self._switch_latency_ns)

    def read_counters(self) -> Counters:
        with self._lock:
            return Counters(
                ts_ns=self._t,
                busy_ns=self.busy_ns,
                total_ns=self._t - self._t0,
                instructions=int(self._instructions),
                freq_hz=self._hz,
            )

    def snapshot(self) -> DeviceState:
        return DeviceState(
            governor=self._governor,
            min_hz=self._min_hz,
            max_hz=self._max_hz,
            extra={"pin_hz": self._pin_hz},
        )

    def restore(self, state: DeviceState) -> None:
        with self._lock:
            self._check_open()
            self.governor = state.governor
            self.set_range(state.min_hz, state.max_hz)
            pin = state.extra.get("pin_hz")
            if pin is not None:
                self.set_hz(pin)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.restore(self._initial)
            self._closed = True

    # ---- replay API: the per-kernel reference path --------------------------------

    def now_ns(self) -> int:
        return self._t

    def run_kernel(self, op: str, flops: float, bytes_: float, *, phase: str) -> int:
        """Run one kernel from now; returns the virtual ns it took (a wake-up from
        slumber included)."""
        if flops < 0 or bytes_ < 0:
            raise ValueError(f"kernel {op}: flops and bytes must be >= 0")
        with self._lock:
            start = self._t
            self._phase = phase
            self._wake(phase)
            self._idle_since = None
            remaining = 1.0
            while remaining > 0:
                full_ns = self.kernel_ns(flops, bytes_)
                need = remaining * full_ns
                nxt = self._next_event_ns()
                if self._t + need <= nxt:
                    self._account(round(need), "busy", phase)
                    break
                dt = int(nxt) - self._t
                self._account(dt, "busy", phase)
                remaining -= dt / full_ns
                self._fire_due()
            e_dram = bytes_ * self.profile.dram_energy_j_per_byte
            self._charge(e_dram, phase)
            self.dram_energy_j += e_dram
            self.dram_bytes += bytes_
            work = (
                flops * self.profile.instructions_per_op
                + bytes_ * self.profile.instructions_per_byte
            )
            if self.pmu_noise > 0:
                work *= max(0.0, 1.0 + self._rng.gauss(0.0, self.pmu_noise))
            self._instructions += work
            self.kernels += 1
            self._tz_notify()
            return self._t - start

    def run_gap(self, dur_ns: int, *, kind: str, phase: str) -> None:
        """A host gap of ``dur_ns``: the GPU is idle (clock-gated; it slumbers after the
        idle timeout). The gap's start is a KGSL idle notification for msm-adreno-tz."""
        if dur_ns < 0:
            raise ValueError(f"gap {kind}: duration must be >= 0, got {dur_ns}")
        with self._lock:
            self._tz_notify()
            self.gap_ns_by_kind[kind] = self.gap_ns_by_kind.get(kind, 0) + int(dur_ns)
            self._idle_until(self._t + int(dur_ns), phase)

    def run_busy(self, dur_ns: int, *, phase: str) -> None:
        """Busy for exactly ``dur_ns`` at the clock in effect (pass-through replay of a
        recorded kernel: its measured duration, not re-timed by the clock)."""
        if dur_ns < 0:
            raise ValueError(f"busy time must be >= 0, got {dur_ns}")
        with self._lock:
            self._phase = phase
            self._idle_since = None
            self._slumber = False
            end = self._t + int(dur_ns)
            while self._t < end:
                nxt = int(min(end, self._next_event_ns()))
                self._account(nxt - self._t, "busy", phase)
                self._fire_due()
            self._tz_notify()

    def advance_to(self, t_ns: int, *, phase: str | None = None) -> None:
        """Idle until virtual time ``t_ns`` (no-op if it is not in the future)."""
        with self._lock:
            if t_ns > self._t:
                self._idle_until(int(t_ns), phase or self._phase)

    # ---- replay API: the vectorised batch path ------------------------------------

    def run_batch(
        self,
        flops: np.ndarray,
        bytes_: np.ndarray,
        gaps_ns: np.ndarray,
        *,
        phase: str,
        stop_at_ns: int | None = None,
        gap_kind: str = "inter_kernel",
    ) -> BatchResult:
        """Run kernels ``i`` = 0.. (each preceded by its host gap ``gaps_ns[i]``) at the
        current clock, until the batch ends or virtual time ``stop_at_ns`` (a switch
        instant of the caller's). Same results as ``run_gap`` + ``run_kernel`` per
        kernel (to integer-ns rounding), numpy over the kernels between device events:
        the device governor's decision instants, switches landing, a gap long enough
        to slumber. Those items take the per-kernel path. A stop inside a kernel
        splits it as ``control.replay`` does: linearly in its work, and only where it
        is more than its floor from either end (else the kernel runs whole). When a
        switch lands inside that first part, it ends before ``stop_at_ns``: call again
        with the rest (``work_left``), as replay re-splits."""
        f = np.asarray(flops, dtype=np.float64)
        b = np.asarray(bytes_, dtype=np.float64)
        g = np.asarray(gaps_ns, dtype=np.int64)
        n = len(f)
        if len(b) != n or len(g) != n:
            raise ValueError("run_batch: flops, bytes_ and gaps_ns must have one entry per kernel")
        if n and (f.min() < 0 or b.min() < 0 or g.min() < 0):
            raise ValueError("run_batch: flops, bytes and gaps must be >= 0")
        ends = np.empty(n, dtype=np.int64)
        p = self.profile
        with self._lock:
            self._phase = phase
            if n:
                self._tz_notify()  # the first gap's start, as run_gap notifies
            i = 0
            chunk = _CHUNK_MIN
            while i < n:
                t = self._t
                if stop_at_ns is not None and stop_at_ns <= t:
                    return BatchResult(i, ends[:i], int(g[i]), 1.0)
                if self._next_device_event_ns() <= t:
                    self._fire_due()
                    continue
                m = (
                    0
                    if self._slumber
                    else self._bulk_span(f, b, g, i, stop_at_ns, ends, gap_kind, chunk)
                )
                if m > 0:
                    chunk = min(2 * chunk, _CHUNK_MAX) if m == chunk else _CHUNK_MIN
                    i += m
                    continue
                # item i holds a device event, a stop or a slumber: per-kernel path
                if stop_at_ns is not None and stop_at_ns <= t + g[i]:
                    # a stop at the gap's very end comes before the kernel, as in replay
                    self.run_gap(int(stop_at_ns - t), kind=gap_kind, phase=phase)
                    return BatchResult(i, ends[:i], int(t + g[i] - stop_at_ns), 1.0)
                self.run_gap(int(g[i]), kind=gap_kind, phase=phase)
                if stop_at_ns is not None and not self._slumber:
                    now = self._t
                    full = self.kernel_ns(float(f[i]), float(b[i]))
                    floor = p.kernel_floor_ns
                    if now + floor < stop_at_ns < now + full - max(1_000, floor):
                        frac = (stop_at_ns - now) / full
                        self.run_kernel("batch", f[i] * frac, b[i] * frac, phase=phase)
                        return BatchResult(i, ends[:i], 0, 1.0 - frac)
                self.run_kernel("batch", float(f[i]), float(b[i]), phase=phase)
                ends[i] = self._t
                i += 1
            return BatchResult(n, ends, 0, 1.0)

    def _bulk_span(
        self,
        f: np.ndarray,
        b: np.ndarray,
        g: np.ndarray,
        i: int,
        stop_at_ns: int | None,
        ends: np.ndarray,
        kind: str,
        chunk: int,
    ) -> int:
        """Run, vectorised, the kernels from ``i`` that end before the next device
        event or stop (and up to the next msm-adreno-tz notification that is due);
        returns how many ran."""
        p = self.profile
        t = self._t
        j = min(len(f), i + chunk)
        if j - i < _SMALL_SPAN:
            return self._small_span(f, b, g, i, j, stop_at_ns, ends, kind)
        gaps = g[i:j]
        # a gap that reaches the idle timeout slumbers: leave it to the per-kernel path
        timeout = p.idle_timeout_ns
        idle0 = t - self._idle_since if self._idle_since is not None else 0
        m_max = j - i
        if m_max and int(gaps.max()) >= timeout:
            m_max = int(np.argmax(gaps >= timeout))
        if m_max > 0 and int(gaps[0]) + idle0 >= timeout:
            m_max = 0
        if m_max == 0:
            return 0
        hz = self._hz
        # ``p.kernel_ns_array`` (the same operations) with its scalars cached
        c_f, c_b, w_lo, floor = p.kernel_ns_coefs(hz, self._bw_share)
        t_c = f[i : i + m_max] * c_f
        t_m = b[i : i + m_max] * c_b
        dur = np.maximum(t_c, t_m)
        np.minimum(t_c, t_m, out=t_c)
        t_c *= w_lo
        dur += t_c
        np.maximum(dur, floor, out=dur)
        np.rint(dur, out=dur)
        dur_i = dur.astype(np.int64)
        end = np.cumsum(gaps[:m_max] + dur_i)
        end += t
        limit: float = self._next_device_event_ns()
        if stop_at_ns is not None:
            limit = min(limit, stop_at_ns)
        m = int(np.searchsorted(end, limit, side="right")) if limit < math.inf else m_max
        notify = False
        if self._governor == "msm-adreno-tz" and m > 0:
            last = self._tz_last_call_ns
            due = -math.inf if last is None else last + p.tz_call_interval_ns
            k = int(np.searchsorted(end[:m], due, side="left"))
            if k < m:
                m, notify = k + 1, True
        if m == 0:
            return 0
        t_end = int(end[m - 1])
        busy_sum = int(dur_i[:m].sum())
        gap_sum = t_end - t - busy_sum  # the gaps' sum: the span is gaps and kernels
        fb, bb = f[i : i + m], b[i : i + m]
        bytes_sum = float(bb.sum())
        w_idle = p.power_w(hz, "idle")
        w_busy = p.power_w(hz, "busy")
        e_dram = bytes_sum * p.dram_energy_j_per_byte
        phase = self._phase
        if self.record_intervals:
            self._record_span(
                (end[:m] - dur_i[:m] - gaps[:m]).tolist(),
                gaps[:m].tolist(),
                dur_i[:m].tolist(),
                bb.tolist(),
                hz,
                phase,
                w_idle,
                w_busy,
            )
        self._book_span(phase, kind, hz, w_idle, w_busy, gap_sum, busy_sum, bytes_sum, e_dram)
        work = fb * p.instructions_per_op + bb * p.instructions_per_byte
        if self.pmu_noise > 0:
            for k in range(m):
                self._instructions += float(work[k]) * max(
                    0.0, 1.0 + self._rng.gauss(0.0, self.pmu_noise)
                )
        else:
            self._instructions += float(work.sum())
        return self._span_done(m, t_end, ends, i, end, notify)

    def _small_span(
        self,
        f: np.ndarray,
        b: np.ndarray,
        g: np.ndarray,
        i: int,
        j: int,
        stop_at_ns: int | None,
        ends: np.ndarray,
        kind: str,
    ) -> int:
        """``_bulk_span`` over fewer than ``_SMALL_SPAN`` kernels (``i..j-1``), in
        Python numbers: the same operations in the same order (``_np_sum`` adds as
        numpy's sum does, ``np.rint`` rounds half to even as ``round`` does), without
        its two dozen numpy calls' set-up."""
        p = self.profile
        t = self._t
        gaps = g[i:j].tolist()
        timeout = p.idle_timeout_ns
        idle0 = t - self._idle_since if self._idle_since is not None else 0
        m_max = len(gaps)
        for k, gk in enumerate(gaps):
            if gk >= timeout:
                m_max = k
                break
        if m_max > 0 and gaps[0] + idle0 >= timeout:
            m_max = 0
        if m_max == 0:
            return 0
        hz = self._hz
        c_f, c_b, w_lo, floor = p.kernel_ns_coefs(hz, self._bw_share)
        fs = f[i : i + m_max].tolist()
        bs = b[i : i + m_max].tolist()
        durs: list[int] = []
        end: list[int] = []
        acc = t
        for k in range(m_max):
            t_c = fs[k] * c_f
            t_m = bs[k] * c_b
            hi, lo = (t_c, t_m) if t_c >= t_m else (t_m, t_c)
            d = hi + lo * w_lo
            dk = round(d if d >= floor else floor)
            durs.append(dk)
            acc += gaps[k] + dk
            end.append(acc)
        limit: float = self._next_device_event_ns()
        if stop_at_ns is not None:
            limit = min(limit, stop_at_ns)
        m = bisect.bisect_right(end, limit) if limit < math.inf else m_max
        notify = False
        if self._governor == "msm-adreno-tz" and m > 0:
            last = self._tz_last_call_ns
            due = -math.inf if last is None else last + p.tz_call_interval_ns
            k = bisect.bisect_left(end, due, 0, m)
            if k < m:
                m, notify = k + 1, True
        if m == 0:
            return 0
        t_end = end[m - 1]
        busy_sum = sum(durs[:m])
        gap_sum = t_end - t - busy_sum
        ipo, ipb = p.instructions_per_op, p.instructions_per_byte
        works = [fs[k] * ipo + bs[k] * ipb for k in range(m)]
        bytes_sum = _np_sum(bs[:m])
        work_sum = _np_sum(works)
        w_idle = p.power_w(hz, "idle")
        w_busy = p.power_w(hz, "busy")
        e_dram = bytes_sum * p.dram_energy_j_per_byte
        phase = self._phase
        if self.record_intervals:
            self._record_span(
                [x - d - gk for x, d, gk in zip(end[:m], durs, gaps, strict=False)],
                gaps[:m],
                durs[:m],
                bs[:m],
                hz,
                phase,
                w_idle,
                w_busy,
            )
        self._book_span(phase, kind, hz, w_idle, w_busy, gap_sum, busy_sum, bytes_sum, e_dram)
        if self.pmu_noise > 0:
            for k in range(m):
                self._instructions += works[k] * max(
                    0.0, 1.0 + self._rng.gauss(0.0, self.pmu_noise)
                )
        else:
            self._instructions += work_sum
        return self._span_done(m, t_end, ends, i, end, notify)

    def _span_done(
        self, m: int, t_end: int, ends: np.ndarray, i: int, end: Any, notify: bool
    ) -> int:
        """Both batch paths' end: ``m`` kernels ran up to ``t_end``, their ends (``end``)
        go to ``ends[i:]``; the governor hears of it when ``notify``."""
        self.kernels += m
        self._t = t_end
        self._idle_since = None
        ends[i : i + m] = end[:m]
        if notify:
            self._tz_notify()
        return m

    def _book_span(
        self,
        phase: str,
        kind: str,
        hz: float,
        w_idle: float,
        w_busy: float,
        gap_sum: int,
        busy_sum: int,
        bytes_sum: float,
        e_dram: float,
    ) -> None:
        """A batch span's totals into the device's counters (both batch paths)."""
        e = (w_idle * gap_sum + w_busy * busy_sum) * 1e-9 + e_dram
        self.energy_j += e
        self.energy_by_phase_j[phase] = self.energy_by_phase_j.get(phase, 0.0) + e
        self.time_by_phase_ns[phase] = self.time_by_phase_ns.get(phase, 0) + gap_sum + busy_sum
        self.gap_ns_by_kind[kind] = self.gap_ns_by_kind.get(kind, 0) + gap_sum
        self.busy_ns += busy_sum
        self.busy_cycles += busy_sum * hz / 1e9
        self.dram_bytes += bytes_sum
        self.dram_energy_j += e_dram

    # ---- extras for controllers, meters and tests --------------------------------

    @property
    def governor(self) -> str | None:
        return self._governor

    @governor.setter
    def governor(self, name: str | None) -> None:
        if name is not None and name not in GOVERNORS:
            raise ValueError(
                f"unknown governor {name!r}; choose one of {', '.join(GOVERNORS)} or None"
            )
        with self._lock:
            self._governor = name
            self._reset_window()
            self._tz_last_call_ns = None
            self._tz_lazy = self.profile.tz_laziness
            self._next_poll_ns = None
            if name == "simple_ondemand":
                period = self.profile.ondemand_polling_ns
                self._next_poll_ns = self._t + period - self._governor_phase_ns % period
                # the first window began a period before that poll, the GPU idle
                # before the start
                self._window = _Window(self._next_poll_ns - period, self.busy_ns)

    @property
    def background_share(self) -> float:
        """Fraction of DRAM bandwidth taken by other apps (0 = GPU has it all)."""
        return 1.0 - self._bw_share

    @background_share.setter
    def background_share(self, share: float) -> None:
        if not 0.0 <= share < 1.0:
            raise ValueError(f"background_share must be in [0, 1), got {share}")
        self._bw_share = 1.0 - share

    @property
    def thermal_cap_hz(self) -> int | None:
        """An emulated thermal cap: no level above it is ever applied."""
        return self._thermal_cap_hz

    @thermal_cap_hz.setter
    def thermal_cap_hz(self, cap: int | None) -> None:
        with self._lock:
            self._thermal_cap_hz = cap
            self._request(self._clamp(self._target_hz()), self.profile.switch_latency_direct_ns)

    @property
    def instructions(self) -> int:
        return int(self._instructions)

    @property
    def alwayson_cycles(self) -> int:
        return int((self._t - self._t0) * self.profile.alwayson_hz / 1e9)

    @property
    def closed(self) -> bool:
        return self._closed

    def native_actuator(self) -> RecordActuator:
        """The native executor only records its switches: the simulator is driven from
        the executor's log afterwards (simulated)."""
        return RecordActuator()

    @property
    def next_switch(self) -> tuple[int, int] | None:
        """The next requested level change not landed yet (switch latency, minimum
        dwell): (virtual ns it lands, Hz); None when none is pending."""
        return self._pending[0] if self._pending else None

    def kernel_ns(self, flops: float, bytes_: float, hz: int | None = None) -> float:
        """Predicted kernel time at ``hz`` (default: now) under the current contention."""
        return self.profile.kernel_ns(flops, bytes_, hz or self._hz, self._bw_share)

    def power_w(self, hz: int | None = None, state: PowerState = "busy") -> float:
        return self.profile.power_w(hz or self._hz, state)

    def host_gaps_ns(self, n_kernels: int) -> np.ndarray:
        """The phone host's gap before each kernel of a graph (``SimProfile.host_gaps_ns``)."""
        return self.profile.host_gaps_ns(n_kernels)

    def scale_host_ns(self, dur_ns: float) -> int:
        """A sample or submit stall on the phone's CPU (``SimProfile.scale_host_ns``)."""
        return self.profile.scale_host_ns(dur_ns)

    # ---- internals ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceGone(f"{self.name} is closed")

    def _table(self) -> str:
        return "levels: " + ", ".join(f"{h / 1e6:g} MHz" for h in self._levels)

    def _target_hz(self) -> int:
        return self._pending[-1][1] if self._pending else self._hz

    def _clamp(self, hz: int, *, pinned: bool = True) -> int:
        lo, hi = self._min_hz, self._max_hz
        if pinned and self._pin_hz is not None:
            lo = hi = self._pin_hz
        hz = min(max(hz, lo), hi)
        cap = self._thermal_cap_hz
        if cap is not None and hz > cap:
            below = [lv for lv in self._levels if lv <= cap]
            hz = below[-1] if below else self._levels[0]
        return hz

    def _request(self, hz: int, latency_ns: int) -> None:
        """Schedule a level change after ``latency_ns``, and no sooner than the minimum
        dwell after the previous change (applied or still pending)."""
        if hz == self._target_hz():
            return
        at = self._t + latency_ns
        dwell = self.profile.min_dwell_ns
        if dwell > 0:
            last = self._pending[-1][0] if self._pending else self._last_switch_ns
            if last is not None:
                at = max(at, last + dwell)
        # stable by landing time (a queue of switches waiting out the dwell can be long)
        bisect.insort(self._pending, (at, hz), key=_landing)
        if at <= self._t:
            self._fire_due()

    def _next_device_event_ns(self) -> int | float:
        """The next switch landing or governor poll (not the idle timeout)."""
        nxt: int | float = math.inf
        if self._pending:
            nxt = self._pending[0][0]
        if self._next_poll_ns is not None:
            nxt = min(nxt, self._next_poll_ns)
        if self._load_changes:
            nxt = min(nxt, self._load_changes[0][0])
        return nxt

    def _next_event_ns(self) -> int | float:
        nxt = self._next_device_event_ns()
        if self._idle_since is not None and not self._slumber:
            nxt = min(nxt, self._idle_since + self.profile.idle_timeout_ns)
        return nxt

    def _fire_due(self) -> None:
        while self._load_changes and self._load_changes[0][0] <= self._t:
            self._bw_share = 1.0 - self._load_changes.pop(0)[1]
        while self._pending and self._pending[0][0] <= self._t:
            _, hz = self._pending.pop(0)
            if hz != self._hz:
                self._hz = hz
                self.switches += 1
                self.switch_log.append((self._t, hz))
                self._last_switch_ns = self._t
                e = self.profile.switch_energy_j
                if e:
                    self.switch_energy_j += e
                    self._charge(e, self._phase)
        if self._next_poll_ns is not None and self._next_poll_ns <= self._t:
            self._ondemand_poll()
            while self._next_poll_ns <= self._t:
                self._next_poll_ns += self.profile.ondemand_polling_ns
        if (
            self._idle_since is not None
            and not self._slumber
            and self._t >= self._idle_since + self.profile.idle_timeout_ns
        ):
            self._slumber = True

    def _wake(self, phase: str) -> None:
        """Leave slumber before a kernel: the GPU powers up for ``wakeup_ns`` (idle
        power) before it can compute."""
        if not self._slumber:
            return
        self._slumber = False
        self.wakeups += 1
        wake = self.profile.wakeup_ns
        if wake > 0:
            self._idle_since = self._t
            self._idle_until(self._t + wake, phase)

    def _idle_until(self, t_end: int, phase: str) -> None:
        if self._idle_since is None:
            self._idle_since = self._t
        while self._t < t_end:
            nxt = min(t_end, self._next_event_ns())
            self._account(int(nxt) - self._t, "slumber" if self._slumber else "idle", phase)
            self._fire_due()

    def _charge(self, e: float, phase: str) -> None:
        """Energy not tied to a time slice (DRAM traffic, a switch)."""
        if not e:
            return
        self.energy_j += e
        self.energy_by_phase_j[phase] = self.energy_by_phase_j.get(phase, 0.0) + e
        if self.record_intervals and self.intervals:
            last = self.intervals[-1]
            self.intervals[-1] = (*last[:5], last[5] + e)

    def _record_span(
        self,
        starts: list[int],
        gaps: list[int],
        durs: list[int],
        bytes_: list[float],
        hz: int,
        phase: str,
        w_idle: float,
        w_busy: float,
    ) -> None:
        """``_record`` of each kernel's gap (idle) then the kernel (busy), for a span
        of kernels at one clock: the same intervals, merged the same way, in one loop
        over Python numbers (a span is hundreds of kernels)."""
        ivs = self.intervals
        dram = self.profile.dram_energy_j_per_byte
        idle_key = (hz, "idle", phase)
        busy_key = (hz, "busy", phase)
        last = ivs[-1] if ivs else None
        for t, g, d, nb in zip(starts, gaps, durs, bytes_, strict=True):
            if g > 0:
                e = w_idle * g * 1e-9
                if last and last[0] + last[1] == t and last[2:5] == idle_key:
                    last = ivs[-1] = (last[0], last[1] + g, hz, "idle", phase, last[5] + e)
                else:
                    last = (t, g, hz, "idle", phase, e)
                    ivs.append(last)
            if d > 0:
                e = w_busy * d * 1e-9 + nb * dram
                tb = t + g
                if last and last[0] + last[1] == tb and last[2:5] == busy_key:
                    last = ivs[-1] = (last[0], last[1] + d, hz, "busy", phase, last[5] + e)
                else:
                    last = (tb, d, hz, "busy", phase, e)
                    ivs.append(last)

    def _record(self, t: int, dt: int, hz: int, state: str, phase: str, e: float) -> None:
        if dt <= 0:
            return
        last = self.intervals[-1] if self.intervals else None
        if last and last[0] + last[1] == t and last[2:5] == (hz, state, phase):
            self.intervals[-1] = (last[0], last[1] + dt, hz, state, phase, last[5] + e)
        else:
            self.intervals.append((t, dt, hz, state, phase, e))

    def _account(self, dt_ns: int, state: PowerState, phase: str) -> None:
        if dt_ns <= 0:
            return
        e = self.profile.power_w(self._hz, state) * dt_ns * 1e-9
        self.energy_j += e
        self.energy_by_phase_j[phase] = self.energy_by_phase_j.get(phase, 0.0) + e
        self.time_by_phase_ns[phase] = self.time_by_phase_ns.get(phase, 0) + dt_ns
        if state == "busy":
            self.busy_ns += dt_ns
            self.busy_cycles += dt_ns * self._hz / 1e9
        if self.record_intervals:
            self._record(self._t, dt_ns, self._hz, state, phase, e)
        self._t += dt_ns

    def _reset_window(self) -> None:
        self._window = _Window(self._t, self.busy_ns)

    def _window_stats(self) -> tuple[int, int]:
        return self._t - self._window.t0_ns, self.busy_ns - self._window.busy0_ns

    def _governor_request(self, hz: int) -> None:
        self._request(self._clamp(hz), self.profile.switch_latency_direct_ns)

    def _tz_notify(self) -> None:
        """msm-adreno-tz on a KGSL retire/idle notification: throttled to one call per
        interval; the rules are ``devices.governors.tz_step``."""
        if self._governor != "msm-adreno-tz":
            return
        p = self.profile
        last = self._tz_last_call_ns
        if last is not None and self._t - last < p.tz_call_interval_ns:
            return
        self._tz_last_call_ns = self._t
        total, busy = self._window_stats()
        if not tz_ready(total, busy, self._tz_rules):
            return
        self._reset_window()
        self.governor_decisions += 1
        i = self._levels.index(self._hz)
        i, self._tz_lazy = tz_step(
            i, len(self._levels) - 1, total, busy, self._tz_lazy, self._tz_rules
        )
        self._governor_request(self._levels[i])

    def _ondemand_poll(self) -> None:
        """simple_ondemand on its polling timer (``devices.governors``)."""
        p = self.profile
        total, busy = self._window_stats()
        self._reset_window()
        self.governor_decisions += 1
        self._governor_request(
            ondemand_target_hz(
                total,
                busy,
                self._hz,
                self._levels,
                p.ondemand_up_threshold,
                p.ondemand_down_differential,
            )
        )


def available(arg: str | None = None, *, root: str = "/") -> tuple[bool, str]:
    """The simulator is always available when its profile exists."""
    name = arg or DEFAULT_PROFILE
    try:
        load_profile(name)
    except (DeviceNotFound, ValueError) as e:
        return False, str(e)
    return True, f"simulated GPU, profile {name}"


def open_backend(arg: str | None = None, *, root: str = "/") -> SimGpu:
    # what runs on an opened device (the benchmark's replays, the live account) comes
    # through the phone host model
    gpu = SimGpu(arg or DEFAULT_PROFILE, host_model=True)
    log.info("using the simulated GPU %s (all energy figures are simulated)", gpu.name)
    return gpu
