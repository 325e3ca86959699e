"""A frequency plan for one graph: the one definition shared by the native executor
(``hooks/ti_exec.c``), its Python model (``control.executor_model``) and replay.

Why a plan and not per-node decisions: live, the controller runs in Python between
``llama_decode`` calls, while the switches must land inside the decode, where Python
cannot run. So the controller hands the executor a short list of switches for the next
graph, and the executor fires them without the GIL.

Anchors (``Switch.anchor``):

* ``NODE``: fire when the eval callback sees the ask of node ordinal ``key`` (0 = the
  graph's first node). Only meaningful where the callback sees node boundaries during
  compute (``layer`` and ``kernel`` granularity); at ``graph`` granularity all asks come
  at the scan, so plans there use ``OFFSET``.
* ``OFFSET``: fire ``key`` ns after the graph's first ask (its compute start), on the
  executor's timer thread.
* ``TIME``: fire at the absolute monotonic time ``key`` ns (``_clock.now_ns``), on the
  timer thread. Used for the raise inside the sampling/submit stall before the graph,
  when the plan is set after the previous graph ended.

A switch with ``level < 0`` is a checkpoint: it changes nothing, it only carries the
nominal elapsed time ``expect_ns`` (from the graph's first ask) at that node, for the
feedback rule. Levels index ``levels_hz`` (ascending, 0 = slowest).

Executor semantics (native and model alike):

1. ``set_plan`` stores the plan as *pending*; it never blocks the engine.
2. At a graph's first ask, the pending plan (if its ``graph`` is 0 or this graph's
   sequence number) becomes *active*: ``first_level`` is applied at once, ``t0`` = now.
   If no plan is pending, the previous plan's ``fallback_level`` is applied (when
   ``>= 0``) and the graph runs with no switches (a late plan; counted).
   A plan that arrives while its graph is already running is *late*: it becomes active
   at once with ``t0`` = that graph's first ask; switches whose time or node has passed
   are collapsed into one switch to the latest of their levels, applied at once.
3. ``NODE`` switches fire at the ask of node ``key`` (or the first ask after it). If
   the graph has more nodes than ``n_nodes`` (a different graph), the remaining
   ``NODE`` switches fall back to their ``expect_ns`` as offsets, and a mismatch is
   counted; a graph that ends with fewer nodes also counts one.
4. ``OFFSET`` switches fire when due on the timer thread once the plan is active.
   ``TIME`` switches are armed as soon as the plan is set (they may fall before its
   graph starts: the raise inside the stall); one whose time has passed fires at once.
   A later ``set_plan`` replaces the armed ``TIME`` switches that have not fired.
5. Feedback uses checkpoints only (``level < 0``): at each observed node completion
   (``layer``/``kernel`` granularity) of node ``j``, the latest checkpoint with
   ``key <= j`` gives ``err = (now - t0) - expect_ns - margin_ns``; when ``err > 0``
   the level becomes ``min(top, planned + ceil(gain * err / predicted_ns))`` if that
   is higher than the level in effect (``planned`` = the level the plan has in effect
   at that node), and it is a floor for the rest of the graph's switches (not for
   ``end_level``). Each checkpoint is used at most once.
6. ``graph_end`` (called from Python right after ``llama_decode`` returns) applies
   ``end_level`` when ``>= 0`` and deactivates the plan's remaining ``NODE``/``OFFSET``
   switches; its ``TIME`` switches stay armed.
7. An actuator error stops the executor: no further switch is applied, the error is
   reported, Python restores the device.
8. Repeated switches to the level already in effect are skipped (not logged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Anchor(IntEnum):
    NODE = 0
    OFFSET = 1
    TIME = 2


@dataclass(frozen=True, slots=True)
class Switch:
    """Set the clock to ``levels_hz[level]`` at ``key`` (see ``Anchor``); ``level < 0``
    is a checkpoint. ``expect_ns``: nominal elapsed time from the graph's first ask at
    this point (-1 when unknown)."""

    anchor: Anchor
    key: int
    level: int
    expect_ns: int = -1


@dataclass(frozen=True, slots=True)
class Plan:
    """Switches for one graph (see the module docstring for the semantics)."""

    graph: int = 0  # graph sequence number this plan is for; 0 = the next graph
    first_level: int = -1  # applied at the graph's first ask; -1 = keep
    end_level: int = -1  # applied at graph_end; -1 = keep
    fallback_level: int = -1  # for a later graph that starts with no plan; -1 = keep
    n_nodes: int = 0  # node count the plan was built for; 0 = unknown
    predicted_ns: int = 0  # nominal compute time of the graph, first ask to last node
    margin_ns: int = 0  # feedback dead band
    gain: float = 0.0  # feedback gain; 0 = no feedback
    switches: tuple[Switch, ...] = field(default_factory=tuple)

    MAX_SWITCHES = 256  # TI_PLAN_MAX in hooks/ti_exec.h

    def __post_init__(self) -> None:
        if len(self.switches) > self.MAX_SWITCHES:
            raise ValueError(f"a plan holds at most {self.MAX_SWITCHES} switches")


@dataclass(frozen=True, slots=True)
class Applied:
    """One switch the executor applied (its log record)."""

    t_ns: int  # when the actuator call started
    level: int
    freq_hz: int
    cost_ns: int  # how long the actuator call took
    source: str  # "first" | "node" | "timer" | "feedback" | "end" | "fallback" | "now"
    graph: int
    node: int  # node ordinal for node-keyed and feedback switches, else -1
    # a timer switch's deadline (its lateness is t_ns - due_ns); -1 for other sources
    due_ns: int = -1
