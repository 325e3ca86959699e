"""Shared by the fault tests: a SysfsIO that fails on demand and logs every write, a
controller that switches the clock at every graph and stall, and synthetic events."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from turboinfer_llama.control.base import ControllerDefaults, Decision
from turboinfer_llama.control.governor import Governor
from turboinfer_llama.devices.sysfs_io import LocalSysfs, translate_os_error
from turboinfer_llama.engine.events import Event, EventKind

TOKENS = 40
INJECT_AT_TOKEN = 12


class FaultySysfs(LocalSysfs):
    """``LocalSysfs`` whose writes to paths containing ``fail_match`` raise
    ``fail_errno`` while it is set (root ignores file modes, so faults are injected
    here). Every successful write is logged with the thermal cap in force then."""

    def __init__(self, root: Any, cap_hz: Callable[[str, str], bool] | None = None) -> None:
        super().__init__(root)
        self.fail_errno: int | None = None
        self.fail_match = ""
        self.failures = 0
        self.writes: list[tuple[str, str]] = []
        self.over_cap: list[tuple[str, str]] = []
        self.cap_ok = cap_hz  # (path, value) -> within the thermal cap in force?

    def write(self, path: str, value: str) -> None:
        if self.fail_errno is not None and self.fail_match in path:
            self.failures += 1
            e = OSError(self.fail_errno, os.strerror(self.fail_errno))
            raise translate_os_error(e, path, "write") from e
        if self.cap_ok is not None and not self.cap_ok(path, value):
            self.over_cap.append((path, value))
        self.writes.append((path, value))
        super().write(path, value)


class Switcher(ControllerDefaults):
    """A controller: the top allowed clock when a graph starts, the bottom one in each
    sample stall; it also takes counter readings after each graph."""

    name = "switcher"
    event_kinds = frozenset(EventKind)

    def __init__(self, levels_hz: list[int]) -> None:
        self.hi, self.lo = max(levels_hz), min(levels_hz)
        self.counters: list[Any] = []

    def on_event(self, ev: Event) -> Decision | None:
        if ev.kind is EventKind.DECODE_BEGIN:
            return Decision(self.hi, ev.t_ns, "compute")
        if ev.kind is EventKind.SAMPLE_BEGIN:
            return Decision(self.lo, ev.t_ns, "stall")
        return None

    def plan(self, now_ns: int) -> list[Decision]:
        return []

    def on_counters(self, c: Any) -> None:
        self.counters.append(c)


def events(tokens: int = TOKENS) -> Iterator[Event]:
    """A decode run: per token a graph (begin, 4 nodes, end), a sample stall, a token."""
    t = 1_000_000
    for tok in range(tokens):
        yield Event(EventKind.DECODE_BEGIN, t, graph=tok, n_tokens=1)
        for node in range(4):
            t += 50_000
            yield Event(EventKind.NODE_ASK, t, graph=tok, node=node, op="MUL_MAT")
        t += 50_000
        yield Event(EventKind.DECODE_END, t, graph=tok)
        yield Event(EventKind.SAMPLE_BEGIN, t, graph=tok, token=tok)
        t += 300_000
        yield Event(EventKind.SAMPLE_END, t, graph=tok, token=tok)
        yield Event(EventKind.TOKEN, t, graph=tok, token=tok)


def run(
    device: Any,
    inject: Callable[[], None],
    *,
    tokens: int = TOKENS,
    at: EventKind = EventKind.DECODE_BEGIN,
) -> Governor:
    """Drive ``device`` through a Governor; ``inject()`` runs just before the event
    ``at`` of token ``INJECT_AT_TOKEN`` (default: as its graph begins). Returns the
    governor (not closed). Every event must be taken: the engine never sees the
    device's trouble."""
    clock = [0]
    gov = Governor(Switcher(device.frequencies_hz()), device, timer=False, clock=lambda: clock[0])
    gov.start()
    n = 0
    for ev in events(tokens):
        if (
            ev.kind is at
            and ev.graph == INJECT_AT_TOKEN
            and (at is not EventKind.NODE_ASK or ev.node == 0)
        ):
            inject()
        clock[0] = ev.t_ns
        gov.on_event(ev)  # never raises
        n += 1
    assert gov.events == n == tokens * 9
    return gov
