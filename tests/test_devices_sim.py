"""SimGpu: roofline timing, energy integral, switch latency, governor emulations, PMU."""

from __future__ import annotations

import dataclasses
import itertools
import json

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


def test_memory_bound_time_does_not_scale() -> None:
    p = load_profile("adreno650")
    t_lo = p.kernel_ns(1.0, 1e8, p.levels_hz[0])
    t_hi = p.kernel_ns(1.0, 1e8, p.levels_hz[-1])
    assert t_lo == pytest.approx(t_hi, rel=1e-6)
    assert t_hi == pytest.approx(
        1e8 / (p.dram_bandwidth_bytes_per_s * p.memory_efficiency) * 1e9, rel=1e-6
    )


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
        gpu = SimGpu("adreno650", governor=None)
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
