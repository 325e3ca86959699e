"""The clock stand-in (tests and benchmarks only): a graph's CPU work on the host is
stretched to the time it would take at the level the executor applied, and it is
refused wherever a real clock could be behind the actuator.

Timings are compared as ratios within one run (the host is shared): the wait is never
shorter than the work the level still owes, which is the property that makes graph time
follow the clock.
"""

from __future__ import annotations

import time

import pytest

from turboinfer_llama._clock import now_ns
from turboinfer_llama.control.clock_standin import ClockStandIn, standin_rates
from turboinfer_llama.control.plan import Anchor, Plan, Switch
from turboinfer_llama.engine import executor as native_exec
from turboinfer_llama.live import attach
from turboinfer_llama.settings import PowerSettings

LEVELS = [100_000_000, 200_000_000, 400_000_000]  # the top is 4x the bottom
WORK_NS = 30_000_000

native = pytest.mark.skipif(
    not native_exec.EXECUTOR_AVAILABLE, reason="native executor library not built"
)


def _spin(cpu_ns: int) -> int:
    """Burn ``cpu_ns`` of this thread's CPU time; returns the CPU time burnt."""
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < cpu_ns:
        pass
    return time.thread_time_ns() - t0


def test_rates_scale_compute_and_keep_the_memory_share():
    assert standin_rates(LEVELS, 0.0) == pytest.approx([0.25, 0.5, 1.0])
    # half the time does not scale: 0.5 * 4 + 0.5 = 2.5x at the bottom
    assert standin_rates(LEVELS, 0.5) == pytest.approx([1 / 2.5, 1 / 1.5, 1.0])
    with pytest.raises(ValueError):
        standin_rates(LEVELS, 1.0)


def test_python_standin_owes_the_slow_levels_work():
    s = ClockStandIn(LEVELS)
    s.switched(0, now_ns())  # the bottom: a quarter of the top's speed
    s.begin()
    work = _spin(WORK_NS)
    waited = s.wait()
    # the host did the work at the top's speed; at a quarter of it, 3x more is owed
    assert waited >= 0.95 * 3 * work, (waited, work)
    assert waited <= 10 * work, (waited, work)
    s.switched(2, now_ns())
    s.begin()
    work = _spin(WORK_NS)
    assert s.wait() < 0.5 * work  # at the top nothing is owed
    assert s.wait() == -1  # no begin, no wait
    assert s.status()["graphs"] == 2


@native
def test_native_standin_owes_the_slow_levels_work():
    with native_exec.NativeExecutor(LEVELS, native_exec.RecordActuator(), initial_level=0) as ex:
        assert ex.standin_wait() == -1  # off
        ex.enable_standin(0.0)
        ex.standin_begin()
        work = _spin(WORK_NS)
        waited = ex.standin_wait()
        assert waited >= 0.95 * 3 * work, (waited, work)
        assert waited <= 10 * work, (waited, work)
        ex.switch_now(2)
        ex.standin_begin()
        work = _spin(WORK_NS)
        assert ex.standin_wait() < 0.5 * work
        st = ex.standin_status()
        assert st["graphs"] == 2 and st["waited_ns"] >= waited


@native
def test_native_standin_follows_a_switch_during_its_wait():
    """A timed raise to the top lands inside the wait: the rest of the work is done at
    the top's speed, so the wait ends well before the bottom level's 3x."""
    with native_exec.NativeExecutor(LEVELS, native_exec.RecordActuator(), initial_level=0) as ex:
        ex.enable_standin(0.0)
        ex.standin_begin()
        work = _spin(WORK_NS)
        # due a fifth of the work from now (the timer thread fires it)
        ex.set_plan(Plan(switches=(Switch(Anchor.TIME, now_ns() + work // 5, 2),)))
        waited = ex.standin_wait()
        applied = ex.drain_log()
    assert [a.level for a in applied] == [2]
    # owed after the compute: 3/4 of the work at a quarter of the speed (3x the work in
    # wall time); the raise makes the rest go at the top's speed: at least 3/4 of the
    # work in wall time (had it landed at once), well under the bottom's 3x
    assert 0.95 * 0.75 * work <= waited < 2.5 * work, (waited, work)


@native
def test_native_standin_is_refused_for_hardware_actuators(tmp_path):
    values = tuple(str(h) for h in LEVELS)
    hardware = [
        native_exec.KmodActuator("/dev/null"),  # a character device: a real clock
        native_exec.SysfsOneActuator("/dev/null", values),  # not a regular file
    ]
    for act in hardware:
        ex = native_exec.NativeExecutor(LEVELS, act)
        try:
            with pytest.raises(native_exec.ExecutorError, match="fake devices only"):
                ex.enable_standin(0.0)
        finally:
            ex.close()
    fake = tmp_path / "set_freq"
    fake.write_text("100000000")
    with native_exec.NativeExecutor(LEVELS, native_exec.SysfsOneActuator(str(fake), values)) as ex:
        ex.enable_standin(0.25)  # a fake tree: allowed
        with pytest.raises(ValueError):
            ex.enable_standin(1.0)


def test_the_simulated_device_refuses_the_standin():
    """The simulator already scales the recorded timeline by its clock."""
    with pytest.raises(ValueError, match="simulated device"):
        attach(PowerSettings(device="sim:adreno650", clock_standin=True))
