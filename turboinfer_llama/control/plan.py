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

1. ``set_plan`` stores the plan as *pending*; it never blocks the engine. A plan
   marked as solved after a graph (``after_graph``, ``after``) is for the graph after
   the last one begun (``graph_begin``) when it is set (``retarget``): when the
   planner ran while the engine ran a later graph, its ``TIME`` switches are for the
   stall after that graph, armed at its end and moved by the time between the two
   graphs' ends. Such a plan is never late. A pending plan for the begun graph whose
   first ask has not come yet is kept (*claimed*) when a plan for a later graph
   arrives: it still runs its graph.
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

from dataclasses import dataclass, field, replace
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
    # > 0: solved after this graph ended (its first ask at after_t0_ns), for the graph
    # after it; ``graph`` is then ignored (see ``retarget``)
    after_graph: int = 0
    after_t0_ns: int = 0

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


# Live and replay alike (``Governor.HOLD_FOR_ENGINE``, ``replay(hold=...)``). True
# (default): a graph's records are planned while the engine computes the next
# one-token graph (GIL free), not in the engine's Python between decodes, and the plan
# goes to the graph after the one begun (``Plan.after_graph``, ``retarget``): two
# graphs ahead. Planning in the stall holds the GIL the engine's sampling needs for
# the planner's whole run: ~1.1-1.7 ms of host time per gemma token (issue 11's
# overhead). The price is a plan one graph older: simulated, adreno650, 96-token
# recording, tmpc saves 16.2% at 2% (17.8% planning in the stall) and 21.2% at 5%
# (21.7%); adreno640 10.4% at 2% (11.6%). It cost a third of the saving before tmpc
# knew which graph its plan was for (``GraphBatch.ahead``), counted the debt of the
# graph running meanwhile, and got counters read at each graph's end.
HOLD_FOR_ENGINE = True


def after(plan: Plan, graph: int, t0_ns: int) -> Plan:
    """``plan``, solved after graph ``graph`` (first ask at ``t0_ns``) ended for the
    graph after it, marked so (``after_graph``) unless it names its graph already."""
    if plan.graph or plan.after_graph:
        return plan
    return replace(plan, after_graph=graph, after_t0_ns=t0_ns)


def retarget(plan: Plan, started_graph: int) -> Plan:
    """The graph a plan with ``after_graph`` is for when the executor takes it, the
    last graph to start computing being ``started_graph`` (0: none): the graph after
    that one. When that is the graph after ``after_graph`` the plan is on time as
    solved. Else the planner ran while the engine computed a later graph (the GIL is
    free inside ``llama_decode``): the plan is that graph's successor's, not a late
    plan for the running one. Its ``TIME`` switches (the raise inside the stall before
    its graph, timed from the end of ``after_graph``) are then for the stall after the
    graph it passed: the executor arms them at that graph's end, moved by the time
    between the two graphs' ends (``moved``; where the earlier end is unknown to it,
    by the time between their first asks). ``OFFSET`` and ``NODE`` keys are relative
    to the graph: unchanged."""
    if not plan.after_graph:
        return plan
    return replace(plan, graph=max(started_graph, plan.after_graph) + 1)


def moved(switches: list[Switch], dt_ns: int) -> list[Switch]:
    """``switches`` (``TIME``) moved by ``dt_ns``."""
    return [replace(s, key=s.key + dt_ns) for s in switches]
