"""Fixed policies: the device's own governor untouched, and a pinned frequency."""

from __future__ import annotations

from ...engine.events import Event, EventKind
from ..base import ControllerDefaults, Decision


class DefaultGovernor(ControllerDefaults):
    """The device's default governor (msm-adreno-tz / simple_ondemand in simulation),
    untouched: no decisions; the replay and the live governor leave it on."""

    name = "default"
    uses_device_governor = True
    event_kinds: frozenset[EventKind] = frozenset()

    def on_event(self, event: Event) -> Decision | None:
        return None

    def plan(self, now_ns: int) -> list[Decision]:
        return []


class Static(ControllerDefaults):
    """One fixed frequency (``max`` is the top level), set at the first event."""

    def __init__(self, freq_hz: int, name: str | None = None) -> None:
        self.freq_hz = int(freq_hz)
        self.name = name or f"static:{self.freq_hz}"
        self._set = False

    def on_event(self, event: Event) -> Decision | None:
        if self._set:
            return None
        self._set = True
        return Decision(self.freq_hz, event.t_ns, "static")

    def plan(self, now_ns: int) -> list[Decision]:
        return []
