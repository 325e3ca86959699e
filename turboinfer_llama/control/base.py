"""The controller interface every policy and baseline implements.

Controllers are causal: ``on_event`` sees events in time order and nothing after
``now``. Only the oracle (which is given the whole trace at construction) may look
ahead. Frequencies are Hz; times are on the clock of the run (monotonic ns live,
virtual ns in replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..engine.events import Event


@dataclass(frozen=True, slots=True)
class Decision:
    """Set the clock to ``freq_hz`` at ``at_ns`` (``at_ns`` <= now means at once)."""

    freq_hz: int
    at_ns: int
    reason: str = ""


class Controller(Protocol):
    name: str

    def on_event(self, event: Event) -> Decision | None:
        """React to one engine event; return a frequency decision or None."""
        ...

    def plan(self, now_ns: int) -> list[Decision]:
        """Decisions scheduled for the future, as known at ``now_ns`` (timer path)."""
        ...
