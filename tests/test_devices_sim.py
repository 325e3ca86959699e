"""SimGpu: roofline timing, energy integral, switch latency, governor emulations, PMU."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from turboinfer_llama.devices.base import DeviceGone, DeviceNotFound, GpuDevice, InvalidFrequency
from turboinfer_llama.devices.sim import SimGpu, list_profiles, load_profile

MS = 1_000_000


def toy_profile(**over):
    """Round numbers for hand computation: 100/200 MHz, 1 op/cycle, 1 GB/s, V = 1 V."""
    base = load_profile("generic")
    values = dict(
        levels_hz=(100_000_000, 200_000_000),
        voltages_v=(1.0, 1.0),
        initial_hz=100_000_000,
        default_governor=None,
        effective_capacitance_f=1e-9,
        static_power_w=0.05,
        static_voltage_exponent=3.0,
        clock_gated_idle_fraction=0.2,
        idle_timeout_ns=10**12,
        slumber_power_w=0.001,
        peak_ops_per_cycle=1.0,
        compute_efficiency=1.0,
        dram_bandwidth_bytes_per_s=1e9,
        memory_efficiency=1.0,
        compute_memory_overlap=1.0,
        kernel_floor_ns=0,
        switch_latency_direct_ns=1 * MS,
        switch_latency_thermal_ns=80 * MS,
        host_submission_ns=0,
        host_enqueue_ns=0,
        submit_batch_nodes=1,
        submit_flush_ns=0,
        host_cpu_factor=1.0,
        bus_vote_index=(),
        bus_index_bandwidth_fraction=(),
        bus_coupling=0.0,
        dram_energy_j_per_byte=0.0,
        wakeup_ns=0,
        switch_energy_j=0.0,
        min_dwell_ns=0,
    )
    values.update(over)
    return dataclasses.replace(base, **values)


# ---- profiles ----------------------------------------------------------------------


def test_shipped_profiles_load_and_every_parameter_has_a_note() -> None:
    assert {"adreno650", "adreno640", "mali-g76", "generic"} <= set(list_profiles())
    for name in list_profiles():
        p = load_profile(name)
        assert len(p.levels_hz) == len(p.voltages_v) >= 2
        assert all(("source" in n) or ("assumption" in n) for n in p.notes.values())
        assert {"voltages_v", "effective_capacitance_f", "switch_latency_thermal_us"} <= set(
            p.notes
        )


def test_adreno650_matches_the_brief() -> None:
    p = load_profile("adreno650")
    assert [h // 1000 for h in p.levels_hz] == [
        305000,
        400000,
        441600,
        490000,
        525000,
        587000,
        670000,
    ]
    assert p.initial_hz == 305_000_000
    assert p.default_governor == "msm-adreno-tz"
    assert p.switch_latency_thermal_ns == 80 * MS
    assert p.tz_call_interval_ns == 10 * MS and p.tz_ceiling_ns == 50 * MS
    assert (p.ondemand_up_threshold, p.ondemand_down_differential) == (90, 5)


def test_profile_without_note_is_rejected(tmp_path) -> None:
    raw = {"name": "bad", "levels_hz": {"value": [1, 2]}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="source"):
        load_profile(str(path))


def test_unknown_profile_lists_choices() -> None:
    with pytest.raises(DeviceNotFound, match="adreno650"):
        SimGpu("adreno999")


# ---- GpuDevice basics --------------------------------------------------------------


def test_sim_is_a_gpu_device_and_labelled_simulated() -> None:
    gpu = SimGpu("adreno650")
    assert isinstance(gpu, GpuDevice)
    assert gpu.capabilities.simulated and gpu.capabilities.has_pmu
    assert gpu.name == "sim:adreno650"
    assert gpu.current_hz() == 305_000_000
    assert gpu.governor == "msm-adreno-tz"


def test_set_hz_snaps_and_rejects_nonsense() -> None:
    gpu = SimGpu("adreno650", governor=None)
    assert gpu.set_hz(500_000_000) == 490_000_000
    assert gpu.set_hz(10**12) == 670_000_000
    with pytest.raises(InvalidFrequency, match="MHz"):
        gpu.set_hz(0)
    with pytest.raises(InvalidFrequency):
        gpu.set_range(600_000_000, 400_000_000)


def test_thermal_cap_is_never_exceeded() -> None:
    gpu = SimGpu(toy_profile(), switch_path="direct")
    gpu.thermal_cap_hz = 150_000_000
    assert gpu.set_hz(200_000_000) == 100_000_000
    gpu.advance_to(5 * MS)
    assert gpu.current_hz() == 100_000_000


# ---- roofline ----------------------------------------------------------------------


def test_compute_bound_time_scales_with_one_over_f() -> None:
    p = load_profile("adreno650")
    t_lo = p.kernel_ns(1e9, 0, p.levels_hz[0])
    t_hi = p.kernel_ns(1e9, 0, p.levels_hz[-1])
    assert t_lo / t_hi == pytest.approx(p.levels_hz[-1] / p.levels_hz[0])


def test_memory_bound_time_does_not_scale_within_one_bus_vote() -> None:
    p = load_profile("adreno650")
    # 305 and 490 MHz share bus-max vote 9; 587 and 670 share 11 (kona ladder)
    t_305 = p.kernel_ns(1.0, 1e8, 305_000_000)
    t_490 = p.kernel_ns(1.0, 1e8, 490_000_000)
    t_670 = p.kernel_ns(1.0, 1e8, 670_000_000)
    assert t_305 == pytest.approx(t_490, rel=1e-6)
    assert t_670 == pytest.approx(
        1e8 / (p.dram_bandwidth_bytes_per_s * p.memory_efficiency) * 1e9, rel=1e-6
    )


def test_low_bus_votes_slow_memory_bound_kernels_and_coupling_is_a_knob() -> None:
    p = load_profile("adreno650")
    frac = p.bus_index_bandwidth_fraction[9]
    assert 0 < frac < 1
    t_lo = p.kernel_ns(1.0, 1e8, 305_000_000)
    t_hi = p.kernel_ns(1.0, 1e8, 670_000_000)
    assert t_lo / t_hi == pytest.approx(1 / frac, rel=1e-6)
    half = dataclasses.replace(p, bus_coupling=0.5)
    assert half.kernel_ns(1.0, 1e8, 305_000_000) / t_hi == pytest.approx(
        1 / (1 - 0.5 * (1 - frac)), rel=1e-6
    )
    off = dataclasses.replace(p, bus_coupling=0.0)
    assert off.kernel_ns(1.0, 1e8, 305_000_000) == pytest.approx(t_hi, rel=1e-6)
    # compute-bound work does not care about the vote
    assert p.kernel_ns(1e9, 0, 305_000_000) == off.kernel_ns(1e9, 0, 305_000_000)
    # Mali: DDR has its own devfreq, no coupling
    mali = load_profile("mali-g76")
    assert all(mali.bandwidth_factor(h) == 1.0 for h in mali.levels_hz)


def test_bad_bus_votes_are_refused() -> None:
    p = load_profile("adreno650")
    with pytest.raises(ValueError, match="bus_vote_index"):
        dataclasses.replace(p, bus_vote_index=(1, 2))
    with pytest.raises(ValueError, match="bus_vote_index"):
        dataclasses.replace(p, bus_vote_index=(0,) * len(p.levels_hz))  # index 0 = no vote


def test_mixed_kernel_follows_overlap_formula() -> None:
    p = toy_profile(compute_memory_overlap=0.5)
    # 1 ms compute at 100 MHz, 2 ms memory: 2 + 0.5 * 1 = 2.5 ms
    assert p.kernel_ns(1e5, 2e6, 100_000_000) == pytest.approx(2.5 * MS)
    # at 200 MHz compute halves: 2 + 0.5 * 0.5 = 2.25 ms
    assert p.kernel_ns(1e5, 2e6, 200_000_000) == pytest.approx(2.25 * MS)


def test_run_kernel_advances_virtual_time_by_roofline() -> None:
    gpu = SimGpu(toy_profile())
    assert gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode") == 1 * MS
    assert gpu.now_ns() == 1 * MS
    assert gpu.busy_ns == 1 * MS


def test_background_contention_slows_memory_only() -> None:
    gpu = SimGpu(toy_profile(), background_share=0.5)
    assert gpu.run_kernel("ADD", 0, 1e6, phase="decode") == 2 * MS  # 1 MB at 0.5 GB/s
    assert gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode") == 1 * MS
    with pytest.raises(ValueError):
        gpu.background_share = 1.0


def test_kernel_floor() -> None:
    gpu = SimGpu(toy_profile(kernel_floor_ns=3000))
    assert gpu.run_kernel("ADD", 1, 1, phase="decode") == 3000


# ---- energy ------------------------------------------------------------------------


def test_energy_integral_hand_computed() -> None:
    gpu = SimGpu(toy_profile())
    gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode")  # 1 ms busy at 100 MHz
    gpu.run_gap(2 * MS, kind="sample", phase="decode")  # 2 ms clock-gated idle
    # busy: static 0.05 W + C V^2 f = 1e-9 * 1 * 1e8 = 0.1 W -> 0.15 W * 1 ms = 150 uJ
    # idle: 0.05 W + 0.2 * 0.1 W = 0.07 W * 2 ms = 140 uJ
    assert gpu.energy_j == pytest.approx(150e-6 + 140e-6)
    assert gpu.energy_by_phase_j == {"decode": pytest.approx(290e-6)}


def test_energy_by_phase_and_voltage_scaling() -> None:
    gpu = SimGpu(toy_profile(voltages_v=(0.5, 1.0)), record_intervals=True)
    gpu.run_kernel("MUL_MAT", 1e5, 0, phase="prefill")  # at 100 MHz, 0.5 V
    # static 0.05 * 0.5^3 = 6.25 mW; dynamic 1e-9 * 0.25 * 1e8 = 25 mW -> 31.25 uJ
    assert gpu.energy_by_phase_j["prefill"] == pytest.approx(31.25e-6)
    gpu.set_hz(200_000_000)
    gpu.run_gap(1 * MS, kind="submit", phase="decode")  # switch lands at the end
    gpu.run_kernel("MUL_MAT", 2e5, 0, phase="decode")  # 1 ms at 200 MHz, 1 V
    # idle at 100 MHz: 6.25 mW + 0.2 * 25 mW = 11.25 uJ; busy 0.05 + 0.2 W = 250 uJ
    assert gpu.energy_by_phase_j["decode"] == pytest.approx(11.25e-6 + 250e-6)
    assert gpu.energy_j == pytest.approx(sum(gpu.energy_by_phase_j.values()))
    assert sum(iv[5] for iv in gpu.intervals) == pytest.approx(gpu.energy_j)
    assert [iv[3] for iv in gpu.intervals] == ["busy", "idle", "busy"]


def test_slumber_after_idle_timeout() -> None:
    gpu = SimGpu(toy_profile(idle_timeout_ns=1 * MS))
    gpu.run_gap(3 * MS, kind="idle", phase="idle")
    # 1 ms clock-gated idle at 0.07 W, then 2 ms slumber at 1 mW
    assert gpu.energy_j == pytest.approx(70e-6 + 2e-6)


def test_lower_clock_saves_energy_on_memory_bound_work() -> None:
    def run(hz: int) -> tuple[float, int]:
        gpu = SimGpu(
            dataclasses.replace(load_profile("adreno650"), bus_coupling=0.0), governor=None
        )
        gpu.set_hz(hz)
        gpu.advance_to(gpu.capabilities.switch_latency_ns)
        t0, e0 = gpu.now_ns(), gpu.energy_j
        for _ in range(100):
            gpu.run_kernel("MUL_MAT", 1e5, 5e6, phase="decode")
        return gpu.energy_j - e0, gpu.now_ns() - t0

    e_hi, t_hi = run(670_000_000)
    e_lo, t_lo = run(305_000_000)
    assert t_lo == pytest.approx(t_hi, rel=0.01)
    assert e_lo < 0.6 * e_hi


# ---- switch latency ----------------------------------------------------------------


def test_frequency_change_applies_after_switch_latency() -> None:
    gpu = SimGpu(toy_profile())
    gpu.advance_to(5 * MS)
    gpu.set_hz(200_000_000)
    gpu.advance_to(6 * MS - 1)
    assert gpu.current_hz() == 100_000_000
    gpu.advance_to(6 * MS)
    assert gpu.current_hz() == 200_000_000
    assert gpu.switches == 1 and gpu.switch_log == [(6 * MS, 200_000_000)]


def test_switch_landing_mid_kernel_speeds_up_the_rest() -> None:
    gpu = SimGpu(toy_profile())
    gpu.set_hz(200_000_000)  # lands at 1 ms
    # 3e5 ops: 1 ms at 100 MHz does 1e5, the remaining 2e5 take 1 ms at 200 MHz
    assert gpu.run_kernel("MUL_MAT", 3e5, 0, phase="decode") == 2 * MS


def test_thermal_path_latency() -> None:
    gpu = SimGpu(toy_profile(), switch_path="thermal")
    assert gpu.capabilities.switch_latency_ns == 80 * MS
    gpu.set_hz(200_000_000)
    gpu.advance_to(79 * MS)
    assert gpu.current_hz() == 100_000_000
    gpu.advance_to(80 * MS)
    assert gpu.current_hz() == 200_000_000


# ---- governors ---------------------------------------------------------------------


def busy_pattern(gpu: SimGpu, busy_ns: int, gap_ns: int, until_ns: int) -> None:
    """Compute-bound kernels of ``busy_ns`` at the current clock, each followed by a gap."""
    p = gpu.profile
    while gpu.now_ns() < until_ns:
        ops = busy_ns * 1e-9 * p.peak_ops_per_cycle * p.compute_efficiency * gpu.current_hz()
        gpu.run_kernel("MUL_MAT", ops, 0, phase="decode")
        if gap_ns:
            gpu.run_gap(gap_ns, kind="inter_kernel", phase="decode")


def test_adreno_tz_steps_up_once_per_call_interval_when_busy() -> None:
    gpu = SimGpu("adreno650")
    busy_pattern(gpu, 1 * MS, 0, 120 * MS)
    assert gpu.current_hz() == 670_000_000
    hz = [h for _, h in gpu.switch_log]
    assert hz == list(gpu.frequencies_hz()[1:])  # one level at a time
    times = [t for t, _ in gpu.switch_log]
    assert all(b - a >= gpu.profile.tz_call_interval_ns for a, b in itertools.pairwise(times))


def test_adreno_tz_long_busy_jumps_to_top() -> None:
    gpu = SimGpu("adreno650")
    gpu.run_kernel("MUL_MAT", 1e12, 0, phase="prefill")  # far above 50 ms busy
    gpu.advance_to(gpu.now_ns() + 1 * MS)
    assert gpu.switch_log[-1][1] == 670_000_000
    assert len(gpu.switch_log) == 1


def test_adreno_tz_steps_down_when_mostly_idle() -> None:
    gpu = SimGpu("adreno650")
    gpu.set_hz(670_000_000)
    gpu.set_range(305_000_000, 670_000_000)  # unpin: the governor rules again
    gpu.advance_to(1 * MS)
    busy_pattern(gpu, 1 * MS, 9 * MS, 200 * MS)  # 10% busy: 9 ms idle per window
    # one level down per 5 decisions (laziness), decisions every 10 ms
    assert gpu.current_hz() < 670_000_000
    busy_pattern(gpu, 1 * MS, 9 * MS, 400 * MS)
    assert gpu.current_hz() == 305_000_000
    times = [t for t, _ in gpu.switch_log[1:]]
    assert all(b - a >= 5 * gpu.profile.tz_call_interval_ns for a, b in itertools.pairwise(times))


def test_adreno_tz_waits_for_min_busy() -> None:
    gpu = SimGpu("adreno650")
    gpu.set_hz(670_000_000)
    gpu.set_range(305_000_000, 670_000_000)
    gpu.advance_to(1 * MS)
    busy_pattern(gpu, MS // 10, 20 * MS, 150 * MS)  # 0.1 ms busy per 20 ms
    assert gpu.governor_decisions == 0  # under 1 ms busy accumulated: no decision yet
    busy_pattern(gpu, MS // 10, 20 * MS, 260 * MS)
    assert gpu.governor_decisions == 1  # 1 ms reached: one decision


def test_adreno_tz_keeps_top_through_short_stalls() -> None:
    """The paper's point: default DVFS cannot see ms-scale stalls."""
    gpu = SimGpu("adreno650")
    busy_pattern(gpu, 5 * MS, 5 * MS, 300 * MS)  # half the time stalled, 5 ms at a time
    assert gpu.current_hz() == 670_000_000


def test_simple_ondemand_rules() -> None:
    gpu = SimGpu("generic", governor="simple_ondemand")  # polls every 50 ms, starts 350 MHz
    busy_pattern(gpu, 1 * MS, 1 * MS, 50 * MS)  # 50% busy
    gpu.advance_to(51 * MS)
    # target = 50% * 350 MHz * 100 / (90 - 5 // 2) = 198.9 MHz -> lowest level above: 200
    assert gpu.current_hz() == 200_000_000

    gpu = SimGpu("generic", governor="simple_ondemand")
    busy_pattern(gpu, 1 * MS, 0, 50 * MS)  # 100% busy > 90%: straight to max
    gpu.advance_to(51 * MS)
    assert gpu.current_hz() == 800_000_000

    gpu = SimGpu("generic", governor="simple_ondemand")
    busy_pattern(gpu, 875_000, 125_000, 50 * MS)  # 87.5% busy: inside 85..90, keep
    gpu.advance_to(51 * MS)
    assert gpu.current_hz() == 350_000_000


def test_simple_ondemand_timer_phase_moves_the_first_poll() -> None:
    """``governor_phase_ns``: the first poll comes that much sooner, its window begun a
    whole period before it, the GPU idle before the start."""
    gpu = SimGpu("generic", governor="simple_ondemand", governor_phase_ns=30 * MS)
    busy_pattern(gpu, 1 * MS, 0, 20 * MS)  # busy from the start to the poll at 20 ms
    gpu.advance_to(25 * MS)
    assert gpu.governor_decisions == 1
    # 20 of the window's 50 ms busy (40%): 350 MHz * 0.4 * 100 / 87.5 = 160 -> 200 MHz
    assert gpu.current_hz() == 200_000_000

    same = SimGpu("generic", governor="simple_ondemand")  # phase 0: a period after start
    busy_pattern(same, 1 * MS, 0, 20 * MS)
    same.advance_to(25 * MS)
    assert same.governor_decisions == 0 and same.current_hz() == 350_000_000

    whole = SimGpu("generic", governor="simple_ondemand", governor_phase_ns=50 * MS)
    busy_pattern(whole, 1 * MS, 0, 50 * MS)  # a whole period is phase 0
    whole.advance_to(51 * MS)
    assert whole.governor_decisions == 1 and whole.current_hz() == 800_000_000
    with pytest.raises(ValueError, match="governor_phase_ns"):
        SimGpu("generic", governor_phase_ns=-1)


def test_simple_ondemand_drops_to_bottom_when_idle() -> None:
    gpu = SimGpu("generic", governor="simple_ondemand")
    gpu.run_gap(200 * MS, kind="idle", phase="idle")
    assert gpu.current_hz() == 200_000_000


def test_unknown_governor_lists_choices() -> None:
    with pytest.raises(ValueError, match="msm-adreno-tz"):
        SimGpu("generic", governor="ondemand")


def test_pinned_clock_holds_under_governor() -> None:
    gpu = SimGpu("adreno650")
    gpu.set_hz(400_000_000)
    busy_pattern(gpu, 1 * MS, 0, 100 * MS)
    assert gpu.current_hz() == 400_000_000


# ---- PMU and counters --------------------------------------------------------------


def test_instructions_follow_work_and_noise_is_seeded() -> None:
    gpu = SimGpu("adreno650")
    gpu.run_kernel("MUL_MAT", 1e6, 1e4, phase="decode")
    p = gpu.profile
    assert gpu.read_counters().instructions == int(
        1e6 * p.instructions_per_op + 1e4 * p.instructions_per_byte
    )

    def noisy(seed: int) -> list[int]:
        g = SimGpu("adreno650", pmu_noise=0.05, seed=seed)
        out = []
        for _ in range(200):
            g.run_kernel("MUL_MAT", 1e6, 0, phase="decode")
            out.append(g.instructions)
        return out

    assert noisy(1) == noisy(1)
    assert noisy(1) != noisy(2)
    assert noisy(1)[-1] == pytest.approx(200 * 1e6 * p.instructions_per_op, rel=0.02)


def test_counters_and_cycles() -> None:
    gpu = SimGpu(toy_profile())
    gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode")
    gpu.run_gap(1 * MS, kind="sample", phase="decode")
    c = gpu.read_counters()
    assert (c.ts_ns, c.busy_ns, c.total_ns, c.freq_hz) == (2 * MS, 1 * MS, 2 * MS, 100_000_000)
    assert gpu.busy_cycles == pytest.approx(1e5)
    assert gpu.alwayson_cycles == int(2e-3 * gpu.profile.alwayson_hz)


# ---- batch path vs the per-kernel reference ---------------------------------------


def _kernels(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A decode-graph-like mix: memory-bound mat-vecs, small element-wise ops, gaps."""
    flops = rng.choice([2e4, 3e5, 2e7], size=n) * rng.uniform(0.5, 1.5, size=n)
    bytes_ = rng.choice([4e3, 6e4, 3e6], size=n) * rng.uniform(0.5, 1.5, size=n)
    gaps = rng.choice([0, 5_000, 40_000], size=n, p=[0.6, 0.3, 0.1]).astype(np.int64)
    return flops, bytes_, gaps


def _per_kernel(gpu: SimGpu, f, b, g, phase: str) -> None:
    for fi, bi, gi in zip(f, b, g, strict=True):
        gpu.run_gap(int(gi), kind="inter_kernel", phase=phase)
        gpu.run_kernel("X", float(fi), float(bi), phase=phase)


def _scenario(gpu: SimGpu, batched: bool, seed: int, switches: bool) -> None:
    """Graphs of 300 kernels with sample stalls between them; with ``switches``, the
    caller sets the clock at fixed virtual instants (splitting kernels as replay does)."""
    rng = np.random.default_rng(seed)
    levels = gpu.frequencies_hz()
    plan = (
        [
            (int(t), levels[int(k)])
            for t, k in zip(
                np.cumsum(rng.uniform(0.3, 4.0, size=200) * MS),
                rng.integers(0, len(levels), 200),
                strict=True,
            )
        ]
        if switches
        else []
    )
    for graph in range(12):
        f, b, g = _kernels(rng, 300)
        phase = "prefill" if graph == 0 else "decode"
        if batched:
            i = 0
            while i < len(f):
                stop = next((t for t, _ in plan if t > gpu.now_ns()), None)
                res = gpu.run_batch(f[i:], b[i:], g[i:], phase=phase, stop_at_ns=stop)
                i += res.n_done
                if i < len(f):
                    g = g.copy()
                    f, b = f.copy(), b.copy()
                    g[i] = res.gap_left_ns
                    f[i] *= res.work_left
                    b[i] *= res.work_left
                hz = next((h for t, h in reversed(plan) if t <= gpu.now_ns()), None)
                if hz is not None and stop is not None and gpu.now_ns() >= stop:
                    gpu.set_hz(hz)
        else:
            for fi, bi, gi in zip(f, b, g, strict=True):
                # the same switch instants, applied the way replay does
                end_gap = gpu.now_ns() + int(gi)
                while True:
                    stop = next((t for t, _ in plan if t > gpu.now_ns()), None)
                    if stop is None or stop > end_gap:
                        gpu.run_gap(end_gap - gpu.now_ns(), kind="inter_kernel", phase=phase)
                        break
                    gpu.run_gap(stop - gpu.now_ns(), kind="inter_kernel", phase=phase)
                    gpu.set_hz(next(h for t, h in plan if t == stop))
                    if stop == end_gap:
                        break
                left = 1.0
                while left > 0:
                    now = gpu.now_ns()
                    full = gpu.kernel_ns(fi * left, bi * left)
                    stop = next((t for t, _ in plan if t > now), None)
                    floor = gpu.profile.kernel_floor_ns
                    if stop is not None and now + floor < stop < now + full - max(1_000, floor):
                        frac = left * (stop - now) / full
                        gpu.run_kernel("X", fi * frac, bi * frac, phase=phase)
                        left -= frac
                        if gpu.now_ns() >= stop:  # else a switch landing sped it up
                            gpu.set_hz(next(h for t, h in plan if t == stop))
                    else:
                        gpu.run_kernel("X", fi * left, bi * left, phase=phase)
                        left = 0.0
                        stop2 = next((t for t, _ in plan if t <= gpu.now_ns() and t > now), None)
                        if stop2 is not None:
                            gpu.set_hz(next(h for t, h in plan if t == stop2))
        gpu.run_gap(int(rng.choice([2 * MS, 9 * MS, 70 * MS])), kind="sample", phase=phase)


@pytest.mark.parametrize(
    ("profile", "governor", "switches"),
    [
        ("adreno650", "default", False),
        ("adreno640", "default", False),
        ("mali-g76", "default", False),
        ("generic", "msm-adreno-tz", False),
        ("adreno650", None, True),
        ("mali-g76", None, True),
    ],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_run_batch_matches_the_per_kernel_path(profile, governor, switches, seed) -> None:
    ref = SimGpu(profile, governor=governor)
    fast = SimGpu(profile, governor=governor)
    _scenario(ref, batched=False, seed=seed, switches=switches)
    _scenario(fast, batched=True, seed=seed, switches=switches)
    assert fast.now_ns() == pytest.approx(ref.now_ns(), rel=5e-3)
    assert fast.energy_j == pytest.approx(ref.energy_j, rel=5e-3)
    for ph in ref.energy_by_phase_j:
        assert fast.energy_by_phase_j[ph] == pytest.approx(ref.energy_by_phase_j[ph], rel=5e-3)
    assert fast.busy_ns == pytest.approx(ref.busy_ns, rel=5e-3)
    assert fast.instructions == pytest.approx(ref.instructions, rel=5e-3)
    assert abs(fast.switches - ref.switches) <= max(2, 0.02 * ref.switches)
    if governor == "default":
        assert ref.governor_decisions > 5  # the governor really acted
        assert ref.switches > 0


def test_run_batch_stops_at_the_instant_and_splits_like_replay() -> None:
    gpu = SimGpu(toy_profile())
    f = np.array([1e5, 1e5, 1e5])  # 1 ms each at 100 MHz
    g = np.array([0, 500_000, 0])
    res = gpu.run_batch(f, np.zeros(3), g, phase="decode", stop_at_ns=1_250_000)
    assert (res.n_done, res.gap_left_ns, res.work_left) == (1, 250_000, 1.0)
    assert gpu.now_ns() == 1_250_000 and list(res.end_ns) == [1 * MS]
    res = gpu.run_batch(
        f[1:], np.zeros(2), np.array([250_000, 0]), phase="decode", stop_at_ns=2_000_000
    )
    assert res.n_done == 0 and res.gap_left_ns == 0
    assert res.work_left == pytest.approx(0.5)
    assert gpu.now_ns() == 2 * MS
    with pytest.raises(ValueError, match="one entry per kernel"):
        gpu.run_batch(f, np.zeros(2), g, phase="decode")


# ---- phone host model, wake-up, switch cost ----------------------------------------


def test_host_gaps_vulkan_batches_and_opencl_per_kernel() -> None:
    vk = load_profile("adreno650")
    gaps = vk.host_gaps_ns(250)
    assert vk.submit_batch_nodes == 100
    assert list(np.flatnonzero(gaps)) == [0, 100, 200]
    assert gaps[0] == 100 * vk.host_enqueue_ns + vk.submit_flush_ns
    assert gaps[200] == 50 * vk.host_enqueue_ns + vk.submit_flush_ns
    cl = load_profile("generic")
    assert cl.submit_batch_nodes == 1
    assert list(cl.host_gaps_ns(3)) == [cl.host_enqueue_ns] * 3
    assert vk.scale_host_ns(1_000_000) == round(1_000_000 * vk.host_cpu_factor)
    assert len(vk.host_gaps_ns(0)) == 0


def test_wakeup_after_slumber_delays_the_kernel() -> None:
    gpu = SimGpu(toy_profile(idle_timeout_ns=1 * MS, wakeup_ns=300_000))
    gpu.run_gap(5 * MS, kind="idle", phase="idle")
    took = gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode")
    assert took == 1 * MS + 300_000 and gpu.wakeups == 1
    # no slumber, no wake-up
    assert gpu.run_kernel("MUL_MAT", 1e5, 0, phase="decode") == 1 * MS


def test_switch_energy_and_minimum_dwell_apply_to_every_request() -> None:
    gpu = SimGpu(toy_profile(switch_energy_j=1e-3, min_dwell_ns=5 * MS))
    gpu.set_hz(200_000_000)  # lands at 1 ms
    gpu.advance_to(2 * MS)
    e0 = gpu.energy_j
    gpu.set_hz(100_000_000)  # latency says 3 ms, the dwell says 6 ms
    gpu.advance_to(5_999_999)
    assert gpu.current_hz() == 200_000_000
    gpu.advance_to(6 * MS)
    assert gpu.current_hz() == 100_000_000
    assert gpu.switch_log == [(1 * MS, 200_000_000), (6 * MS, 100_000_000)]
    assert gpu.switch_energy_j == pytest.approx(2e-3)
    idle = gpu.profile.power_w(200_000_000, "idle") * 4e-3
    assert gpu.energy_j - e0 == pytest.approx(idle + 1e-3)


def test_dram_energy_per_byte() -> None:
    gpu = SimGpu(toy_profile(dram_energy_j_per_byte=1e-10))
    gpu.run_kernel("ADD", 0, 1e6, phase="decode")  # 1 ms at 1 GB/s
    busy = gpu.profile.power_w(100_000_000, "busy") * 1e-3
    assert gpu.energy_j == pytest.approx(busy + 1e-4)
    assert gpu.dram_energy_j == pytest.approx(1e-4)


# ---- close -------------------------------------------------------------------------


def test_close_restores_governor_and_range() -> None:
    gpu = SimGpu("adreno650")
    gpu.governor = None
    gpu.set_hz(670_000_000)
    gpu.close()
    assert gpu.governor == "msm-adreno-tz"
    state = gpu.snapshot()
    assert (state.min_hz, state.max_hz, state.extra["pin_hz"]) == (305_000_000, 670_000_000, None)
    gpu.close()  # idempotent
    with pytest.raises(DeviceGone):
        gpu.set_hz(400_000_000)


def test_background_schedule_changes_the_share_mid_run_on_both_paths() -> None:
    rng = np.random.default_rng(3)
    f, b, g = _kernels(rng, 2000)
    sched = [(5 * MS, 0.4), (100 * MS, 0.0)]
    ref = SimGpu("adreno650", governor=None, background_schedule=sched)
    _per_kernel(ref, f, b, g, "decode")
    fast = SimGpu("adreno650", governor=None, background_schedule=sched)
    fast.run_batch(f, b, g, phase="decode")
    quiet = SimGpu("adreno650", governor=None)
    quiet.run_batch(f, b, g, phase="decode")
    assert fast.now_ns() == pytest.approx(ref.now_ns(), rel=1e-4)
    assert fast.energy_j == pytest.approx(ref.energy_j, rel=1e-4)
    assert fast.now_ns() > quiet.now_ns() * 1.02  # the 40% load slowed memory-bound work
    assert fast.background_share == 0.0  # and it ended
    with pytest.raises(ValueError, match="background_schedule"):
        SimGpu("adreno650", background_schedule=[(0, 1.0)])
