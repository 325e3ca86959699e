"""Baselines behind one interface; the oracle bounds every causal controller."""

import dataclasses

import pytest

from turboinfer_llama.control.baselines.oracle import Oracle
from turboinfer_llama.control.factory import CONTROLLER_NAMES, for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.base import InvalidFrequency
from turboinfer_llama.devices.sim import SimGpu, load_profile

LEVELS = SimGpu().frequencies_hz()


@pytest.fixture(scope="module")
def trace():
    return make_trace(requests=1, decode_tokens=8, prompt_tokens=8, seed=3)


def test_unknown_controller_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        make_controller("turbo", device_levels_hz=LEVELS)
    for name in CONTROLLER_NAMES:
        assert name in str(e.value)


def test_static_needs_a_level_of_the_device():
    with pytest.raises(InvalidFrequency, match="levels: 305000000"):
        make_controller("static:300000000", device_levels_hz=LEVELS)
    with pytest.raises(ValueError, match="number of Hz"):
        make_controller("static:fast", device_levels_hz=LEVELS)
    assert make_controller("static:490000000", device_levels_hz=LEVELS).freq_hz == 490_000_000


def test_oracle_is_offline_and_says_what_it_needs():
    with pytest.raises(ValueError, match="trace="):
        make_controller("oracle", device_levels_hz=LEVELS)


def test_every_name_builds_a_controller(trace):
    for name in ("tmpc", "default", "max", "static:490000000", "reactive", "ztt"):
        ctl = make_controller(name, **for_device(SimGpu()))
        assert hasattr(ctl, "on_event") and hasattr(ctl, "plan")


@pytest.mark.parametrize("name", ["tmpc", "reactive", "ztt", "static:490000000", "default"])
def test_oracle_is_never_beaten_at_equal_latency(trace, name):
    ctl = make_controller(name, **for_device(SimGpu()))
    res = replay(trace, ctl, SimGpu(), seed=0)
    # the oracle, held to exactly this controller's time in every phase
    oracle = Oracle(
        trace, SimGpu, budgets_ns={k: float(v) for k, v in res.time_by_phase_ns.items()}
    )
    got = replay(trace, oracle, SimGpu(), seed=0)
    for phase, ns in res.time_by_phase_ns.items():
        assert got.time_by_phase_ns[phase] <= ns * 1.001
    assert got.energy_j <= res.energy_j * 1.002


def test_reactive_loses_to_tmpc_when_switches_are_slow_compared_with_stalls():
    # switches of 2 ms against sampling stalls of 3 ms: reacting lands too late
    slow = dataclasses.replace(load_profile("adreno650"), switch_latency_direct_ns=2_000_000)
    trace = make_trace(requests=1, decode_tokens=12, prompt_tokens=8, seed=4)
    out = {}
    for name in ("reactive", "tmpc"):
        dev = SimGpu(slow)
        out[name] = replay(trace, make_controller(name, **for_device(dev)), dev, seed=0)
    assert out["tmpc"].energy_j < out["reactive"].energy_j
