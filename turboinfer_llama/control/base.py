"""The controller interface every policy and baseline implements.

Controllers are causal: ``on_event`` sees events in time order and nothing after
``now``. Only the oracle (which is given the whole trace at construction, and sets
``offline``) may look ahead. Frequencies are Hz; times are on the clock of the run
(monotonic ns live, virtual ns in replay).

What a controller gets is the same live and in replay (``control/governor.py``,
``control/replay.py``): the engine's Python events through ``on_event``, and after
each ``llama_decode`` that graph's node records as one ``GraphBatch`` through
``on_graph`` (with the switches the executor applied first, through ``on_applied``,
and device counters through ``on_counters``). It answers with ``Decision``s
(switch now, or at a time) or ``Plan``s (switches inside the next graph, executed
natively without Python). Only offline controllers receive per-node events.

``on_event`` gets the kinds its controller's ``event_kinds`` names, of
:data:`CONTROLLER_EVENTS`: request boundaries, prefill boundaries and each decode's
begin and end. The per-token marks (``TOKEN``,
``SAMPLE_BEGIN``/``SAMPLE_END``, ``KV_EDIT``) go to the timeline and trace only: no
controller acts on them, and each cost the engine thread ~5 us between two decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..engine.events import Event, EventKind

if TYPE_CHECKING:
    from .graph_batch import GraphBatch
    from .plan import Plan


# What on_event may be given, live (the session) and in replay, as each controller's
# event_kinds asks; per-node events besides, in replay, for offline controllers only
CONTROLLER_EVENTS = frozenset(
    {
        EventKind.REQUEST_BEGIN,
        EventKind.REQUEST_END,
        EventKind.IDLE,
        EventKind.PREFILL_BEGIN,
        EventKind.PREFILL_END,
        EventKind.DECODE_BEGIN,
        EventKind.DECODE_END,
    }
)


@dataclass(frozen=True, slots=True)
class Decision:
    """Set the clock to ``freq_hz`` at ``at_ns`` (``at_ns`` <= now means at once)."""

    freq_hz: int
    at_ns: int
    reason: str = ""


class Controller(Protocol):
    """What the live loop (``governor.Governor``) and replay call. The optional parts
    are attributes too, None where a controller has none (``ControllerDefaults`` gives
    every default): nothing is probed for."""

    name: str
    # True: the device's own governor runs (the controller only observes)
    uses_device_governor: bool
    # True: reads the whole trace (hindsight); replay gives it per-node events
    offline: bool
    # the event kinds on_event acts on: live and in replay it is given those only
    # (of CONTROLLER_EVENTS; an offline controller may name per-node and sample events,
    # which replay alone gives). Each kind left out saves the engine thread a call
    # between two decodes.
    event_kinds: frozenset[EventKind]

    @property
    def on_graph(self) -> Callable[[GraphBatch], Plan | None] | None:
        """Per-graph learning and planning: one finished graph's records, answered
        with the plan for the next graph (None: the controller plans from events)."""

    @property
    def on_applied(self) -> Callable[[list[tuple[int, int]]], None] | None:
        """The switches the executor applied since the last call: ``(t_ns, level)``."""

    @property
    def on_counters(self) -> Callable[[Any], None] | None:
        """Device counters read after a graph (``devices.base.Counters``)."""

    @property
    def reseed(self) -> Callable[[int], None] | None:
        """A new seed, for a controller that learns with randomness (replay's ``seed``)."""

    def on_event(self, event: Event) -> Decision | Plan | None:
        """React to one engine event; return a decision, a plan, or None."""
        ...

    def plan(self, now_ns: int) -> list[Decision]:
        """Decisions scheduled for the future, as known at ``now_ns`` (timer path)."""
        ...


class ControllerDefaults:
    """The protocol's defaults, for a controller to inherit and override: it steers
    (does not leave the device's governor on), reads no trace, takes every controller
    event, and has none of the optional parts."""

    uses_device_governor: bool = False
    offline: bool = False
    event_kinds: frozenset[EventKind] = CONTROLLER_EVENTS
    on_graph: Callable[[GraphBatch], Plan | None] | None = None
    on_applied: Callable[[list[tuple[int, int]]], None] | None = None
    on_counters: Callable[[Any], None] | None = None
    reseed: Callable[[int], None] | None = None
