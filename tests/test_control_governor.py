"""Governor: inline fast path, timed decisions, and safe fallback when the device fails."""

import logging

from turboinfer_llama.control.base import Decision
from turboinfer_llama.control.governor import Governor
from turboinfer_llama.devices.base import Capabilities, Counters, DeviceGone, DeviceState
from turboinfer_llama.engine.events import Event, EventKind

LEVELS = [305_000_000, 490_000_000, 670_000_000]


class FakeGpu:
    """A GpuDevice that records calls and can be told to vanish."""

    name = "fake"
    capabilities = Capabilities(True, False, True, 500_000)

    def __init__(self, *, fail_after=None, restore_fails=False):
        self.hz = LEVELS[0]
        self.set_calls = []
        self.restored = []
        self.fail_after = fail_after
        self.restore_fails = restore_fails
        self.state = DeviceState("msm-adreno-tz", LEVELS[0], LEVELS[-1])

    def frequencies_hz(self):
        return list(LEVELS)

    def current_hz(self):
        return self.hz

    def set_hz(self, hz):
        if self.fail_after is not None and len(self.set_calls) >= self.fail_after:
            raise DeviceGone("fake GPU unplugged")
        self.set_calls.append(hz)
        self.hz = hz
        return hz

    def set_range(self, lo, hi):
        pass

    def read_counters(self):
        return Counters(0, 0, 0, None, self.hz)

    def snapshot(self):
        return self.state

    def restore(self, state):
        if self.restore_fails:
            raise OSError("write error")
        self.restored.append(state)

    def close(self):
        pass


class Scripted:
    """Raises at every graph start; drops at graph end and plans a raise 1 ms later."""

    name = "scripted"

    def __init__(self):
        self._plan = []

    def on_event(self, ev):
        if ev.kind is EventKind.DECODE_END:
            self._plan = [Decision(LEVELS[2], ev.t_ns + 1_000_000, "raise")]
            return Decision(LEVELS[0], ev.t_ns, "drop")
        if ev.kind is EventKind.NODE_ASK and ev.node == 0:
            return Decision(LEVELS[1], ev.t_ns, "compute")
        return None

    def plan(self, now_ns):
        return [d for d in self._plan if d.at_ns >= now_ns]


def _events(n_graphs, t0=0):
    t = t0
    for g in range(n_graphs):
        for kind, node in (
            (EventKind.DECODE_BEGIN, -1),
            (EventKind.NODE_ASK, 0),
            (EventKind.NODE_DONE, 0),
            (EventKind.DECODE_END, -1),
            (EventKind.TOKEN, -1),
        ):
            yield Event(kind, t, graph=g, node=node)
            t += 600_000


def test_fast_path_applies_decisions_inline_and_timed_ones_at_the_next_boundary():
    dev = FakeGpu()
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    for ev in _events(2):
        now[0] = ev.t_ns
        gov.on_event(ev)
    gov.close()
    # compute, drop, (raise due 1 ms after graph end, applied at the next boundary), ...
    assert dev.set_calls[:4] == [LEVELS[1], LEVELS[0], LEVELS[2], LEVELS[1]]
    h = gov.health()
    assert h["ok"] and h["events"] == 10 and h["decision_us_median"] is not None
    assert dev.restored == [dev.state]  # close() gives the device back


def test_device_failure_mid_run_falls_back_to_the_default_governor(caplog):
    dev = FakeGpu(fail_after=2)
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    with caplog.at_level(logging.ERROR):
        for ev in _events(4):  # generation keeps going: no exception reaches the engine
            now[0] = ev.t_ns
            gov.on_event(ev)
    h = gov.health()
    assert not h["ok"]
    assert "DeviceGone" in h["error"] and "unplugged" in h["error"]
    assert "restored default governor 'msm-adreno-tz'" in h["fallback"]
    assert dev.restored == [dev.state]
    assert len(dev.set_calls) == 2  # nothing more was written after the failure
    assert h["events"] == 20
    assert "failed" in caplog.text
    gov.close()


def test_failure_of_the_restore_itself_is_reported():
    dev = FakeGpu(fail_after=0, restore_fails=True)
    now = [0]
    gov = Governor(Scripted(), dev, timer=False, clock=lambda: now[0]).start()
    for ev in _events(1):
        now[0] = ev.t_ns
        gov.on_event(ev)
    h = gov.health()
    assert not h["ok"] and h["fallback"].startswith("restore failed: OSError")


def test_timer_thread_applies_a_decision_due_inside_a_stall():
    import time

    dev = FakeGpu()
    dev.hz = LEVELS[1]  # so the drop is a change (a switch to the level in effect is skipped)
    gov = Governor(Scripted(), dev, timer=True).start()  # real monotonic clock
    from turboinfer_llama._clock import now_ns

    gov.on_event(Event(EventKind.DECODE_END, now_ns(), graph=0))
    deadline = time.monotonic() + 2.0
    while LEVELS[2] not in dev.set_calls and time.monotonic() < deadline:
        time.sleep(0.005)
    gov.close()
    assert dev.set_calls[:2] == [LEVELS[0], LEVELS[2]]
