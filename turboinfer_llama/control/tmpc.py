"""Tube-based model predictive control of the GPU clock ("act before it's too late").

The live loop and replay give this controller the same two things (see
``control/graph_batch.py`` and ``control/plan.py``):

* the engine's Python events, inline and cheap (request, decode begin/end, sample,
  token, idle): they carry stall boundaries, and request boundaries answer with a
  small :class:`Plan` (raise for the prefill, drop for the idle gap);
* after each ``llama_decode``, the graph's node records as one :class:`GraphBatch`:
  :meth:`on_graph` identifies the workload model from it, updates the phase's template
  and the latency debt, and solves the :class:`Plan` for the next graph. The native
  executor runs that plan inside the next ``llama_decode`` without Python.

State: latency debt = actual time - reference time since the request began (TTFT) or
over every decode step so far (TPOT, a mean over the run); the switches the executor
applied (for the clock each node ran at).

The reference is the top level's time, measured (``_reference_ns``): the default
governor can never be faster than the top clock, so a budget kept against it is kept
against the default on any GPU, whatever its governor does. Every ``PROBE_EVERY``
graphs of a phase one runs wholly at the top level; graphs in between are scaled from
it by the model's top-level ratio (context growth), never above their own measured
time. (A shadow of the default governor driven by the model was tried first: near
msm-adreno-tz's ramp-up threshold, and wherever the model extrapolated to levels it
had not run, it misjudged the default by 3-34% and the budget overshot 2-5x. The
price of the top-level reference: where the default is slower than the top clock,
that slowness is not spent -- the hindsight ``static-best``/``phase`` can spend it.)
Where the default's rule is deterministic and its tunables known (simple_ondemand on a
profiled device) a decode graph's reference is the larger of that and a lower bound of
the default's time (``control.default_bound``, ``_bound_reference``): simple_ondemand
run on the default's timeline with every choice towards a faster default, each level's
time bounded below by the model (less the tube) and by the graph's own measured time,
its busy time above by the model (plus the tube), the measured time
(``_measured_bounds``) and, at a level one of the request's graphs ran at wholly, that
graph's busy time (``WHOLLY_MARGIN``). Where that bound puts the default below the level
the last decode graph ran at, the next runs wholly at the bound's level
(``_envelope_probe``): it is no slower than the default there, so it costs no debt, and
it measures the level; and wherever running the next decode graph wholly at the bound's
level is predicted cheaper than the solved plan, it runs there (a reference a little
below that level's own time otherwise makes the plan mix in higher levels, at a higher
cost). While the bound sets the reference clear of the top level's time
(``PROBE_SKIP_MARGIN``) no top-level probe runs (``probe_due``). A request's prompt
follows the bound's *envelope* (``_prompt_envelope``, ``OndemandBound.envelope``): from
the bound's state after the last graph learnt from (the time since at that decode
graph's busy share, or busy throughout where it was no decode graph, up to the last
request's end; idle after it), the highest level any timer phase can be at as the prompt
runs, each raise issued a switch latency early; a prompt whose clock stayed at or above
it throughout (``_followed_envelope``) is no slower than the default's and costs no TTFT
debt. After a gap the default sits low and a prompt's start runs there too (before: at
the top). The envelope saves only while it is below the top. Its ramp (what the envelope's levels
lose against the top over the prompt's work, each level timed by the model made faster
by the tube) is a lower bound of the default's time over the top level's, so a prompt
graph runs on a plan solved against the top level's time *plus* that ramp, its slack
of both (``_ramped_plan``: plans made ahead at ``PROMPT_RAMP_STEPS`` shares of ramp,
the largest the prompt's own ramp covers); where none is covered, on whichever of the
top-level plan and the envelope spends more (``_slack_beats_ramp``).

Safe exploration (``_cautious``): the levels below the lowest a phase has run at (a
graph spent ``SEEN_SHARE`` of its kernel time there) enter the solve at their worst
case -- each block's top-level kernel time times the clock ratio (or the published
DRAM slowdown, where larger), never less than the model says -- so a plan spends on
a level it has not measured only what it could afford were that level as slow as
clock scaling makes it. Blocks that are mostly host time (a batch's recording gap)
cost little even at the worst case, so low levels are met there first. (A one-level
staircase was used before: on the simulated adreno650 it stopped at 490 MHz, the
level where the DDR vote drops, and never reached 305 MHz.) The slack a plan may
spend is what has been earned plus the next graph's own, never the horizon's later
graphs' (a run can end after any graph).

The plan for a later graph (``_plan_next``), solved from a graph's records: by default
while the engine computes the next graph (``plan.HOLD_FOR_ENGINE``), for the graph after
that one (``GraphBatch.ahead`` 2; its predictions are keyed by the graph planned for,
``_planned``, and the debt the running graph's plan committed counts against this
one's budget); else at the graph's end, for the next graph. At slack 0 every decode
graph runs at the top level. Where the graph times measured do not follow the clock
set (``clock_coupled`` False: the simulated device, live), every level below the top
is taken at its worst case, no slowdown is learnt, and a decode graph's debt is what
its plan committed. The plan:

* Horizon: the next ``n_compute`` graphs (from the phase's template) with the forecast
  stalls between them; every combination of compute levels is searched at once
  (``tmpc_solver.solve_horizon``), minimising predicted energy (busy power x kernel
  time + idle power x stalls and host gaps + switch cost) subject to
  ``debt + sum(d - d_ref) + tube <= slack * (reference elapsed + next graph's reference)``.
* Tube: debt is measured against the measured top-level time, so an error in
  absolute graph time cancels; what reaches the debt is the error in the predicted
  slowdown, bounded by the upper quantile ``r`` of past relative
  graph-time errors: ``r * (d - d_ref)``. Stalls add how far below its lower bound a
  stall has been seen to end times the largest slowdown a low clock can cause. A
  systematic error in the slowdown (the model's shape at the levels used, switches
  landing later than planned) is learnt instead: plans below the top keep the ratio of
  measured to planned slowdown (``_slow_gain``, an EWMA bounded 0.5-4), and the solve
  scales every level's slowdown by it, widened by the upper quantile of how far recent
  graphs overran the gain they were planned with (``_gain_err``): when the model is
  unsure, spend less saving, not more latency. Where the model itself was wrong (its
  roofline sides judged at a prior far from the GPU's balance) it refits
  (``PhaseModel.refit``), and the gain, the tube and the probes' regressors learnt
  against the old model start again.
* Inside the next graph, per-block levels (about one block per layer) share the time
  the horizon leaves it (``tmpc_solver.block_levels``). Block switches are keyed by
  node ordinal where the callback sees node boundaries during compute (``layer``,
  ``kernel``), else by time offset from the graph's first kernel (``graph``), and
  issued one switch latency early; a switch that must be issued inside a host gap
  (no ask comes there) is timed, and so is the one before it (else a graph slower
  than planned fires the timed raise before the node-keyed drop it undoes). No run
  of one level is shorter than a switch latency (``dwell_merge``): a device lands
  one level at a time, and a shorter run pushes every later switch out of place.
  Where the callback saw every completion, the graph's host time sits at the
  measured gaps (a backend recording the next batch leaves the GPU idle between
  batches), each large gap a block of its own: the plan drops the clock there. At
  ``graph`` granularity it sits where the backend submits, where the device says how
  often (``Capabilities.submit_batch_nodes``: the simulator with its phone host model;
  no real device yet), else it is shared out by launches.
* Prompts: a per-block plan for the next prompt, made after each prompt graph from
  its template with every level below the top at its worst case (the next prompt's
  length is unknown: a long one is compute-bound where a short one was not), scaled
  to the prompt's length at its DECODE_BEGIN. The stall after a prompt (the first
  sampling) is forecast apart from the decode's.
* Stalls cost no latency, so their level has a closed form: the bottom level when the
  stall's lower bound is longer than the switch latency -- the drop at the graph's end,
  the raise one switch latency before the stall's lower-bound end -- else the next
  compute level throughout.
* Ancillary feedback, carried out by the executor at each observed completion
  (``layer``/``kernel``): ``level = planned + ceil(K * error / predicted graph time)``
  when the graph runs behind its nominal trajectory by more than the plan's margin.
  At ``graph`` granularity there is no boundary during compute: the graph runs
  open-loop on its timed plan and the debt feeds back at the next solve.

Where a switch takes a decode step or longer to land (``SLOW_SWITCH_STEPS``: a request
through Android's thermal framework, ~80 ms) no level can be placed inside a graph or a
stall: the decode runs at one level chosen online against the budget, raised back
before the request's forecast end (the least decode length of recent requests) so the
next prompt starts at the top (``_slow_plan``); no planned probes, no prompt envelope.

A phase with no template yet (the first prefill, the first decode graph) runs at the
top level: it cannot be followed node by node from Python, and it must not fall
behind the default governor. Its stalls, and a probe's, still drop to the bottom.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from typing import NamedTuple

import numpy as np

from ..engine.events import Event, EventKind, StallKind
from . import plan_native
from .base import ControllerDefaults
from .default_bound import OndemandBound, graph_pieces
from .forecast import Forecaster, StallEstimate, StallStats
from .graph_batch import GraphBatch, is_none_done
from .model import FitGraph, PhaseModel, PowerTable, WorkloadModel
from .plan import Anchor, Plan, Switch
from .reference import ShadowParams
from .tmpc_solver import (
    PhaseTemplate,
    block_levels,
    dwell_merge,
    level_combinations,
    solve_horizon,
)

_HIST_KEEP = 512  # applied switches kept for the per-node clock
# every this many graphs of a phase, one runs wholly at the top level: its measured
# time is the latency reference (see TubeMPC._reference_ns)
PROBE_EVERY = 24
# a probe within this share of the reference the earlier ones give doubles the interval
# (up to PROBE_EVERY_MAX); one further off sets it back to PROBE_EVERY. Each probe runs
# a graph at the top level (sim adreno650, gemma: ~30 mJ over a planned graph)
PROBE_AGREE = 0.01
PROBE_EVERY_MAX = 96
PROBES_KEPT = 3  # the reference is the median of this many recent probes
# conditions changed (another app's DRAM load came or went, a thermal cap): a probe
# that differs from the reference the earlier ones give by more than this share is
# followed at once by PROBES_KEPT - 1 more, so the median is of the new conditions; and
# a graph below the top that ran faster than the reference by this share (no lower
# clock is faster: the probes are stale) brings the next probe forward
PROBE_SHIFT = 0.03
# a probe's regressors are sorted again (its nodes' roofline sides) once the model's
# compute or memory efficiency has moved this share since
PROBE_RESORT = 0.02
# no probe while the default's bound exceeds the top level's reference by this share
PROBE_SKIP_MARGIN = 0.02
# conditions changed under the decode (another app's DRAM load came or went): the
# graphs from one whose measured/model time ratio jumped by over PROBE_SHIFT plus the
# tube to the next top-level graph -- at most SHIFT_WINDOW -- were charged against the
# reference of the old conditions. Where that probe confirms the shift the same way,
# each is charged again against the old reference scaled by the probe's ratio (a
# credit at most to its own time; a debit where the load went): the default's graphs
# were slowed alike. Kept, that debt forced the top level for 48 graphs (sim
# adreno650, the sweep's Latin-hypercube point with a load coming: two graphs of 38 ms
# against a 20 ms reference, 35 ms of debt). The jump brings no probe forward: the
# debt runs the next graph at the top level anyway where the shift is real, and the
# probes that false jumps brought cost up to 9.6 points on generated GPUs
SHIFT_WINDOW = 8
# slow actuation: a switch takes at least this many decode steps (graph + stall) to
# land. No plan can place a level inside a graph or a stall there; the decode runs at
# one level, chosen online, and is raised ahead of the request's forecast end
# (``_slow_plan``)
SLOW_SWITCH_STEPS = 1.0
# and it stays so until the switch is under this share of SLOW_SWITCH_STEPS steps (a
# switch near one step would otherwise flip the mode, and the prompt envelope and the
# probes with it, graph by graph)
SLOW_SWITCH_LEAVE = 0.8
# requests whose decode lengths (graphs) forecast the next one's end: the least of them
REQ_LENGTHS_KEPT = 4
# bounds of the learnt ratio of measured to planned slowdown
SLOWDOWN_GAIN_MIN, SLOWDOWN_GAIN_MAX = 0.5, 4.0
# a plan teaches the gain when it planned at least this slowdown (share of the top)
GAIN_MIN_PLANNED = 0.005
# a level counts as run (its time measured, see TubeMPC._cautious) once a graph spent
# this share of its kernel time there
SEEN_SHARE = 0.1
# a decode graph's measured lower bound holds for the request's later ones (a context
# no shorter) less this share of its kernel time: timing noise between graphs
ANCHOR_MARGIN = 0.02
# a decode graph run wholly at one level measures its busy time there exactly: for the
# request's later graphs it bounds the busy time at that level and above from above,
# grown by this share, plus WHOLLY_GROWTH per graph since (a longer context; in the
# gemma recording on sim generic, graphs run wholly at one level measured the same busy
# time throughout a request). Before, the busy time of a graph run at mixed
# levels was bounded by its time at each level scaled by the clock ratio, ~7% over:
# the bound's simple_ondemand timelines at 500 MHz saw windows up to 0.70 busy where
# the default's own were 0.60-0.66, and held 500 MHz, under the default's 350, for
# 20-38 graphs (sim generic, gemma recording: -8.4% -> -6.1% saving at 2%)
WHOLLY_MARGIN = 0.005
WHOLLY_GROWTH = 0.001
# the idle level's raise may cost the next prompt at most this share of its TTFT slack
# (see TubeMPC._idle_level)
IDLE_RAISE_SHARE = 0.25
# the default's bound (``control.default_bound``) is built from the model; while the
# model's plans miss by more than this share (the tube's upper quantile), the bound is
# not trusted: decode is held to the top level's reference (probes resume) until they
# hit again. On mali-g76 at 0.375x compute (the model's prior 9x off) the bound put the
# default two levels below where it ran: +5.7% TPOT at a 2% budget
BOUND_TRUST_TUBE = 0.2
# a stall is dropped to the bottom level only where its lower bound holds this many
# switch latencies: the drop, then the raise, which a device lands no sooner than its
# minimum dwell after the drop (a devfreq clock change finishes before the next: the
# profiles' min_dwell is one direct switch latency). With one, a raise queued behind
# the drop landed ~1 ms into the next graph (generated 14-level tz profile, 1.9 ms
# switch: +5.9% TPOT at a 5% budget)
DROP_SWITCHES = 2
# prompts are planned ahead at lengths (tokens) from PROMPT_SHORTEST up to a
# micro-batch in steps of PROMPT_STEP times, then of PROMPT_UBATCHES micro-batches (the
# plan made at a longer length runs its lower levels on the blocks that are memory-
# bound there, and a shorter prompt is no more compute-bound): a prompt takes the
# plan of the shortest at least as long, timed again at its own (``_prompt_lengths``)
PROMPT_SHORTEST, PROMPT_STEP, PROMPT_UBATCHES = 16, 4, (2, 3, 4)
# the prompt plans are made again when the decode runs at a lower level than before or
# a new prompt is learnt from, and, at most every PROMPT_REPLAN_GRAPHS graphs, when the
# decode model's compute or memory efficiency or the tube have moved by PROMPT_REPLAN
# (relative; absolute for the tube): ~3 ms of planner time each (7 lengths)
PROMPT_REPLAN, PROMPT_REPLAN_GRAPHS = 0.02, 16
# a prompt this many times longer than the one its time scale was measured on: the
# model's absolute time at its length (not its ratio between levels, the plan's) may be
# a few percent off, and the executor would raise the clock for a delay that is the
# model's (sim adreno640, gemma: a 968-token prompt after a 24-token one, 5% in its
# first layer): the plan's feedback waits for a delay of PROMPT_TOL of its time; where
# no feedback comes (graph granularity) the plan prices its switches landing that far
# off (``TubeMPC._open_loop_risk``)
PROMPT_FAR, PROMPT_TOL = 4, 0.05
# where the default's bound is in use (simple_ondemand), a prompt that begins while the
# bound's timelines are below the top level ramps up in the default: its time there is
# at least the top level's plus what the bound's levels lose over the prompt's work.
# Prompt plans are made ahead for a default that much slower by these shares of the
# top-level time; a prompt takes the largest its own ramp covers (``_ramped_plan``)
PROMPT_RAMP_STEPS = tuple(0.01 * 1.5**k for k in range(11))  # 1% to 58%
# a wholly busy prompt has the default at the top level within this many polls (the
# first poll's window may hold the idle time before it): no larger share of ramp is
# planned for a prompt length than one this long would give
PROMPT_RAMP_POLLS = 3
# tokens per micro-batch a longer prompt is split into (llama.cpp's default n_ubatch),
# until a prompt graph of several shows another
UBATCH_TOKENS = 512
# a node whose compute per byte at a prompt's length is this many times its one-token
# graph's is taken as compute-bound there (a weight matrix's product: its weights are
# read once for every token of the micro-batch)
GROWS_INTENSITY = 1.5
# prompt envelopes kept (``TubeMPC._prompt_env``): a prompt's records may reach the
# planner after the next request has begun
_ENVELOPES_KEPT = 4


class _PromptModel(NamedTuple):
    """Each node's compute and memory time, affine in its micro-batch's tokens, and
    the time model prompt plans are made under (``TubeMPC._prepare_prompt_plans``)."""

    base_c: np.ndarray
    slope_c: np.ndarray
    base_m: np.ndarray
    slope_m: np.ndarray
    launch: np.ndarray
    layer_out: np.ndarray
    host_node: np.ndarray | None
    host_ns: float
    theta: np.ndarray
    ratio: np.ndarray
    coupling: np.ndarray
    intensity_1: np.ndarray  # compute per memory time of the one-token graph's nodes
    scale: float
    seen: int
    ubatch: int  # tokens per micro-batch


class _PromptGraph(NamedTuple):
    """A one-micro-batch prompt graph, as prompt plans at other lengths use it."""

    c_ns: np.ndarray
    m_ns: np.ndarray
    launch: np.ndarray
    layer_out: np.ndarray
    host_node: np.ndarray | None  # its host gaps (``TubeMPC._host_gaps``)
    host_ns: float
    busy_ns: float
    tokens: int


class _RetimeAid(NamedTuple):
    """A prompt plan made ahead, as ``TubeMPC._retimed`` times it again at another
    length: its elapsed time at each node's end, each node's roofline factors at its
    planned level, and its timed switches (index, time at the plan's length)."""

    model: _PromptModel  # the model the plan was made under
    ends_ns: np.ndarray
    ra: np.ndarray  # compute-side factor: th_c f_max/f
    rb: np.ndarray  # memory-side factor: th_m + th_d coupling
    th_x: float
    floor: np.ndarray
    host: np.ndarray
    timed: list[int]
    t_b: np.ndarray


class _PromptPlan(NamedTuple):
    """A prompt's per-block plan (``TubeMPC._solve_prompt``)."""

    tpl: PhaseTemplate
    tokens: int  # the length it was made at
    switches: list[Switch]
    first: int  # its first level
    predicted_ns: float
    margin_ns: float
    blocks: np.ndarray  # per-block levels
    aid: _RetimeAid | None = None  # made ahead per length: to time it at another
    energy_j: float = 0.0  # its blocks' energy, unseen levels at their worst case
    # where the default's bound is in use: the plans for a default slower than the top
    # level by at least a share of its time, (share, plan) by rising share
    # (``PROMPT_RAMP_STEPS``, ``TubeMPC._ramped_plan``)
    ramped: tuple[tuple[float, _PromptPlan], ...] = ()


def _ubatches(tokens: int, ubatch: int = UBATCH_TOKENS) -> list[int]:
    """The micro-batches (tokens each) a batch of ``tokens`` is split into."""
    per = [ubatch] * ((max(int(tokens), 1) - 1) // ubatch)
    per.append(max(int(tokens), 1) - sum(per))
    return per


def _prompt_lengths(ubatch: int) -> list[int]:
    """The prompt lengths planned ahead (``PROMPT_SHORTEST``, ``PROMPT_UBATCHES``)."""
    out, n = [], PROMPT_SHORTEST
    while n < ubatch:
        out.append(n)
        n *= PROMPT_STEP
    return out + [ubatch] + [k * ubatch for k in PROMPT_UBATCHES]


def _ubatch_seen(tokens: int, parts: int, ubatch: int) -> int:
    """The micro-batch size a batch of ``tokens`` run as ``parts`` micro-batches shows
    (llama.cpp's n_ubatch, a power of two: the least that splits it so), or ``ubatch``
    where that already does."""
    if len(_ubatches(tokens, ubatch)) == parts:
        return ubatch
    need = -(-int(tokens) // max(int(parts), 1))
    return 1 << max(need - 1, 0).bit_length()


class CautiousTables(NamedTuple):
    """A template's tables with the levels not run yet at their worst case."""

    graph_ns: np.ndarray
    energy_j: np.ndarray
    block_ns: np.ndarray
    block_energy_j: np.ndarray


class _Probe(NamedTuple):
    """A graph run wholly at the top level: its measured ns, its regressors at the top
    clock (its nodes' sides judged at ``theta``), its host ns and its nodes' work
    (compute ns, memory ns, launches)."""

    measured_ns: float
    x: np.ndarray
    host_ns: float
    work: tuple[np.ndarray, np.ndarray, np.ndarray]
    theta: tuple[float, float]  # the compute and memory efficiencies it was sorted at


class _MeasuredBounds(NamedTuple):
    """A graph's bounds from its measured time alone (``TubeMPC._measured_bounds``)."""

    lo_ns: np.ndarray  # per level: its time were it run wholly there, at least
    busy_ns: np.ndarray  # per level: its kernel time were it run wholly there, at most
    wholly_at: int | None  # the one level it ran at throughout, or None
    fastest_at: int | None  # the highest level it may have run at


class _Planned(NamedTuple):
    """What a decode plan predicted for the graph it is for: the graph's node count,
    its compute ns and the same graph's ns at the top level (the gain is learnt against
    them), and, for the budget of plans solved while it runs (``GraphBatch.ahead``),
    the debt its plan committed (tube included) and its reference ns."""

    n: int
    predicted_ns: float
    top_ns: float
    committed_ns: float
    ref_ns: float
    excess_ns: float  # its time over the reference as planned (tube not included)
    # graph granularity: each node's planned end, a share of the graph's time (where
    # the graph's nodes ran comes from its plan; see TubeMPC._node_spans)
    share: np.ndarray | None = None


class TubeMPC(ControllerDefaults):
    """The TurboInfer controller. See the module docstring for the formulation."""

    name = "tmpc"
    # request boundaries and decode begins (a prompt's plan, the phase); it learns from
    # graphs (on_graph), not from decode ends
    event_kinds = frozenset(
        {EventKind.REQUEST_BEGIN, EventKind.REQUEST_END, EventKind.IDLE, EventKind.DECODE_BEGIN}
    )

    def __init__(
        self,
        levels_hz: list[int],
        *,
        latency_slack: float = 0.02,
        switch_latency_ns: int = 500_000,
        power: PowerTable | None = None,
        shadow: ShadowParams | None = None,
        horizon: int = 5,
        feedback_gain: float = 50.0,
        tube_quantile: float = 0.9,
        planning: bool = True,
        clock_coupled: bool = True,
        submit_batch_nodes: int | None = None,
    ) -> None:
        if not 3 <= horizon <= 6:
            raise ValueError(f"horizon must be 3..6 segments, got {horizon}")
        self.levels_hz = np.asarray(sorted(levels_hz), dtype=np.float64)
        self.levels_int = [int(x) for x in self.levels_hz]
        self.n_levels = len(self.levels_hz)
        self.top = self.n_levels - 1
        self.slack = latency_slack
        self.switch_latency_ns = int(switch_latency_ns)
        self.power = power or PowerTable.assumed(self.levels_int)
        self.model = WorkloadModel(self.power)
        self.forecast = Forecaster(cost_fn=lambda op, sh: (0.0, 0.0))
        self.shadow_params = shadow or ShadowParams()
        self._last_ref_ns: dict[str, float] = {}
        self.n_compute = (horizon + 1) // 2
        self.planning = planning
        # False: the graph times this controller measures do not follow the clock it
        # sets (the simulated device, live: the clock acts on a model of the phone, the
        # graphs run on this host at their own speed). Learning the clock's effect from
        # them would find every level free; so every level below the top is taken at
        # its worst case (``_cautious``), nothing is learnt from a plan's measured
        # slowdown, and a decode graph's debt is what its plan committed (its worst
        # case), not its measured time
        self.clock_coupled = clock_coupled
        # the engine backend's kernels per submission, where the device knows
        # (``_host_gaps``); None: unknown
        self.submit_batch_nodes = submit_batch_nodes
        # (a graph shape's launch flags, each node's share of its host time) (_batch_gaps)
        self._batch_share: tuple[np.ndarray, np.ndarray | None] | None = None
        self._max_slowdown = 1.0 - self.levels_hz[0] / self.levels_hz[-1]
        self.combos, self.changes = level_combinations(self.n_levels, self.n_compute)
        first_change = self.combos[:, 0][None, :] != np.arange(self.n_levels)[:, None]
        self.switch_count = self.changes[None, :] + first_change  # per current level
        # among plans equal but for their order (the horizon's graphs are alike), the
        # one with the faster first graph: a run can end after any graph; and a tie
        # told apart by rounding would make the C and numpy passes disagree (W x ns,
        # far below any real difference and far above rounding)
        self._order_pref = 1e-3 * (self.top - self.combos[:, 0]).astype(np.float64)
        self.gain = feedback_gain
        self._tube_q = tube_quantile
        # relative graph-time errors of recent plans (the tube ``r``), and measured /
        # (gain x planned) slowdown of recent plans: its upper quantile widens the tube
        # where the gain alone has not been enough
        self.rel_err, self._gain_err = self._plan_error_stats()
        self._templates: dict[str, PhaseTemplate] = {}
        self._time_scale: dict[str, float] = {}
        self.phase = "prefill"
        self.solves = 0
        self.graphs = 0
        self.probes = 0  # graphs run wholly at the top level to measure the reference
        self.shift_credits = 0  # probes that confirmed a shift and re-charged its graphs
        self.granularity = "graph"
        self._hist_t: list[int] = []  # landing times of applied switches, ascending
        self._hist_lv: list[int] = []
        init = self.shadow_params.initial_hz
        self._initial = self.top if init is None else int(np.argmin(np.abs(self.levels_hz - init)))
        # per phase: recent graphs run wholly at the top level (``_Probe``); graphs
        # since the last, per phase
        self._top_probe: dict[str, deque[_Probe]] = {}
        # per phase: the lowest level a graph has spent a good share of its time at;
        # levels below it enter the solve at their worst case (see _cautious)
        self._lowest_seen: dict[str, int] = {}
        # worst slowdown of a level the phase has not run at: the clock ratio, or the
        # published DRAM slowdown where larger (see _cautious)
        worst = self.levels_hz[-1] / self.levels_hz
        if self.power.mem_slowdown is not None:
            worst = np.maximum(worst, np.asarray(self.power.mem_slowdown, dtype=np.float64))
        self._worst_ratio = worst
        self._clock_slowdown = self.levels_hz[-1] / self.levels_hz - 1.0
        # [l, L]: the share of a kernel's time at level l that running it at L > l can
        # save at most: 1 - 1 / (the clock ratio, or the published DRAM ratio where
        # larger); 0 for L <= l (see _measured_bounds)
        speedup = self.levels_hz[None, :] / self.levels_hz[:, None]
        if self.power.mem_slowdown is not None:
            mem = np.asarray(self.power.mem_slowdown, dtype=np.float64)
            speedup = np.maximum(speedup, mem[:, None] / mem[None, :])
        speedup = np.maximum(speedup, 1.0)
        self._speedup_share = np.triu(1.0 - 1.0 / speedup, k=1)
        # [l, L]: the most a kernel's time at level l can grow run at L (the same ratio
        # the other way, for L < l; 1 for L >= l: a higher clock is never slower)
        self._slowdown_most = np.where(
            np.arange(self.n_levels)[:, None] > np.arange(self.n_levels)[None, :],
            speedup.T,
            1.0,
        )
        self._cautious_cache: tuple[tuple[int, int], PhaseTemplate, CautiousTables] | None = None
        self._since_probe: dict[str, int] = {}
        # per phase: graphs between probes (PROBE_EVERY, doubled while probes agree)
        self._probe_every: dict[str, int] = {}
        # per phase: probes still due at once (see PROBE_SHIFT)
        self._probe_burst: dict[str, int] = {}
        # decode graphs since the time scale jumped, to be charged again once a probe
        # confirms the shift: (measured, reference charged, top-level reference) ns
        # (the way it jumped: 1 up, -1 down; the graphs)
        self._since_shift: tuple[int, list[tuple[float, float, float]]] | None = None
        # this graph's measured time over the reference the probes before it gave, where
        # it is a probe (:meth:`_reference_ns`); else None
        self._probe_ratio: float | None = None
        self._busy_last: int | None = None
        # (c_ns, m_ns, launch, cumulative cost share) of the last graph shape
        self._share: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._graph_busy: int | None = None
        self._margin_ns = 0.0
        # per graph planned for (its sequence number), what its plan predicted
        self._planned: dict[int, _Planned] = {}
        self._probe_for: dict[str, int] = {}  # the graph a top-level probe is planned for
        self._graph = -1  # the last graph learnt from
        self._slow_gain = 1.0  # recent measured / planned slowdown of plans below the top
        self._after_prefill = StallStats(window=16, quantile=tube_quantile)
        # the next prompt's plan from the last prompt graph alone, made off the engine
        # thread after each (:meth:`_solve_prompt`): where no plans per length are made
        self._prefill_next: _PromptPlan | None = None
        # the level of the first decode graph after a prompt (its plan comes only once
        # it has begun: the planner learns the prompt then), made with each decode plan
        self._after_prompt_lv = self.top
        # the fallback level of the last plan an event answered with (a prompt's, or its
        # request's): where the first decode graph after a prompt runs, having no plan
        # of its own, so a plan solved past it (GraphBatch.ahead) counts its debt
        self._event_fallback_lv = self.top
        # the last one-micro-batch prompt graph, for prompt plans at other lengths:
        # (compute ns, memory ns, launches, layer outputs, host gaps, host ns, busy ns,
        # tokens)
        self._prompt_fit: _PromptGraph | None = None
        # prompt plans made ahead, per length (``_prompt_lengths``), and the model they
        # were made under; replaced whole (the engine thread reads it)
        self._prompt_ahead: tuple[_PromptModel | None, dict[int, _PromptPlan]] = (None, {})
        self._ubatch = UBATCH_TOKENS  # tokens per micro-batch, as prompt graphs show it
        self._prompt_plans_key: tuple = ((), (), 0)  # (key, moved, at graph)
        # the next prompt graph is its request's first (engine thread: set at
        # REQUEST_BEGIN, cleared by the prompt's first DECODE_BEGIN)
        self._prompt_first_chunk = True
        # latency (debt, reference elapsed) per phase: prefill per request (TTFT),
        # decode over every request of the run (TPOT is a mean over the run)
        self._acc = {"prefill": [0.0, 0.0], "decode": [0.0, 0.0]}
        self._req_begins: list[int] = []  # REQUEST_BEGIN times (recent)
        # recent requests' time from their begin to their prompt's first kernel, and
        # that plus the prompt graph's reference (a TTFT reference), ns
        self._leads: deque[int] = deque(maxlen=8)
        self._ttft_refs: deque[float] = deque(maxlen=8)
        self._lead_pending = False
        self._req_ends: list[int] = []  # REQUEST_END / IDLE times (recent)
        # decode graphs of recent requests, and of this one so far (``_slow_plan``)
        self._req_lengths: deque[int] = deque(maxlen=REQ_LENGTHS_KEPT)
        self._req_decode_n = 0
        # the level the last slow-actuation plan set (None: the request's own, the top)
        self._slow_lv: int | None = None
        # switches land decode steps late (``_slow_plan``; set by the decode plans, read
        # at REQUEST_BEGIN: no prompt envelope then)
        self._slow = False
        self._t_end_prev: int | None = None  # end of the last graph learnt from
        self._prev_phase = "decode"
        # a lower bound of the default governor's time, where its rule is deterministic
        # and its tunables known (simple_ondemand on a profiled device); else None and
        # the reference is the top level's time alone (see _bound_reference)
        sp = self.shadow_params
        self._default_bound = (
            OndemandBound(
                self.levels_int,
                up_threshold=sp.ondemand_up,
                down_differential=sp.ondemand_down,
                polling_ns=sp.ondemand_polling_ns,
                switch_latency_ns=self.switch_latency_ns,
                initial_level=self._initial,
            )
            if sp.governor == "simple_ondemand"
            and sp.rules_known
            and sp.ondemand_polling_ns > 0
            # measured times that do not follow the clock bound nothing
            and clock_coupled
            else None
        )
        self._last_min_level = self.top
        # (the last graph's end, the bound's state after it, the busy share per level
        # of work after it not yet learnt from, were it the same request's decode): for
        # the inline prompt envelope (read on the engine thread, replaced whole by the
        # planner)
        self._bound_snap: tuple[int, tuple[tuple[float, ...], ...], np.ndarray | None] | None = None
        # the last decode graph's upper busy share per level (see _bound_reference)
        self._decode_share_hi: np.ndarray | None = None
        # the current request's prompt envelope ((t_ns, level) steps), and recent ones
        self._prompt_env: list[tuple[int, int]] | None = None
        self._envelopes: deque[list[tuple[int, int]]] = deque(maxlen=_ENVELOPES_KEPT)
        # the last decode graph's bound over its top-level reference (see probe_due)
        self._bound_over_top = 0.0
        self._top_ref_ns: dict[str, float] = {}  # the last graph's top-level reference
        # per level: the most kernel time the decode graphs of this request so far bound
        # a later one's by (see _bound_reference)
        self._anchor_ns: np.ndarray | None = None
        # per level: the busy ns of this request's last decode graph run wholly there,
        # and the graph count then (see WHOLLY_MARGIN)
        self._busy_wholly: dict[int, tuple[float, float]] = {}
        # a diagnostic, never set live (``bench.breakdown --hindsight-reference``): the
        # default's own time of each decode graph (ns, by graph ordinal) from a replay
        # of the default on the same recording. It takes the place of the decode's
        # reference (top level's, or the default's bound), and of the next graph's
        # expected reference in the plans: what tmpc would save knowing the default's
        # run, against what keeping its promise without that knowledge costs
        self.hindsight_reference_ns: dict[int, float] | None = None
        self._reset_request()

    # ---- state ---------------------------------------------------------------------

    def _reset_request(self) -> None:
        self._acc["prefill"] = [0.0, 0.0]

    @property
    def debt_ns(self) -> float:
        """Latency debt of the current phase: actual - reference time, ns."""
        return self._acc[self.phase][0]

    @property
    def ref_elapsed_ns(self) -> float:
        """Reference (top-level) time of the current phase, ns."""
        return self._acc[self.phase][1]

    def _account(self, phase: str, actual_ns: float, ref_ns: float) -> None:
        acc = self._acc[phase]
        acc[0] += actual_ns - ref_ns
        acc[1] += ref_ns

    def _account_stall(self, phase: str, dur_ns: float) -> None:
        """A stall's time into the budget's base, where measured time is the device's
        (``clock_coupled``). Otherwise (the simulated device, live) the host's stalls
        say nothing of the device's: on a loaded host they grow by another factor than
        its compute, and a budget granted on them is spent on the device's compute
        alone. There the budget is a share of the compute, which any stall only
        dilutes."""
        if self.clock_coupled:
            self._account(phase, dur_ns, dur_ns)

    def level_at(self, t_ns: int) -> int:
        """The level in effect at ``t_ns`` (an applied switch lands one switch latency
        after its call started)."""
        i = bisect.bisect_right(self._hist_t, t_ns)
        return self._hist_lv[i - 1] if i else self._initial

    def on_applied(self, applied: list[tuple[int, int]]) -> None:
        """Switches the executor applied: ``(t_ns the call started, level)``."""
        for t, lv in applied:
            land = int(t) + self.switch_latency_ns
            i = bisect.bisect_right(self._hist_t, land)
            self._hist_t.insert(i, land)
            self._hist_lv.insert(i, int(lv))
        if len(self._hist_t) > 2 * _HIST_KEEP:
            del self._hist_t[:-_HIST_KEEP], self._hist_lv[:-_HIST_KEEP]

    def _clock_segments(
        self, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The clock over ``[min(starts), max(ends)]`` as boundaries and the level's
        clock between each pair (an applied switch lands one switch latency after its
        call started; a kernel that a switch lands in runs part of its work at each
        clock)."""
        # (the ufuncs' own reduce: ndarray.min/max add ~1 us of Python each)
        t0, t1 = float(np.minimum.reduce(starts)), float(np.maximum.reduce(ends))
        i0 = bisect.bisect_right(self._hist_t, int(t0))
        i1 = bisect.bisect_right(self._hist_t, int(t1), lo=i0)
        lv0 = self.level_at(int(t0))
        if i1 == i0:  # no switch landed inside the graph: one clock throughout
            return np.array([t0, t1 + 1.0]), self.levels_hz[lv0 : lv0 + 1]
        seg_t = np.array([t0, *self._hist_t[i0:i1], t1 + 1.0])
        return seg_t, self.levels_hz[[lv0, *self._hist_lv[i0:i1]]]

    # ---- events (inline, cheap) ------------------------------------------------------

    def on_counters(self, counters) -> None:
        """Device counters at a graph end: intensity for the model, and the graph's
        busy time (kernel time without host gaps) for identification."""
        self.model.observe_counters(counters, self.phase)
        if self._busy_last is not None:
            self._graph_busy = counters.busy_ns - self._busy_last
        self._busy_last = counters.busy_ns

    def _stall(self, kind: StallKind, dur_ns: float, phase: str) -> None:
        if dur_ns < 0:
            return
        self.forecast.observe(kind, dur_ns)
        self._account_stall(phase, dur_ns)

    def on_event(self, ev: Event) -> Plan | None:
        """Inline on the engine thread: only timestamps (and a small plan at request
        boundaries). Everything that learns runs in :meth:`on_graph`, in the graphs'
        order, so it does not matter whether a graph's records arrive before or after
        the next events (a late worker)."""
        plan = self._event_plan(ev)
        if plan is not None and plan.fallback_level >= 0:
            self._event_fallback_lv = plan.fallback_level
        return plan

    def _event_plan(self, ev: Event) -> Plan | None:
        k = ev.kind
        if k is EventKind.DECODE_BEGIN:
            self.phase = "prefill" if ev.n_tokens > 1 else "decode"
            if self.phase == "prefill":
                if self._prompt_env is not None:
                    ramped = self._ramped_plan(ev.n_tokens, ev.t_ns)
                    if ramped is not None:
                        solved = self._prefill_plan(ev.n_tokens, ev.t_ns, ramped)
                        if solved is not None:
                            return solved
                    if self._slack_beats_ramp(ev.n_tokens, ev.t_ns):
                        solved = self._prefill_plan(ev.n_tokens, ev.t_ns)
                        if solved is not None:
                            return solved
                    return self._envelope_plan(ev.t_ns)
                return self._prefill_plan(ev.n_tokens, ev.t_ns)
            return None
        if k is EventKind.REQUEST_BEGIN:
            self._req_begins.append(ev.t_ns)
            self._slow_lv = None
            self._prompt_first_chunk = True
            # (where switches land steps late, none: an envelope's raise, timed for a
            # default whose prompt outlasts its ramp, lands after a short prompt, in
            # the decode, where the bound has the default at the top already)
            self._prompt_env = None if self._slow else self._prompt_envelope(ev.t_ns)
            if self._prompt_env is not None:
                self._envelopes.append(self._prompt_env)
                return self._envelope_plan(ev.t_ns)
            lv = self._prefill_level(ev.n_tokens)
            return Plan(
                first_level=lv,
                fallback_level=lv,
                switches=(Switch(Anchor.TIME, ev.t_ns, lv),),
            )
        if k in (EventKind.REQUEST_END, EventKind.IDLE):
            if not self._req_ends or self._req_ends[-1] < self._last_begin():
                self._req_ends.append(ev.t_ns)
            # no plan for the next request's first graph; bottom level while idle --
            # but for no budget: the raise at the next request's begin lands one switch
            # latency into its prompt (a generated tz profile with a 1.5 ms switch:
            # +0.37% TTFT at slack 0)
            idle_lv = self._idle_level() if self.slack > 0 else self.top
            return Plan(switches=(Switch(Anchor.TIME, ev.t_ns, idle_lv),))
        return None

    def _idle_level(self) -> int:
        """The level to idle at between requests: the lowest whose raise at the next
        request's begin, landing a switch latency later, costs its prompt at most
        ``IDLE_RAISE_SHARE`` of its TTFT slack -- the part of the latency after the
        prompt's first kernel (the shortest lead seen) at that level, at the worst case
        of clock scaling. The bottom where nothing is known yet, or the raise lands
        before any prompt's first kernel (sim adreno640 at the sweep's 80 ms switch,
        idling at the bottom: a prompt's first 77 ms ran at 215 MHz, +3.0% TTFT at 2%)."""
        if not self._leads or not self._ttft_refs:
            return 0
        late_ns = self.switch_latency_ns - min(self._leads)
        if late_ns <= 0:
            return 0
        room_ns = IDLE_RAISE_SHARE * self.slack * min(self._ttft_refs)
        ok = np.nonzero(late_ns * (1.0 - 1.0 / (1.0 + self._clock_slowdown)) <= room_ns)[0]
        return int(ok[0]) if len(ok) else self.top

    def _last_begin(self) -> int:
        return self._req_begins[-1] if self._req_begins else -1

    def _stalls_before(self, b: GraphBatch) -> None:
        """The stall between the previous graph and this one, in the graphs' order: a
        sampling stall inside a request, or an idle gap before a new request."""
        prev = self._t_end_prev
        begins = [t for t in self._req_begins if (prev is None or t > prev) and t <= b.t_begin_ns]
        if begins:  # a new request: the idle gap before it (not part of any budget)
            self._leads.append(max(0, int(b.t_first_ns) - begins[-1]))
            self._lead_pending = True
            idle_from = max((t for t in self._req_ends if prev is None or t >= prev), default=None)
            if idle_from is not None and idle_from <= begins[-1]:
                self.forecast.observe(StallKind.IDLE, begins[-1] - idle_from)
            if self._req_decode_n:
                self._req_lengths.append(self._req_decode_n)
            self._req_decode_n = 0
            self._reset_request()
        elif prev is not None:
            dur = b.t_begin_ns - prev
            if self._prev_phase == "prefill" and dur >= 0:
                # the stall after a prompt (the first sampling, a client's first
                # token out) is its own kind: longer than the decode's
                self._after_prefill.update(dur)
                self._account_stall(self._prev_phase, dur)
            else:
                self._stall(StallKind.SAMPLE, dur, self._prev_phase)
        del self._req_begins[:-4], self._req_ends[:-4]

    def plan(self, now_ns: int) -> list:
        """Timed decisions: none, tmpc's switches all go through per-graph plans."""
        return []

    # ---- per graph (off the engine thread) -------------------------------------------

    def _node_spans(self, b: GraphBatch) -> tuple[np.ndarray, np.ndarray]:
        """When each node ran: measured where the callback saw completions, else the
        graph's measured compute time shared out between observations: at ``graph``
        granularity (none during compute) by the node times its plan predicted at the
        levels it planned, where it had one; else by cost weight.

        (The cost weight alone took no account of the clock: a block run at a low level
        takes longer than its weight's share, so the graph's time-keyed raise fell,
        in weight shares, some nodes later than it did, and those nodes were taken as
        run at the low clock. Their regressors then said the graph should have been
        slower than measured; the time scale fell with each mixed-level graph while the
        learnt gain rose, and the plans swung between low and high levels every few
        graphs. Sim adreno650, gemma recording replayed at ``graph`` granularity, 2%:
        16.1% -> 20.6% saving, 9 -> 5 top-level probes, the relative error's upper
        quantile 0.08-0.11 -> 0.005.)"""
        n = b.n
        done = None if is_none_done(b.done_ns) else b.done_ns >= 0
        n_done = 0 if done is None else int(np.count_nonzero(done))
        if n and n_done == n:
            return b.ask_ns.astype(np.float64), b.done_ns.astype(np.float64)
        if done is None or n_done == 0:  # graph granularity: the planned share, else
            p = self._planned.get(b.graph)  # the weights'
            share = p.share if p is not None else None
            if share is None or len(share) != n:
                share = self._weight_share(b)
            # starts and ends, one buffer: the ends, each node's start the end before
            spans = np.empty(n + 1)
            spans[0] = 0.0
            np.multiply(share, b.t_end_ns - b.t_first_ns, out=spans[1:])
            spans += float(b.t_first_ns)
            spans[0] = float(b.t_first_ns)
            return spans[:-1], spans[1:]
        w = np.maximum(np.maximum(b.c_ns, b.m_ns), 1.0) + 1_000.0 * b.launch
        ends = np.empty(n)
        known = np.nonzero(done)[0].tolist()
        if known[-1] != n - 1:
            known.append(n - 1)
        t_prev, i_prev = float(b.t_first_ns), 0
        for i in known:
            t_i = float(b.done_ns[i]) if b.done_ns[i] >= 0 else float(b.t_end_ns)
            cw = np.cumsum(w[i_prev : i + 1])
            ends[i_prev : i + 1] = t_prev + (t_i - t_prev) * cw / max(cw[-1], 1e-9)
            t_prev, i_prev = t_i, i + 1
        starts = np.empty(n)
        starts[0] = float(b.t_first_ns)
        starts[1:] = ends[:-1]
        return starts, ends

    def _host_gaps(self, b: GraphBatch, host_ns: float) -> np.ndarray | None:
        """Where the graph's host time sits: the measured gap before each node (from the
        previous node's completion to its ask) scaled to ``host_ns``, where the callback
        saw every completion (``layer``/``kernel``). At ``graph`` granularity no
        completion is seen, so the gaps go where the backend submits, where the device
        says how often (``submit_batch_nodes`` kernels: the host records each batch
        before the first of its kernels, its time growing with the kernels recorded);
        None otherwise (shared out by launches). A backend that records and submits
        nodes in batches leaves the GPU idle at the batch boundaries: a plan that knows
        where can drop the clock there and need not mistake the gap for a slow block.

        (Without it at ``graph`` granularity, sim adreno640 at 2% on stop 37's gemma
        recording idled 571 ms of its decode at 553 MHz, against the oracle's 692 ms at
        309 MHz: the recording gaps, ~1 ms every 100 kernels.)"""
        if b.n < 2 or host_ns <= 0:
            return None
        if b.granularity == "graph":
            return self._batch_gaps(b.launch, host_ns)
        if not (b.done_ns >= 0).all():
            return None
        gaps = np.empty(b.n)
        gaps[0] = 0.0
        np.subtract(b.ask_ns[1:], b.done_ns[:-1], out=gaps[1:])
        np.maximum(gaps, 0.0, out=gaps)
        total = float(gaps.sum())
        if total <= 0:
            return None
        gaps *= host_ns / total
        return gaps

    def _batch_gaps(self, launch: np.ndarray, host_ns: float) -> np.ndarray | None:
        """``host_ns`` at the backend's submission points: before every
        ``submit_batch_nodes``-th launched kernel after the first (the first batch is
        recorded before the graph's first kernel, in its submission stall), in
        proportion to the kernels each batch records. None where no batches are known,
        or one kernel each (the time is then where the launches are, as without)."""
        per = self.submit_batch_nodes
        if per is None or per <= 1:
            return None
        got = self._batch_share
        if got is None or got[0] is not launch:  # the shape repeats: its very array
            unit = None
            kernels = np.flatnonzero(launch > 0)
            if len(kernels) > per:
                firsts = kernels[per::per]
                sizes = np.minimum(per, len(kernels) - per * np.arange(1, len(firsts) + 1))
                unit = np.zeros(len(launch))
                unit[firsts] = sizes / float(sizes.sum())
            got = self._batch_share = (launch, unit)
        return None if got[1] is None else got[1] * host_ns

    def _weight_share(self, b: GraphBatch) -> np.ndarray:
        """Cumulative share of the graph's cost weight at each node's end, kept while
        the graph's shape repeats (live, the ingest's per-shape cache hands out the
        very same arrays; else they compare equal)."""
        got = self._share
        if got is not None and all(
            x is y or (len(x) == len(y) and np.array_equal(x, y))
            for x, y in zip(got[:3], (b.c_ns, b.m_ns, b.launch), strict=True)
        ):
            return got[3]
        w = np.maximum(np.maximum(b.c_ns, b.m_ns), 1.0) + 1_000.0 * b.launch
        cw = np.cumsum(w)
        share = cw / max(float(cw[-1]), 1e-9)
        self._share = (b.c_ns, b.m_ns, b.launch, share)
        return share

    def on_graph(self, b: GraphBatch) -> Plan | None:
        """Learn from one finished graph and plan the next one (see module docstring)."""
        self.graphs += 1
        self.granularity = b.granularity
        phase = b.phase
        self._stalls_before(b)
        if phase == "decode":
            self._req_decode_n += 1
        self._stall(StallKind.SUBMIT, b.t_first_ns - b.t_begin_ns, phase)
        measured = float(b.compute_ns)
        jump, top_ref = 0, measured
        if self._default_bound is not None and self._t_end_prev is not None:
            # the stall (or idle gap) since the last graph, and this one's submission
            self._default_bound.idle(b.t_first_ns - self._t_end_prev)
        if b.n and measured > 0:
            pm = self.model.phases[phase]
            if pm.refit_due() and pm.refit():
                self._forget_old_model(phase)
            starts, ends = self._node_spans(b)
            seg_t, seg_hz = self._clock_segments(starts, ends)
            # each node's mean clock, the time per level, the model's regressors at
            # those clocks (before this graph updates the model)
            obs = plan_native.observe(
                b.c_ns, b.m_ns, b.launch, starts, ends, seg_t, seg_hz, pm.theta_now(),
                pm.f_max_hz, self.levels_hz, *pm.coupling_table,
            )  # fmt: skip
            lowest_here = self._note_levels(phase, obs.level_ns)
            g = PhaseTemplate(b.c_ns, b.m_ns, b.launch, b.layer_out)
            # a decode graph's plan (a plan two ahead can be made for what turns out to
            # be the next request's prompt, a graph of as many nodes: its error against
            # the prompt's time, ~0.93, held the tube there for the next 64 decode graphs)
            pred = self._planned.get(b.graph) if phase == "decode" else None
            if self.clock_coupled and pred is not None and pred.n == g.n and pred.predicted_ns > 0:
                self.rel_err.update(abs(measured - pred.predicted_ns) / max(measured, 1.0))
                top_ns = pred.top_ns
                if pred.predicted_ns - top_ns > GAIN_MIN_PLANNED * top_ns:
                    # a plan below the top: its slowdown measured against planned
                    gain = (measured - top_ns) / (pred.predicted_ns - top_ns)
                    gain = min(max(gain, SLOWDOWN_GAIN_MIN), SLOWDOWN_GAIN_MAX)
                    # how far this graph's slowdown exceeded the gain it was planned with
                    self._gain_err.update(gain / self._slow_gain)
                    self._slow_gain = 0.7 * self._slow_gain + 0.3 * gain
            busy = self._graph_busy
            self._graph_busy = None
            # the counters' busy time of this graph, where they read one
            counted = float(busy) if busy is not None and 0 < busy <= measured else None
            if counted is None:  # no counters: fit wall time
                busy_ns, host = measured, 0.0
            else:
                busy_ns, host = counted, measured - counted
            x = obs.x
            pm.update(
                x, busy_ns, FitGraph(b.c_ns, b.m_ns, b.launch, starts, ends, seg_t, seg_hz, busy_ns)
            )
            # this measurement against the (updated) model's time at the clocks each
            # node really ran at (the regressors as classified before the update: one
            # RLS step moves the roofline's sides by far less than they differ)
            pred_here = float(x @ pm.theta) + host
            # the kernels' ratio alone: the template scales kernel time by it and adds
            # the host time as measured (a ratio over both, host included, set the
            # template's top level 16 ms under a measured 54.8 ms graph on a generated
            # Mali computing 2.7x slower than the prior, and plans spent the gap)
            kern_pred = pred_here - host
            scale = busy_ns / kern_pred if kern_pred > 0 else 1.0
            # the model's shape (how time scales with the clock) moves slowly (RLS); its
            # absolute level follows the last graphs at once (a loaded host, a longer
            # context): predictions carry the recent measured/predicted ratio
            ts_before = ts = self._time_scale.get(phase)
            ts = scale if ts is None else 0.5 * ts + 0.5 * scale
            self._time_scale[phase] = ts
            _, ratio, coupling = pm.level_terms(self.levels_hz)
            host_node = self._host_gaps(b, host)
            g.tabulate(
                pm.theta_now(), ratio, coupling, host, self.power, ts, host_node,
                self._worst_ratio, self._seen_for(phase), self.switch_latency_ns,
            )  # fmt: skip
            self._templates[phase] = g
            # the graph at the top level under the model, before the time scale
            top_ns = (float(g.graph_ns[self.top]) - host) / ts + host
            r_before = self.rel_err.estimate().upper_ns
            # (not where switches land steps late: the time scale moves with each level
            # that lands mid-graph, and the probes it brought cost -5.9 points at an 80
            # ms switch on sim generic; nor where the default's bound sets the reference:
            # a top-level probe there moves the bound's timelines, -17.7 points on a
            # generated simple_ondemand GPU, seed 6)
            if (
                phase == "decode"
                and self.clock_coupled
                and not self._slow
                and self._default_bound is None
                and ts_before is not None
                and abs(scale / max(ts_before, 1e-9) - 1.0) > PROBE_SHIFT + r_before
            ):
                jump = 1 if scale > ts_before else -1
            ref = self._reference_ns(
                phase, x, obs.min_hz, measured, host, top_ns, (b.c_ns, b.m_ns, b.launch)
            )
            top_ref = self._last_ref_ns[phase] = ref
            if self._default_bound is not None:
                meas = self._measured_bounds(starts, ends, measured, counted)
                if phase == "decode":
                    self._last_min_level = lowest_here
                ref = self._bound_reference(phase, g, host, ref, meas)
            if self.hindsight_reference_ns is not None:
                ref = self._hindsight_reference(phase, b.graph, ref, top_ref)
            if phase == "prefill":
                if self._lead_pending:  # a request's first prompt graph: its TTFT reference
                    self._ttft_refs.append(self._leads[-1] + self._last_ref_ns[phase])
                    self._lead_pending = False
                if self._followed_envelope(int(b.t_first_ns), int(b.t_end_ns)):
                    # the clock was at or above every timeline's level throughout:
                    # the default is no faster than this prompt
                    ref = max(ref, measured)
                self._prepare_prefill(g, b.n_tokens)
                dec = self._templates.get("decode")
                if dec is not None and dec.n and b.n % dec.n == 0:
                    self._ubatch = _ubatch_seen(b.n_tokens, b.n // dec.n, self._ubatch)
                if b.n_tokens > 1 and (dec is None or b.n == dec.n):
                    self._prompt_fit = _PromptGraph(
                        b.c_ns, b.m_ns, b.launch, b.layer_out, host_node,
                        host, busy_ns, int(b.n_tokens),
                    )  # fmt: skip
                self._refresh_prompt_plans()
        else:
            ref = measured
            if self._default_bound is not None:
                self._default_bound.idle(measured)
        if phase == "decode" and not self.clock_coupled:
            # measured time says nothing of the clock: the debt is what the plan
            # committed, at its worst case, against the plan's own reference (the
            # template at the top level). Not the measured one: that is host time, and
            # on a loaded host a probe slowed by the load set it far above what the
            # plans predict, so every plan looked faster than the reference (debt -110
            # ms after 25 graphs, every later graph at the bottom level, +10-15%
            # simulated TPOT per request at a 2% budget). A graph with no plan of its
            # own (a top-level probe, the first graphs, a late plan's fallback) adds
            # neither debt nor reference
            p = self._planned.get(b.graph)
            if p is not None:
                self._account(phase, p.ref_ns + max(p.excess_ns, 0.0), p.ref_ns)
        else:
            self._account(phase, measured, ref)
            if phase == "decode" and b.n and measured > 0:
                self._charge_shift(measured, ref, top_ref, jump)
        self._t_end_prev, self._prev_phase = b.t_end_ns, phase
        if self._default_bound is not None:
            share_after = self._decode_share_hi if phase == "decode" else None
            self._bound_snap = (b.t_end_ns, self._default_bound.snapshot(), share_after)
        self._graph = b.graph
        if phase == "decode":
            # again at what the decode has taught the model (a request's last graph may
            # reach the planner only once the next prompt has begun)
            self._refresh_prompt_plans()
        for k in [k for k in self._planned if k <= b.graph]:
            del self._planned[k]
        if not self.planning or (self._req_ends and self._req_ends[-1] >= b.t_end_ns):
            return None  # the request ended after this graph: no next graph to plan
        return self._plan_next(b.t_end_ns, b.graph, max(1, b.ahead))

    def _charge_shift(self, measured: float, ref: float, top_ref: float, jump: int) -> None:
        """Keep the decode graphs from a jump of the time scale (``jump``: 1 up, -1
        down, 0 none) to the next top-level probe; where the probe confirms a shift
        the same way (its time off the old reference by more than ``PROBE_SHIFT``),
        charge them again against the old top-level reference scaled by the probe's
        ratio: slower, a credit never past a graph's own time; faster (the load went),
        a debit (``SHIFT_WINDOW``). A probe that disagrees changes nothing."""
        ratio, opened = self._probe_ratio, self._since_shift
        if ratio is not None:  # this graph was a probe: it closes the window
            self._since_shift = None
            way = 1 if ratio > 1.0 + PROBE_SHIFT else -1 if ratio < 1.0 - PROBE_SHIFT else 0
            if opened is not None and way and way == opened[0]:
                for g_measured, g_ref, g_top in opened[1]:
                    if way > 0:  # slower: a credit, never past the graph's own time
                        new_ref = max(min(g_measured, g_top * ratio), g_ref)
                    else:  # faster (the load went): a debit
                        new_ref = min(g_top * ratio, g_ref)
                    # the reference's change, with no time of its own
                    self._account("decode", 0.0, new_ref - g_ref)
                self.shift_credits += 1
            return
        if opened is None:
            if not jump:
                return
            opened = self._since_shift = (jump, [])
        window = opened[1]
        window.append((measured, ref, top_ref))
        if len(window) > SHIFT_WINDOW:
            self._since_shift = None  # no probe came: the debt stays as charged

    def _plan_error_stats(self) -> tuple[StallStats, StallStats]:
        """Fresh error statistics of plans: relative graph-time errors (the tube) and
        the gain's overruns."""
        return (
            StallStats(window=64, quantile=self._tube_q, prior_ns=0.05),
            StallStats(window=32, quantile=self._tube_q, prior_ns=1.0),
        )

    def _forget_old_model(self, phase: str) -> None:
        """After a refit: the model's slowdown was wrong, so what was learnt against it
        is too -- the gain, the time scale, the errors of plans made with it, the levels
        counted as run. (The probes sort their nodes again by themselves once the model
        has moved: ``PROBE_RESORT``.)"""
        self._slow_gain = 1.0
        self._time_scale.pop(phase, None)
        self.rel_err, self._gain_err = self._plan_error_stats()
        # and no level below the top has been run under the new model: each is at its
        # worst case again until a graph runs there (a refit that took compute as
        # free, its grid walked to the floor, planned 20 blocks a level where they ran
        # 1.8x slower: +6% TPOT at a 5% budget on a generated 9-level tz profile)
        self._lowest_seen[phase] = self.top

    def _reference_ns(
        self,
        phase: str,
        x: np.ndarray,
        min_hz: float,
        measured: float,
        host: float,
        top_ns: float,
        work: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> float:
        """The latency reference of one graph: what it takes at the top level.

        The default governor can never be faster than the top clock, so a budget kept
        against the top level is kept against the default -- on any GPU, whatever its
        governor does (a shadow of the governor, driven by our model, misjudged a
        threshold rule like msm-adreno-tz's by 7-34% on the shipped profiles and ran
        2-5x over the budget). The price: where the default is slower than the top
        clock, that slowness is not spent (the hindsight ``static-best``/``phase``
        can). The top-level time is measured, not modelled: every ``PROBE_EVERY``
        graphs of a phase one runs wholly at the top level (:meth:`_plan_next`), and
        graphs in between are scaled from it by the model's top-level ratio (context
        growth), the median over the last ``PROBES_KEPT`` probes. Conditions change
        (another app's DRAM load comes or goes): a graph below the top that ran faster
        than this reference means the probes are stale, and a probe off the reference
        means the median is; either brings probes forward (``PROBE_SHIFT``). The graphs
        from a jump of the measured/model time ratio to the next probe are charged again
        at the probe's ratio where it confirms the shift (:meth:`_charge_shift`).

        ``x``: the graph's regressors (at the clocks it ran at); ``min_hz``: the lowest
        mean clock any of its nodes ran at; ``top_ns``: the current model's time of
        this graph at the top level, host time included; ``work``: its nodes' compute
        and memory times and launches (a probe keeps them, to sort its nodes again once
        the model moves)."""
        pm = self.model.phases[phase]
        probes = self._top_probe.get(phase)
        self._probe_ratio = None
        if min_hz >= self.levels_hz[self.top] * 0.999:
            # a probe keeps its regressors (at the top clock), so its top-level time can
            # be re-evaluated under the current model for a 5-vector product
            burst = self._probe_burst.get(phase, 0)
            ratio = measured / self._probed_ref(pm, probes, top_ns) if probes else None
            off = abs(ratio - 1.0) if ratio is not None else 1.0
            self._probe_ratio = ratio
            if probes and off > PROBE_SHIFT:
                burst = PROBES_KEPT - 1  # conditions changed: re-measure the median
            elif burst > 0:
                burst -= 1
            self._probe_burst[phase] = burst
            every = self._probe_every.get(phase, PROBE_EVERY)
            every = min(2 * every, PROBE_EVERY_MAX) if off <= PROBE_AGREE else PROBE_EVERY
            self._probe_every[phase] = every
            self.probes += 1
            probe = _Probe(measured, x, host, work, (float(pm.theta[0]), float(pm.theta[1])))
            self._top_probe.setdefault(phase, deque(maxlen=PROBES_KEPT)).append(probe)
            self._since_probe[phase] = 0
            return measured
        self._since_probe[phase] = self._since_probe.get(phase, 0) + 1
        if not probes:
            return measured
        ref = self._probed_ref(pm, probes, top_ns)
        if self.clock_coupled and measured < ref * (1.0 - PROBE_SHIFT):
            # faster below the top than the probes say the top is: no lower clock is
            # faster, so the probes are stale (a DRAM load they ran under has gone)
            self._probe_burst[phase] = max(self._probe_burst.get(phase, 0), 1)
        return ref

    @staticmethod
    def _probed_ref(pm: PhaseModel, probes: deque[_Probe], top_ns: float) -> float:
        """The top-level time the recent probes give a graph whose model time at the
        top level is ``top_ns``: each probe's measured time scaled by context growth
        (both graphs through the *current* model at the top level, so a drift of the
        model's fit cancels out of the ratio), the median over the probes, so one probe
        slowed or sped up by the host does not set the reference (a clamp to this
        graph's measured time would make timing noise a ratchet: it could only ever add
        debt)."""
        th = pm.theta
        th_c, th_m = float(th[0]), float(th[1])
        for i, pr in enumerate(probes):
            # a probe's nodes' sides judged again once the model has moved: sides kept
            # from when it ran drifted the ratio 2.3% over a default at the top within
            # one request after a refit (+6.0% TPOT at a 5% budget, generated tz GPU)
            c0, m0 = pr.theta
            if abs(th_c / c0 - 1.0) > PROBE_RESORT or abs(th_m / m0 - 1.0) > PROBE_RESORT:
                x = pm.features(*pr.work, pm.f_max_hz)
                probes[i] = pr._replace(x=x, theta=(th_c, th_m))
        scaled = sorted(
            pr.measured_ns * top_ns / max(float(pr.x @ th) + pr.host_ns, 1.0) for pr in probes
        )
        mid = len(scaled) // 2
        return scaled[mid] if len(scaled) % 2 else 0.5 * (scaled[mid - 1] + scaled[mid])

    def _measured_bounds(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        measured: float,
        counted_busy_ns: float | None = None,
    ) -> _MeasuredBounds:
        """Bounds of this graph were it run wholly at each level, from its measured time
        alone (no model): below, its time: ``measured - sum over the time t it ran at
        a level l below L of t * (1 - 1 / s(l, L))``, ``s`` the most a kernel can speed
        up from l to L (the clock ratio, or the published DRAM ratio where larger) --
        at and below the lowest level it ran at, its measured time (a lower clock is
        never faster); above, its kernel time: ``sum of t * s(L, l)`` over the levels
        l above L it ran at, plus the time it ran at or below L. Each clock is taken at
        its lowest (for the time) or highest (for the kernel time) over a switch
        latency after each switch's landing: an applied switch may land up to a switch
        latency after it was due (a queued vote). Also the level the graph ran at
        throughout by both, if one, and the highest it may have run at.

        ``counted_busy_ns``: the graph's busy time as the device's counters gave it,
        where they did. The kernel time above is then at most that busy time grown by
        the most any level it ran at slows at L: the nodes' spans also hold the GPU's
        idle gaps between submissions, which no clock changes (sim generic, one kernel
        per submission: spans 23.4 ms, counted busy 14.9 ms at the top, and that busy
        share held the default's bound at the top after each prompt)."""
        # (the ufuncs' own reduce: ndarray.min/max add ~1 us of Python each)
        t0, t1 = float(np.minimum.reduce(starts)), float(np.maximum.reduce(ends))
        lat = float(self.switch_latency_ns)
        h = np.asarray(self._hist_t, dtype=np.float64)
        i0 = int(np.searchsorted(h, t0 - lat, side="right"))
        i1 = int(np.searchsorted(h, t1, side="right"))
        marks = h[i0:i1]
        bounds = np.unique(np.concatenate(([t0], marks, marks + lat, [t1 + 1.0])))
        bounds = bounds[(bounds >= t0) & (bounds <= t1 + 1.0)]
        now = [self.level_at(int(t)) for t in bounds[:-1]]
        before = [self.level_at(int(t - lat)) for t in bounds[:-1]]
        # each node's time inside each clock interval
        over = np.minimum(ends[:, None], bounds[None, 1:]) - np.maximum(
            starts[:, None], bounds[None, :-1]
        )
        per_iv = np.maximum(over, 0.0).sum(axis=0)
        n = self.n_levels
        t_lo = np.bincount(np.minimum(now, before), weights=per_iv, minlength=n)
        t_hi = np.bincount(np.maximum(now, before), weights=per_iv, minlength=n)
        # (wholly: every clock interval at that level by its highest reading, and most of
        # them by its lowest)
        ran_hi = np.nonzero(t_hi)[0]
        busy_ns = t_hi @ self._slowdown_most
        if counted_busy_ns is not None and len(ran_hi):
            grown = self._slowdown_most[ran_hi].max(axis=0)
            busy_ns = np.minimum(busy_ns, counted_busy_ns * grown)
        return _MeasuredBounds(
            measured - t_lo @ self._speedup_share,
            busy_ns,
            int(ran_hi[0]) if len(ran_hi) == 1 and np.argmax(t_lo) == ran_hi[0] else None,
            int(ran_hi[-1]) if len(ran_hi) else None,
        )

    def _bound_reference(
        self,
        phase: str,
        g: PhaseTemplate,
        host: float,
        ref: float,
        meas: _MeasuredBounds,
    ) -> float:
        """The reference of a graph where the default's time has a lower bound
        (``control.default_bound``): the larger of the top level's time (``ref``) and
        the bound. Also sets the next graph's expected reference (``_last_ref_ns``).

        The bound runs the default's rule on its own timeline with this graph's times
        per level: for the rule's busy share the upper estimate (the lesser of the
        model's busy time -- its slowdown scaled by the learnt gain where over 1, below
        the lowest level the phase has run at that level's times the most a lower clock
        can slow a kernel, widened by the tube ``r`` -- and the measured bound,
        ``meas.busy_ns``); for the time the lower one (the greater of the model's time at
        the level, or at the lowest level the phase has run at where that is higher, its
        slowdown scaled by the gain where under 1, less the tube, and the measured
        bound, ``meas.lo_ns``). A prompt graph puts the bound at the top."""
        lo_meas, busy_meas = meas.lo_ns, meas.busy_ns
        bound = self._default_bound
        assert bound is not None
        r = self.rel_err.estimate().upper_ns
        top_t = float(g.graph_ns[self.top])
        if phase == "prefill":
            # the next decode graph's expected reference is the top level's again
            if "decode" in self._top_ref_ns:
                self._last_ref_ns["decode"] = self._top_ref_ns["decode"]
            self._anchor_ns = None  # a new request: a new context
            self._busy_wholly = {}
        else:
            self._top_ref_ns[phase] = ref
            # a later decode graph of the same request is at least as slow at each level as
            # this one (its context is no shorter): this graph's measured bound, kernel time
            # only (host time is its own), bounds theirs
            kern = (lo_meas - host) * (1.0 - ANCHOR_MARGIN)
            anchor = self._anchor_ns
            hi = meas.fastest_at
            # (the measured time: this graph's own bound at the bottom level)
            if anchor is not None and hi is not None and float(anchor[hi]) > lo_meas[0] - host:
                # this graph's kernels took less than the anchor holds at the fastest
                # clock they ran at: what slowed the earlier graphs has gone (another
                # app's DRAM load), not the context. The anchor starts again from here.
                # (Kept, it held the reference 18% over the default's for 16 graphs
                # after the load went, and the plans spent it: sim generic, the sweep's
                # changing background load, +4.1% TPOT at a 2% budget)
                anchor = None
            self._anchor_ns = kern if anchor is None else np.maximum(anchor, kern)
            lo_meas = np.maximum(lo_meas, self._anchor_ns + host)
            lv = meas.wholly_at
            if lv is not None:
                self._busy_wholly[lv] = (float(busy_meas[lv]), float(self.graphs))
        seen = self._seen_for(phase)
        at_seen = np.maximum(np.arange(self.n_levels), seen)
        # time: the model's (at the lowest level run, below it), its slowdown below the
        # top scaled by the learnt gain where under 1, less the tube; never below what
        # this graph's own measured time bounds it by
        model_t = top_t + min(1.0, self._slow_gain) * (g.graph_ns[at_seen] - top_t)
        lo = np.maximum(model_t * max(0.0, 1.0 - r), lo_meas)
        if phase == "decode":
            # at the top level the default is no slower than the top level's measured
            # reference: a model whose speedup to the top is short of the truth put it
            # 4% over a default that ran wholly at the top (generated simple_ondemand
            # profile, +2.24% TPOT at 2%)
            lo[self.top] = min(float(lo[self.top]), ref)
        # busy time: the model's, its slowdown below the top scaled by the learnt gain
        # (widened) where over 1, plus the tube; below the lowest level run, that
        # level's times the most a lower clock can slow a kernel (_speedup_share)
        k_hi = max(1.0, self._slow_gain * max(1.0, self._gain_err.estimate().upper_ns))
        busy_top = max(top_t - host, 0.0)
        busy = np.maximum(g.graph_ns - host, 0.0)
        busy_hi = (busy_top + k_hi * np.maximum(busy - busy_top, 0.0)) * (1.0 + r)
        slow = 1.0 / np.maximum(1.0 - self._speedup_share[:, seen], 1e-9)
        busy_hi[:seen] = busy_hi[seen] * slow[:seen]
        busy_hi = np.minimum(busy_hi, busy_meas)
        if phase == "decode":
            for lv, (b_ns, then) in self._busy_wholly.items():
                grown = b_ns * (1.0 + WHOLLY_MARGIN + WHOLLY_GROWTH * (self.graphs - then))
                busy_hi[lv:] = np.minimum(busy_hi[lv:], grown)
        # the default's timeline: each graph its busy time at the upper bound (the
        # busiest window the rule can see) and its host time, never under its
        # lower-bound time
        dur = np.maximum(lo, busy_hi + host)
        share = np.minimum(1.0, busy_hi / np.maximum(dur, 1.0))
        pieces = graph_pieces(g.kernel_ns, g.host_ns, bound.poll_ns)
        got = bound.graph(dur, share, lo, pooled=phase == "decode", pieces=pieces)
        if phase == "prefill":
            return max(ref, got)
        if not self._bound_trusted():
            self._bound_over_top = 1.0  # the top level's reference: probes are due
            self._decode_share_hi = None
            return ref
        # the request's decode after this graph, until the planner learns it, is busy
        # at most this share at each level (its sampling stalls only lower it)
        self._decode_share_hi = share
        self._bound_over_top = got / max(ref, 1.0)
        # the next graph's expected reference, for its plan only (its account takes
        # the bound above): the model's time at the bound's level, without the tube's
        # margin -- a graph run wholly there is no slower than the default's
        self._last_ref_ns[phase] = max(
            self._last_ref_ns[phase], bound.next_lo(np.maximum(lo, model_t))
        )
        return max(ref, got)

    def _hindsight_reference(self, phase: str, graph: int, ref: float, top_ref: float) -> float:
        """The diagnostic reference (``hindsight_reference_ns``): a decode graph's is
        the default's own time (never under the top level's); after any graph, the
        next decode graph's expected reference is the default's time for it."""
        got = self.hindsight_reference_ns
        assert got is not None
        nxt = got.get(graph + 1)
        if nxt is not None:
            self._last_ref_ns["decode"] = float(nxt)
        if phase != "decode" or graph not in got:
            return ref
        return max(float(got[graph]), top_ref)

    def _envelope_probe(self) -> int | None:
        """The level to run the next decode graph at wholly: the default's bound level
        (``control.default_bound``, the highest over the timer phases), where the last
        decode graph ran above it (the lowest level it spent ``SEEN_SHARE`` of its time
        at). At that level a graph is no slower than the default's (a lower clock is
        never faster), so its reference is its measured time (``_measured_bounds``):
        it costs no debt, and it measures the level the bound's next decisions depend
        on (the plans' own levels, set against a reference from a faster run, would
        creep down by the slack alone). None otherwise."""
        lv = self._bound_level()
        return lv if lv is not None and lv < self._last_min_level else None

    def _bound_trusted(self) -> bool:
        """Whether the model's plans hit closely enough for the default's bound, built
        from the model, to be a promise (``BOUND_TRUST_TUBE``)."""
        return self.rel_err.estimate().upper_ns <= BOUND_TRUST_TUBE

    def _bound_level(self) -> int | None:
        """The default's bound level (the highest over the timer phases), where there
        is a bound and a budget; else None."""
        bound = self._default_bound
        if bound is None or self.slack <= 0 or not self._bound_trusted():
            return None
        return bound.level_hi()

    def _note_levels(self, phase: str, level_ns: np.ndarray) -> int:
        """Remember the lowest level this graph spent at least ``SEEN_SHARE`` of its
        kernel time at (``level_ns``: its time per level), and return it (the top level
        where there is none)."""
        total = float(level_ns.sum())
        if total <= 0:
            return self.top
        least = SEEN_SHARE * total
        lowest = next((i for i, t in enumerate(level_ns.tolist()) if t >= least), None)
        if lowest is None:
            return self.top
        self._lowest_seen[phase] = min(self._lowest_seen.get(phase, self.top), lowest)
        return lowest

    def _seen_for(self, phase: str) -> int:
        """The levels below this one are taken at their worst case (:meth:`_cautious`)."""
        # a prompt's plan is made from another prompt's template (its length unknown
        # until it arrives): a long prompt is compute-bound where a short one was not,
        # so every level below the top is taken at its worst case there
        if phase == "prefill" or not self.clock_coupled:
            return self.top
        return self._lowest_seen.get(phase, self.top)

    def _cautious(self, phase: str, tpl: PhaseTemplate) -> CautiousTables:
        """The template's tables with the levels the phase has not run at yet (below
        the lowest seen) at their worst case: each block's kernel time at the top
        level slowed by the whole clock ratio (or the published DRAM slowdown, where
        larger), never less than the model predicts. Safe exploration: a level's real
        time (GPU-DDR coupling, floors, anything the model has not seen) may be worse
        than the model says, so until the phase has run there the plans may only spend
        on it what they could afford were it as slow as clock scaling makes it; once
        run, the model (and the tube, the gain) take over. Blocks that are mostly host
        time (a batch's recording gap) cost little even at the worst case, so the low
        levels are met there first."""
        seen = self._seen_for(phase)
        if tpl.safe_seen == seen:  # tabulated with these (the C pass)
            if phase == "prefill":  # the worst case is the likely case there
                return CautiousTables(*tpl.safe)
            # the model's energy with the worst case's time: a level not run yet is
            # tried where the model says it saves, and only as far as its worst-case
            # time fits the budget
            return CautiousTables(tpl.safe[0], tpl.energy_j, tpl.safe[2], tpl.block_energy_j)
        key = (id(tpl), seen)
        got = self._cautious_cache
        if got is not None and got[0] == key and got[1] is tpl:
            return got[2]
        block_ns, block_e = tpl.block_ns, tpl.block_energy_j
        graph_ns, energy = tpl.graph_ns, tpl.energy_j
        if seen > 0:
            host_b = np.add.reduceat(tpl.host_ns, tpl.edges[:-1])[:, None]
            kern_top = block_ns[:, self.top : self.top + 1] - host_b
            low = block_ns[:, :seen]
            worst = np.maximum(low, kern_top * self._worst_ratio[:seen] + host_b)
            extra = worst - low  # >= 0: time the worst case adds (busy, at the level)
            block_ns = block_ns.copy()
            block_ns[:, :seen] = worst
            block_e = block_e.copy()
            block_e[:, :seen] += extra * self.power.busy_w[:seen]
            graph_ns = graph_ns.copy()
            graph_ns[:seen] += extra.sum(axis=0)
            energy = energy.copy()
            energy[:seen] = block_e[:, :seen].sum(axis=0)
        out = CautiousTables(graph_ns, energy, block_ns, block_e)
        self._cautious_cache = (key, tpl, out)
        return out

    def probe_due(self, phase: str) -> bool:
        """A graph of ``phase`` is due to run wholly at the top level (the latency
        reference's probe, every ``PROBE_EVERY`` graphs, or at once where the probes
        were found stale: ``PROBE_SHIFT``)."""
        if self._probe_for.get(phase, -1) > self._graph:
            return False  # one is planned for a graph not run yet (plans ahead)
        if phase == "decode" and self._bound_over_top > 1.0 + PROBE_SKIP_MARGIN:
            # the default's bound sets the reference (``max(top level's, bound)``),
            # clear of the top level's time: a top-level probe would cost energy to
            # refine a figure not in use (a stale one can only matter where it is the
            # larger). Due again at once (the count runs on) when the bound nears it.
            return False
        if self._probe_burst.get(phase, 0) > 0:
            return True  # conditions changed: the reference is re-measured
        every = self._probe_every.get(phase, PROBE_EVERY)
        return self._since_probe.get(phase, every) >= every

    # ---- the optimisation -----------------------------------------------------------

    def _sample_estimate(self, ahead: int = 1) -> StallEstimate:
        """The sampling stall before the graph ``ahead`` after the one that just ended:
        right after a prompt, the after-prompt stalls' (where one has been seen), else
        the decode's (planning two ahead past a prompt, the stall before the target
        follows the first decode graph: a decode's)."""
        if ahead <= 1 and self._prev_phase == "prefill" and self._after_prefill.estimate().n:
            return self._after_prefill.estimate()
        return self.forecast.estimate(StallKind.SAMPLE)

    def _stall_ns(self, ahead: int = 1) -> tuple[float, float, float]:
        """Forecast of the inter-graph stall (sample + submit) before the graph
        ``ahead`` after the one that just ended: median, lower bound, and how far below
        the lower bound one has ended."""
        s = self._sample_estimate(ahead)
        u = self.forecast.estimate(StallKind.SUBMIT)
        early = (s.lower_ns - s.min_ns) + (u.lower_ns - u.min_ns)
        return s.typical_ns + u.typical_ns, s.lower_ns + u.lower_ns, early

    def _prefill_level(self, n_tokens: int) -> int:
        """The level a request starts its prompt of ``n_tokens`` at (the raise at
        REQUEST_BEGIN): the first of the plan it will take (:meth:`_prompt_plan_for`);
        else the cheapest
        single level whose time, every level below the top at its worst case, keeps
        the TTFT budget against the top level's over the last prefill's template; the
        top level when there is no template yet (a graph with no template cannot be
        followed inside the decode)."""
        tpl = self._templates.get("prefill")
        if tpl is None:
            return self.top
        got = self._prompt_plan_for(int(n_tokens))
        if got is not None:
            return got.first
        r = self.rel_err.estimate().upper_ns
        ct = self._cautious("prefill", tpl)
        ok = ct.graph_ns * (1.0 + r) <= ct.graph_ns[self.top] * (1.0 + self.slack)
        cand = np.where(ok, ct.energy_j, np.inf)
        return int(cand.argmin()) if np.isfinite(cand).any() else self.top

    def _timing_risk(
        self, tpl: PhaseTemplate, block_ns: np.ndarray, r: float
    ) -> np.ndarray | float:
        """Time a gap block's level risks through its switches landing off time. A
        block that is mostly host time (a batch's recording gap) has its raise inside
        the gap, where no ask comes: it is timed from the graph's start by the
        predicted elapsed time, which is off by up to ``r`` (the tube's relative
        graph-time error) of the block's start offset; a level switched into that
        much early or late slows that much of the neighbouring work by the level's
        clock ratio. Where the model times the graph well this is nothing; where it
        does not, a drop to the bottom in a 1 ms gap stops being worth its risk."""
        gap = tpl.gap_blocks
        if r <= 0 or gap is None:  # no measured gaps (graph granularity): no such block
            return 0.0
        return self._open_loop_risk(block_ns, np.where(gap, r, 0.0))

    def _open_loop_risk(self, block_ns: np.ndarray, err: float | np.ndarray) -> np.ndarray:
        """Time each block's level risks where its switch is timed from the graph's
        start (every block at ``graph`` granularity, where no completion is seen during
        compute; a gap block's raise elsewhere): the switch lands where the graph is
        after the predicted time of the block's start, which is off by up to ``err``
        (per block, or one for all) of that offset, so that much of the neighbouring
        work runs at the block's level, slowed by its clock ratio. A level late in the
        graph risks the most, so an open-loop plan runs its low levels early.

        (Without it, the 968-token prompt of the gemma recording, its time predicted
        16% short from an 11-token prompt's fit, ran its last block's drop at 82% of
        the way instead of 95%, and ran over its own TTFT budget at graph granularity:
        sim adreno640 +2.68% at 2%, +5.39% at 5%; sim generic +2.60% at 2%.)"""
        top_t = block_ns[:, self.top]
        start = np.cumsum(top_t) - top_t
        return (err * start)[:, None] * self._clock_slowdown[None, :]

    def _prompt_time_err(self, n_tokens: int, r: float) -> float:
        """How far off a prompt plan's predicted elapsed time may be: the tube's ``r``,
        at least ``PROMPT_TOL`` for a prompt ``PROMPT_FAR`` times longer than the one its
        time scale was measured on (or where none was)."""
        fit = self._prompt_fit
        far = fit is None or n_tokens > PROMPT_FAR * fit.tokens
        return max(r, PROMPT_TOL) if far else r

    def _prepare_prefill(self, tpl: PhaseTemplate, n_tokens: int) -> None:
        """The next prompt's per-block plan, from this prompt graph's template (off the
        engine thread; :meth:`_prefill_plan` only scales it to the prompt's length).
        The blocks share the TTFT budget of a request that has spent none yet: the
        cheapest per-block levels whose time fits the top level's time times ``1 +
        slack``, tightened by the tube (``rel_err``) and with the levels the prompt
        has not run at at their worst case (:meth:`_cautious`)."""
        self._prefill_next = None
        if self.planning is False or tpl.n == 0:
            return
        self._prefill_next = self._solve_prompt(tpl, self._cautious("prefill", tpl), n_tokens)

    def _solve_prompt(
        self,
        tpl: PhaseTemplate,
        ct: CautiousTables,
        n_tokens: int,
        ramp: float = 0.0,
        unless: np.ndarray | None = None,
    ) -> _PromptPlan | None:
        """A prompt's per-block plan from its template's tables ``ct``, or None where
        nothing fits (or where its blocks' levels are ``unless``'s: the plan made
        already, its switches not timed again). ``ramp``: the default is slower than
        the top level by at least this share of its time (a ramp); the slack is of that
        slower time, and the tube widens only the plan's slowdown over the top level's
        time, as without one."""
        r = self.rel_err.estimate().upper_ns
        top_t = float(ct.graph_ns[self.top])
        cap = top_t * (1.0 + (ramp + self.slack * (1.0 + ramp)) / (1.0 + r))
        risky = ct.block_ns + self._timing_risk(tpl, ct.block_ns, r)
        if self.granularity == "graph":
            risky = risky + self._open_loop_risk(ct.block_ns, self._prompt_time_err(n_tokens, r))
        got = block_levels(ct.block_energy_j, risky, cap)
        if got is None:
            return None
        blocks = dwell_merge(got[0], ct.block_ns, self.switch_latency_ns)
        if unless is not None and np.array_equal(blocks, unless):
            return None
        rows = np.arange(len(blocks))
        used = float(risky[rows, blocks].sum())
        sw, predicted, _ = self._block_switches(tpl, blocks)
        margin = max(0.0, cap - used) + r * max(used - top_t, 0.0)
        return _PromptPlan(
            tpl, max(int(n_tokens), 1), sw, int(blocks[0]), predicted, margin, blocks,
            energy_j=float(ct.block_energy_j[rows, blocks].sum()),
        )  # fmt: skip

    def _refresh_prompt_plans(self) -> None:
        """Make the plans for the next prompt again (:meth:`_prepare_prompt_plans`)
        where what they are made from changed: the lowest level the decode has run at,
        the prompt graph they are fitted to, the micro-batch size; or, at most every
        ``PROMPT_REPLAN_GRAPHS`` graphs, the decode model's efficiencies or the tube by
        ``PROMPT_REPLAN``."""
        th = self.model.phases["decode"].theta
        key = (self._lowest_seen.get("decode", self.top), id(self._prompt_fit), self._ubatch)
        moved = (
            round(math.log(max(float(th[0]), 1e-9)) / PROMPT_REPLAN),
            round(math.log(max(float(th[1]), 1e-9)) / PROMPT_REPLAN),
            round(self.rel_err.estimate().upper_ns / PROMPT_REPLAN),
        )
        last_key, last_moved, at = self._prompt_plans_key
        if key != last_key or (moved != last_moved and self.graphs - at >= PROMPT_REPLAN_GRAPHS):
            self._prompt_plans_key = (key, moved, self.graphs)
            self._prepare_prompt_plans()

    def _prepare_prompt_plans(self) -> None:
        """Plans for the next prompt at each of ``_prompt_lengths`` (off the
        engine thread), where a one-token graph and a one-micro-batch prompt graph of
        the same nodes have run: each node's compute and memory time is taken as
        affine in the micro-batch's tokens through the two, and micro-batches of
        ``_ubatch`` tokens (as prompt graphs show it) follow each other. A prompt's time
        per level depends on its length -- a short one streams the weights as a decode
        graph does, a long one computes -- so the plan made from the last prompt alone
        held every level below
        the top at its worst case, or took a short prompt's blocks for a long one's
        (sim adreno650, gemma recording: a 968-token prompt was planned from an 11-token
        one, its times scaled 88x).

        The time model is the decode phase's (its levels run, so measured), scaled to
        the prompt's measured time; a node that computes more per byte at the prompt's
        length than in the one-token graph (``GROWS_INTENSITY``: a weight matrix's
        product) is taken as wholly compute-bound there, slowed by the whole clock
        ratio below the top; every node below the lowest level the decode has run at
        at its worst case (:meth:`_cautious`)."""
        dec, fit = self._templates.get("decode"), self._prompt_fit
        if not self.planning or dec is None or fit is None or len(fit.c_ns) != dec.n:
            self._prompt_ahead = (None, {})
            return
        c1, m1, launch, layer_out, host_node, host, busy, n1 = fit
        pm = self.model.phases["decode"]
        theta = pm.theta_now()
        _, ratio, coupling = pm.level_terms(self.levels_hz)
        slope_c = np.maximum(c1 - dec.c_ns, 0.0) / (n1 - 1)
        slope_m = np.maximum(m1 - dec.m_ns, 0.0) / (n1 - 1)
        # the measured prompt against the decode's model: the time scale
        ones, zeros = np.ones(1), np.zeros(1)
        k1 = plan_native.kernel_times_numpy(c1, m1, launch, theta, ones, zeros)[0]
        seen = self._lowest_seen.get("decode", self.top) if self.clock_coupled else self.top
        aff = _PromptModel(
            np.maximum(dec.c_ns - slope_c, 0.0), slope_c,
            np.maximum(dec.m_ns - slope_m, 0.0), slope_m,
            launch, layer_out, host_node, host, theta, ratio, coupling,
            dec.c_ns / np.maximum(dec.m_ns, 1e-9), busy / max(float(k1.sum()), 1.0), seen,
            self._ubatch,
        )  # fmt: skip
        plans: dict[int, _PromptPlan] = {}
        lengths = _prompt_lengths(aff.ubatch)
        bound = self._default_bound
        # the longest ramp there can be: the envelope is at the top once a poll has seen
        # a wholly busy window (``PROMPT_RAMP_POLLS``)
        ramp_max_ns = PROMPT_RAMP_POLLS * bound.poll_ns + self.switch_latency_ns if bound else 0.0
        for k, tokens in enumerate(lengths):
            tpl = self._prompt_template(aff, _ubatches(tokens, aff.ubatch))
            ct = CautiousTables(*tpl.safe)
            got = self._solve_prompt(tpl, ct, tokens)
            if got is None:
                continue
            ramped: list[tuple[float, _PromptPlan]] = []
            if bound is not None and self.slack > 0:
                last = got.blocks
                # the shortest prompt that takes this plan: its top-level time, scaled
                # by tokens (a shorter prompt's own is longer: its weights' time stays)
                shortest = lengths[k - 1] + 1 if k else 1
                top_short = float(ct.graph_ns[self.top]) * shortest / tokens
                for q in PROMPT_RAMP_STEPS:
                    if q * top_short > ramp_max_ns:
                        break  # no prompt that takes this plan ramps that long
                    more = self._solve_prompt(tpl, ct, tokens, ramp=q, unless=last)
                    if more is None:
                        continue  # none, or the same plan as the smaller share's
                    last = more.blocks
                    ramped.append((q, more._replace(aid=self._retime_aid(aff, more))))
            plans[tokens] = got._replace(aid=self._retime_aid(aff, got), ramped=tuple(ramped))
        self._prompt_ahead = (aff, plans)

    @staticmethod
    def _prompt_work(
        aff: _PromptModel, per: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Compute ns, memory ns and launches of a prompt of micro-batches ``per``, a
        node that computes more per byte than in the one-token graph made wholly
        compute-bound at its top-level time (every lower clock slows it fully)."""

        def each(base: np.ndarray, slope: np.ndarray) -> np.ndarray:
            parts = [base + slope * n for n in per]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        def tiled(x: np.ndarray) -> np.ndarray:
            return x if len(per) == 1 else np.tile(x, len(per))

        c, m = each(aff.base_c, aff.slope_c), each(aff.base_m, aff.slope_m)
        lau = tiled(aff.launch)
        grows = c > tiled(GROWS_INTENSITY * aff.intensity_1) * np.maximum(m, 1e-9)
        if grows.any():
            th = aff.theta  # the roof at the top level (coupling 0 there)
            hi = plan_native.roof_ns(c * th[0], m * th[1], float(th[2]))
            c = np.where(grows, hi / max(float(th[0]), 1e-9), c)
            m = np.where(grows, 0.0, m)
        return c, m, lau

    def _prompt_template(self, aff: _PromptModel, per: list[int]) -> PhaseTemplate:
        """The tabulated template of a prompt whose micro-batches hold ``per`` tokens
        (:meth:`_prepare_prompt_plans`)."""
        k = len(per)
        c, m, lau = self._prompt_work(aff, per)
        tpl = PhaseTemplate(c, m, lau, np.tile(aff.layer_out, k))
        gaps = None if aff.host_node is None else np.tile(aff.host_node, k)
        tpl.tabulate(
            aff.theta, aff.ratio, aff.coupling, aff.host_ns * k, self.power, aff.scale, gaps,
            self._worst_ratio, aff.seen, self.switch_latency_ns,
        )  # fmt: skip
        return tpl

    def _retime_aid(self, aff: _PromptModel, got: _PromptPlan) -> _RetimeAid:
        """What :meth:`_retimed` needs of a plan made ahead, at its own length."""
        tpl, sw, blocks = got.tpl, got.switches, got.blocks
        lv_node = np.repeat(blocks, np.diff(tpl.edges))
        th = aff.theta
        timed = [i for i, x in enumerate(sw) if x.anchor is Anchor.OFFSET or x.expect_ns >= 0]
        s_ns = self.switch_latency_ns
        return _RetimeAid(
            aff,
            np.cumsum(tpl.node_ns(lv_node)),
            th[0] * aff.ratio[lv_node],
            th[1] + th[4] * aff.coupling[lv_node],
            float(th[2]),
            th[3] * plan_native.LAUNCH_NS * tpl.launch,
            tpl.host_ns,
            timed,
            np.array(
                [
                    sw[i].key + s_ns if sw[i].anchor is Anchor.OFFSET else sw[i].expect_ns
                    for i in timed
                ],
                dtype=np.float64,
            ),
        )

    def _retimed(
        self, per: list[int], aid: _RetimeAid, sw: list[Switch]
    ) -> tuple[list[Switch], float]:
        """A prompt plan's switches (made ahead at another length) with their times
        moved to a prompt of micro-batches ``per`` (as many nodes): each time goes
        through the two lengths' elapsed time at the plan's levels, node by node.
        Inline on the engine thread (~80 us for gemma): node times at the plan's levels
        only, all else made ahead (``_RetimeAid``)."""
        c, m, _ = self._prompt_work(aid.model, per)
        a = c * aid.ra
        b = m * aid.rb
        kern = np.maximum(plan_native.roof_ns(a, b, aid.th_x), aid.floor)
        ends_n = np.cumsum(kern * aid.model.scale + aid.host)
        t_n = np.interp(aid.t_b, aid.ends_ns, ends_n).tolist()
        s_ns = self.switch_latency_ns
        out = list(sw)
        for i, t in zip(aid.timed, t_n, strict=True):
            x = sw[i]
            if x.anchor is Anchor.OFFSET:
                out[i] = Switch(x.anchor, max(0, int(t - s_ns)), x.level, x.expect_ns)
            else:
                out[i] = Switch(x.anchor, x.key, x.level, int(t))
        return out, float(ends_n[-1])

    def _prompt_plan_for(self, n_tokens: int) -> _PromptPlan | None:
        """The plan made ahead for a prompt of ``n_tokens``: the shortest bucket at
        least as long (a longer prompt computes more per byte, so its levels slow it at
        least as much), else the longest; the last prompt's own where none was made."""
        plans = self._prompt_ahead[1]  # replaced whole by the planner: one read
        if not plans:
            return self._prefill_next
        fit = [t for t in plans if t >= n_tokens]
        return plans[min(fit)] if fit else plans[max(plans)]

    def _prompt_envelope(self, t_ns: int) -> list[tuple[int, int]] | None:
        """The default's level bound over a prompt that begins at ``t_ns`` (a request's
        begin): ``(t_ns, level)`` steps from :meth:`OndemandBound.envelope`, the time
        since the last graph learnt from taken as busy up to the last request's end and
        idle after it. None where there is no bound, nothing learnt yet, or the bound
        starts at the top level."""
        snap = self._bound_snap
        if snap is None or self.slack <= 0:
            return None
        prev, state, share_after = snap
        end = self._req_ends[-1] if self._req_ends and self._req_ends[-1] >= prev else t_ns
        end = min(end, t_ns)
        bound = self._default_bound
        assert bound is not None
        # the work between the last graph learnt from and the last request's end: that
        # graph's request decoding on (the share it was busy, an upper estimate), where
        # no other request began in between; else taken as busy throughout. (Busy
        # throughout, a short prompt after a request whose last decode graphs the
        # planner had not yet learnt -- it learns a graph when the next one begins --
        # put a timeline at the top 1.7 ms into the prompt: sim generic, tmpc's
        # prompts of 24 and 33 tokens ran at the top, 26-35 ms under the default's)
        share: np.ndarray | float = 1.0
        # (a copy in one C call: the planner trims the list while this thread reads it)
        begins = tuple(self._req_begins)
        if share_after is not None and not any(prev < t < t_ns for t in begins):
            share = share_after
        steps = bound.envelope(state, max(0, end - prev), max(0, t_ns - end), share)
        if steps[0][1] >= self.top:
            return None
        return [(t_ns + int(off), lv) for off, lv in steps]

    def _slack_beats_ramp(self, n_tokens: int, t_ns: int) -> bool:
        """Whether a prompt graph beginning at ``t_ns`` is better run on its solved
        plan (:meth:`_prefill_plan`: the slack spent against its top-level time) than
        on the envelope (:meth:`_envelope_plan`). Both keep the prompt no slower than
        the default's, one by the top level's time, one pointwise. The envelope saves
        only while it is below the top: the time its levels lose against the top over
        the prompt's work (the prompt plan's time per level, its clock's progress) is
        what it spends. The solved plan spends its predicted time over the top
        level's (at most the slack of it). The larger spend is taken: a long prompt
        ramps for a small part of its time (sim mali-g76, 968 tokens: 31 ms of ramp
        against up to 50 ms of a 2% slack), a short one mostly ramps (24 tokens: 4.9
        against up to 1.3 ms). Inline at the prompt's DECODE_BEGIN: a walk over the
        envelope's few steps."""
        got = self._prompt_plan_for(int(n_tokens))
        env = self._prompt_env
        if got is None or env is None or self.slack <= 0:
            return False
        scale = max(int(n_tokens), 1) / max(got.tokens, 1)  # the plan's length to this one
        level_ns = np.asarray(got.tpl.graph_ns, dtype=np.float64)
        top_ns = float(level_ns[self.top]) * scale
        pace = float(level_ns[self.top]) / np.maximum(level_ns, 1.0)  # progress per ns
        ramp_ns, _ = self._walk_envelope(env, t_ns, pace, top_ns)
        return got.predicted_ns * scale - top_ns > ramp_ns

    def _walk_envelope(
        self,
        env: list[tuple[int, int]],
        t_ns: int,
        pace: np.ndarray,
        top_ns: float,
        level_j: np.ndarray | None = None,
    ) -> tuple[float, float]:
        """A prompt of ``top_ns`` of top-level work beginning at ``t_ns`` on the envelope
        ``env``, each level progressing ``pace`` top-level ns per ns: the time its
        levels lose against the top level (its ramp), and, with ``level_j`` (the whole
        prompt's energy at each level), its energy (each level's share of the work at
        that level's energy; the rest at the top)."""
        ramp_ns, energy_j, work_ns = 0.0, 0.0, top_ns  # work left, in top-level ns
        for (t, lv), (t_next, _) in itertools.pairwise(env):
            if lv >= self.top or work_ns <= 0:
                break
            dur = min(max(0.0, t_next - max(t, t_ns)), work_ns / float(pace[lv]))
            done = dur * float(pace[lv])
            ramp_ns += dur - done
            work_ns -= done
            if level_j is not None:
                energy_j += done / top_ns * float(level_j[lv])
        if level_j is not None:
            energy_j += max(work_ns, 0.0) / top_ns * float(level_j[self.top])
        return ramp_ns, energy_j

    def _ramped_plan(self, n_tokens: int, t_ns: int) -> _PromptPlan | None:
        """The plan made ahead for a default slower than the top level by the largest
        of ``PROMPT_RAMP_STEPS`` that this prompt's ramp covers, or None. The ramp: the
        time the envelope's levels (:meth:`_prompt_envelope`, at or above the
        default's throughout) lose against the top level over the prompt's work, a
        lower bound of the default's: each level's progress per ns from the plan's
        template, made faster by the tube, and a level below the lowest the decode has
        run at taken as fast as that one (its time there is not measured, and a lower
        clock is never faster); none while the model is not trusted for the default's
        bound (``BOUND_TRUST_TUBE``). A prompt that ramps
        in the default runs on a plan solved against that slower time instead of
        either following the envelope (all its ramp spent, none of its slack) or the
        top level's plan (its slack spent, none of its ramp): sim mali-g76, gemma, the
        prompts of 11-33 tokens ran 25-48% under the default's time. Inline at the
        prompt's DECODE_BEGIN: a walk over the envelope's few steps."""
        got = self._prompt_plan_for(int(n_tokens))
        env = self._prompt_env
        if got is None or not got.ramped or env is None or self.slack <= 0:
            return None
        if not self._bound_trusted():  # the ramp is timed by the model
            return None
        scale = max(int(n_tokens), 1) / max(got.tokens, 1)
        level_ns = np.asarray(got.tpl.graph_ns, dtype=np.float64)
        top_ns = float(level_ns[self.top]) * scale
        r = self.rel_err.estimate().upper_ns
        pace = np.minimum(1.0, (1.0 + r) * float(level_ns[self.top]) / np.maximum(level_ns, 1.0))
        seen = self._lowest_seen.get("decode", self.top) if self.clock_coupled else self.top
        pace[:seen] = pace[seen]  # a lower clock is never faster
        # only where it is cheaper than the envelope, both priced as the planner prices
        # (a level not run yet at its worst case): on generated simple_ondemand GPUs a
        # short prompt's plan, its low levels unseen, ran high where the envelope runs
        # low (seed 34: -88% -> -184% saving at 5%, the prompts 33% under the default)
        safe_j = np.asarray(CautiousTables(*got.tpl.safe).energy_j, dtype=np.float64)
        ramp_ns, env_j = self._walk_envelope(env, t_ns, pace, top_ns, safe_j)
        share = ramp_ns / max(top_ns, 1.0)
        fit = [plan for q, plan in got.ramped if q <= share]
        return fit[-1] if fit and fit[-1].energy_j < env_j else None

    def _envelope_plan(self, t_ns: int) -> Plan:
        """Follow the prompt's envelope (:meth:`_prompt_envelope`) from ``t_ns``: each
        raise issued one switch latency before the bound's level can rise."""
        env = self._prompt_env
        assert env is not None
        s_ns = self.switch_latency_ns
        now_lv = env[0][1]
        sw = []
        for t, lv in env[1:]:
            if t - s_ns <= t_ns:
                now_lv = lv
            else:
                sw.append(Switch(Anchor.TIME, t - s_ns, lv))
        return Plan(
            fallback_level=self.top,
            switches=(Switch(Anchor.TIME, t_ns, now_lv), *sw),
        )

    def _followed_envelope(self, t0: int, t1: int) -> bool:
        """Whether the clock was at or above the envelope of the prompt that ran over
        ``[t0, t1]`` throughout (each switch as it landed): the latest envelope begun
        by ``t0``, of the request that began after the last graph learnt from."""
        prev = self._t_end_prev if self._t_end_prev is not None else -1
        # a copy first: the engine thread appends at each request's begin (copying a
        # deque is one C call under the GIL; iterating it here could see it mutate)
        envs = list(self._envelopes)
        env = next((e for e in reversed(envs) if prev < e[0][0] <= t0), None)
        if env is None:
            return False
        env_t = [t for t, _ in env]
        i0 = bisect.bisect_right(self._hist_t, t0)
        i1 = bisect.bisect_right(self._hist_t, t1)
        for t in [t0, *(t for t in env_t if t0 < t <= t1), *self._hist_t[i0:i1]]:
            if self.level_at(int(t)) < env[bisect.bisect_right(env_t, t) - 1][1]:
                return False
        return True

    def _top_plan(self, t_ns: int) -> Plan:
        """The top level from ``t_ns`` on, for this graph and any later one without a
        plan."""
        top = self.top
        return Plan(first_level=top, fallback_level=top, switches=(Switch(Anchor.TIME, t_ns, top),))

    def _flat_level(self, energy_j: np.ndarray, time_ns: np.ndarray, budget_ns: float) -> int:
        """The cheapest level a whole graph may run at, flat: its time (``time_ns`` per
        level, the gain and the cautious tables' worst cases in) within ``budget_ns``
        (the next graph's own, tube and debt in); the top level where none fits. For
        the first decode graph after a prompt, which starts with no plan of its own
        and ran at the top level (sim adreno650, gemma recording: 4 such graphs, 0.12
        J of the 0.29 J decode gap to the oracle)."""
        ok = time_ns <= budget_ns
        ok[self.top] = True
        return int(np.where(ok, energy_j, np.inf).argmin())

    def _droppable(self, d_lo: float, stalls: StallEstimate) -> bool:
        """Whether a stall whose lower bound is ``d_lo`` ns may drop to the bottom level
        (``DROP_SWITCHES``; ``stalls``: the stall kind's estimate, which must have seen
        one)."""
        return d_lo >= DROP_SWITCHES * self.switch_latency_ns and stalls.n > 0

    def _prefill_plan(
        self, n_tokens: int, t_ns: int, chosen: _PromptPlan | None = None
    ) -> Plan | None:
        """The plan of a prompt graph about to run (inline at its DECODE_BEGIN): the
        plan made ahead for its length (:meth:`_prompt_plan_for`), timed again at this
        prompt's own (:meth:`_retimed`; the last prompt's own plan is scaled); none (the
        request's level holds) when there is none, or when this request's prompt has
        already fallen behind its reference (a later chunk of a long prompt)."""
        got = self._prompt_plan_for(int(n_tokens)) if chosen is None else chosen
        first_chunk, self._prompt_first_chunk = self._prompt_first_chunk, False
        if not first_chunk and self._acc["prefill"][0] > 0:
            # a later chunk of a prompt already behind its reference: the top level
            # (the level the request began at would slow it further). The debt is this
            # request's only from its second chunk on: the planner resets it only once
            # the prompt's first graph is learnt from, so at the first chunk it is still
            # the last request's (a generated 4-level tz profile ran a whole prompt at
            # its request-begin level that way: +16.7% TTFT at a 10% budget)
            return self._top_plan(t_ns)
        if got is None:
            return None
        tpl, tokens, sw, first = got.tpl, got.tokens, got.switches, got.first
        predicted, margin, aid = got.predicted_ns, got.margin_ns, got.aid
        scale = max(int(n_tokens), 1) / tokens
        per = _ubatches(n_tokens, aid.model.ubatch) if aid is not None else []
        if scale != 1.0 and aid is not None and len(per) * len(aid.model.launch) == tpl.n:
            # the plan's times again at this prompt's own length (scaled by its tokens,
            # a 10-token prompt's timed switches, planned at 16, fired early: a node's
            # fixed time -- its weights -- does not shrink with the tokens; and the
            # first micro-batch's checkpoints of a 968-token prompt came 5% early)
            sw, predicted = self._retimed(per, aid, sw)
            margin, scale = margin * predicted / max(got.predicted_ns, 1.0), 1.0
        fit = self._prompt_fit
        if aid is not None and fit is not None and n_tokens > PROMPT_FAR * fit.tokens:
            # far beyond the prompt its time scale was measured on: the model's absolute
            # time (not its ratio between levels) may be off by a few percent
            margin = max(margin, PROMPT_TOL * predicted)
        if scale != 1.0:
            sw = [
                x
                if x.anchor is Anchor.NODE and x.level >= 0
                else Switch(
                    x.anchor,
                    int(x.key * scale) if x.anchor is Anchor.OFFSET else x.key,
                    x.level,
                    int(x.expect_ns * scale) if x.expect_ns >= 0 else -1,
                )
                for x in sw
            ]
        d_lo = self._sample_estimate().lower_ns
        droppable = self._droppable(d_lo, self._after_prefill.estimate())
        node_keyed = self.granularity in ("layer", "kernel")
        return Plan(
            first_level=first,
            end_level=0 if droppable else -1,
            fallback_level=self._after_prompt_lv,
            n_nodes=tpl.n,
            predicted_ns=int(predicted * scale),
            margin_ns=int(margin * scale),
            gain=self.gain if node_keyed else 0.0,
            switches=tuple(sw),
        )

    def _checkpoints(self, tpl: PhaseTemplate, ends: np.ndarray) -> list[Switch]:
        """Feedback checkpoints, one per block the callback observes the end of (a layer,
        ending at its ``l_out`` node; else a plan block): reached at the block's first
        ask, they carry the nominal elapsed time at the block's *last* completion, so
        the executor's comparison at earlier completions inside the block can only
        under-estimate the delay (no false raise), and is exact at the block's end."""
        last = np.nonzero(tpl.layer_out)[0]
        if len(last) == 0:
            last = tpl.edges[1:] - 1
        out: list[Switch] = []
        first = 0
        for i in last[:96]:
            out.append(Switch(Anchor.NODE, int(first), -1, int(ends[i])))
            first = int(i) + 1
        if 0 < first < tpl.n:
            # the nodes after the last block (a model's output head) against the graph's
            # end, not the last layer's: else every completion there looks late by the
            # head's whole time and raises the clock as the graph ends
            out.append(Switch(Anchor.NODE, int(first), -1, int(ends[-1])))
        return out

    def _plan_wholly(self, tpl: PhaseTemplate, target: int, lv: int) -> None:
        """What a plan that runs graph ``target`` wholly at ``lv`` (the default's bound
        level) predicts, so that the tube and the gain learn from the graph: it commits
        no debt (it is no slower than the default's). Only where measured time follows
        the clock, as for solved plans.

        (Not kept, a run of such graphs taught nothing: on sim mali-g76 replayed at
        ``graph`` granularity (gemma recording, 2%) the tube stayed at 0.079 from the
        request's first plans through every later graph, the default's bound built
        with it sat a level above the kernel-granularity run's, and tmpc ran -12.1%
        TPOT for -3.3% saving; with them, -6.8% and -1.2%.)"""
        if not self.clock_coupled:
            return
        ref_1 = max(float(tpl.graph_ns[self.top]), self._last_ref_ns.get("decode", 0.0))
        self._planned[target] = _Planned(
            tpl.n,
            float(tpl.graph_ns[lv]),
            float(tpl.block_ns[:, self.top].sum()),
            0.0,
            ref_1,
            0.0,
        )

    def _block_switches(
        self, tpl: PhaseTemplate, blocks: np.ndarray, scale: float = 1.0, share: bool = False
    ) -> tuple[list[Switch], float, np.ndarray | None]:
        """The switches (and checkpoints) that run ``tpl``'s blocks at ``blocks``, the
        graph's predicted time, and with ``share`` where each node ends as a share of
        the graph's time; times scaled by ``scale`` (a prompt of another length than
        the template's)."""
        s_ns = self.switch_latency_ns
        block_ends, node_share = plan_native.layout(
            tpl.kernel_ns, tpl.host_ns, tpl.block_ns, tpl.edges, blocks, share
        )
        if scale != 1.0:
            block_ends = block_ends * scale
        predicted = float(block_ends[-1]) if len(block_ends) else 0.0
        lv = blocks.tolist()
        changed = [j for j in range(1, len(lv)) if lv[j] != lv[j - 1]]
        sw: list[Switch] = []
        if self.granularity in ("layer", "kernel"):
            # keyed by the node whose ask comes one switch latency early
            lv_node = np.repeat(blocks, np.diff(tpl.edges))
            node_ns = tpl.node_ns(lv_node) * scale
            ends = np.cumsum(node_ns)
            starts = ends - node_ns
            t_edges = [float(starts[tpl.edges[j]]) for j in changed]
            keys = [int(x) for x in np.searchsorted(starts, np.subtract(t_edges, s_ns))]
            # no ask comes near when the switch must be issued (a host gap: the next
            # ask follows the gap): timed from the graph's start. The switch before
            # such a one is timed too: a graph running slower than planned would
            # otherwise see the timed raise fire before the node-keyed drop it undoes
            timed = [
                k < tpl.n and starts[k] - (t - s_ns) > 0.25 * s_ns
                for k, t in zip(keys, t_edges, strict=True)
            ]
            for i in range(len(timed) - 1):
                timed[i] = timed[i] or timed[i + 1]
            for j, t_edge, key, by_time in zip(changed, t_edges, keys, timed, strict=True):
                if by_time:
                    sw.append(Switch(Anchor.OFFSET, max(0, int(t_edge) - s_ns), lv[j]))
                else:
                    sw.append(Switch(Anchor.NODE, key, lv[j]))
            sw.extend(self._checkpoints(tpl, ends))
        else:
            at = block_ends.tolist()
            for j in changed:
                sw.append(Switch(Anchor.OFFSET, max(0, int(at[j - 1]) - s_ns), lv[j]))
        return sw, predicted, node_share

    def _slow_actuation(self, tpl: PhaseTemplate, d_med: float) -> bool:
        """Whether a switch takes ``SLOW_SWITCH_STEPS`` decode steps or more to land
        (the template's graph at the top level and the forecast stall ``d_med``); once
        so, until it takes under ``SLOW_SWITCH_LEAVE`` of that."""
        step = float(tpl.graph_ns[self.top]) + d_med
        steps = SLOW_SWITCH_STEPS * (SLOW_SWITCH_LEAVE if self._slow else 1.0)
        return self.switch_latency_ns >= steps * step

    def _slow_plan(
        self,
        t_now: int,
        target: int,
        energy_j: np.ndarray,
        time_ns: np.ndarray,
        ref_1: float,
        d_med: float,
        d_base: float,
        debt: float,
        ref_elapsed: float,
        r: float,
    ) -> Plan:
        """The decode's one level where a switch lands decode steps late (sim
        profiles at an 80 ms switch): no plan can place a level inside a graph or a
        stall, so the decode runs flat, as the phase split does, at the cheapest level
        (``energy_j``, ``time_ns``: one graph's, per level, the stall's energy and
        the learnt gain in) whose time keeps the budget from where the switch lands:
        the debt by then (the steps until it lands at the level set before, tube in),
        then the horizon's graphs (at least as many) each within an equal share of the
        slack left. The phase split picks its level in hindsight; this one follows the
        debt, a level up or down as it lands.

        A request's end: its raise, issued at REQUEST_END, lands a switch latency
        later, in the next prompt (sim adreno640 at 80 ms: its short prompts ran
        their first 77 ms at the decode's level, +2.5% TTFT at a 2% budget). So the
        top level is set once the request's forecast end (the least decode length of
        the last ``REQ_LENGTHS_KEPT`` requests) is within the steps a switch takes to
        land, plus one; with no forecast yet (the first request) the level is no
        lower than one whose late raise the next prompt can afford
        (:meth:`_idle_level`). A request that ends before its forecast has its next
        prompt start at the decode's level, and the forecast then holds its length.

        Where measured time does not follow the clock (``clock_coupled`` False) the
        graph planned for (``target``) commits the worse of this level and the one in
        effect until it lands, as a plan's worst case does there."""
        n_land = max(1, math.ceil(self.switch_latency_ns / max(ref_1 + d_med, 1.0)))
        cur = self.top if self._slow_lv is None else self._slow_lv
        debt_land = debt + n_land * (1.0 + r) * (float(time_ns[cur]) - ref_1)
        horizon = max(self.n_compute, n_land)
        room = self.slack * (ref_elapsed + (n_land + horizon) * (ref_1 + d_base)) - debt_land
        lv = self._flat_level(energy_j, time_ns, ref_1 + room / (horizon * (1.0 + r)))
        # the level the next prompt may start at: the top, or where the default's
        # bound is in use, its level (the default's next prompt starts no higher, and
        # a prompt's reference there is the bound's time)
        bound_lv = self._bound_level()
        end_lv = self.top if bound_lv is None else bound_lv
        if self._req_lengths:
            left = min(self._req_lengths) - self._req_decode_n
            if left <= n_land + 1:
                lv = max(lv, end_lv)
        else:
            lv = max(lv, min(self._idle_level(), end_lv))
        if not self.clock_coupled:
            worst = max(float(time_ns[cur]), float(time_ns[lv]))
            self._planned[target] = _Planned(
                n=0,  # matches no graph's node count: nothing is learnt from it
                predicted_ns=worst,
                top_ns=ref_1,
                committed_ns=(1.0 + r) * (worst - ref_1),
                ref_ns=ref_1,
                excess_ns=worst - ref_1,
            )
        self._slow_lv = lv
        return Plan(
            first_level=lv,
            end_level=-1,
            fallback_level=lv,
            switches=(Switch(Anchor.TIME, t_now, lv),),
        )

    def _plan_next(self, t_now: int, graph: int = -1, ahead: int = 1) -> Plan:
        """The plan for the graph ``ahead`` after ``graph`` (whose end, the start of
        the sampling stall, is ``t_now``). With ``ahead`` > 1 the graphs in between are
        already running their plans: the debt those plans committed counts against
        this one's budget, as if they had run as planned."""
        self.solves += 1
        target = graph + ahead
        s_ns = self.switch_latency_ns
        tpl = self._templates.get("decode")
        d_med, d_lo, d_early = self._stall_ns(ahead)
        droppable = self._droppable(d_lo, self._sample_estimate(ahead))
        if droppable and self.slack <= 0:
            # a stall that ends before its raise lands slows the next graph's start: at
            # slack 0 there is no budget for that (on an unseen 1.2 ms-switch profile
            # such drops cost +0.31% TPOT). Above 0 the tube and the gain widening
            # cover it; requiring the slack to be earned first (tried) left short
            # requests with no stall drops at all, under one switch per token live.
            droppable = False
        if self.slack <= 0:
            # no budget: every graph at the top level. Spending only the slack earned
            # (a graph ran faster than its reference) spends the reference's timing
            # noise, and a model that finds a block that a lower clock does not slow
            # is wrong by a little on many blocks (+0.3% TPOT on a generated adreno640
            # profile with a 50 us switch, +0.6% planning two graphs ahead)
            return self._top_plan(t_now)
        slow = tpl is not None and self._slow_actuation(tpl, d_med)
        if tpl is not None:
            self._slow = slow
        # where a switch lands steps late only a changed condition's probes run (a
        # planned one's raise lands graphs after it, and the drop back as late): the
        # graphs each request runs at the top level after its prompt are probes
        probe = self.probe_due("decode") and (not slow or self._probe_burst.get("decode", 0) > 0)
        env = None if tpl is None or probe or slow else self._envelope_probe()
        if tpl is None or probe or env is not None:
            # nothing to predict from yet, or the reference's top-level probe is due:
            # the graph at the top level; or a probe of the default's bound level. Set
            # as the stall before it begins (a probe must run wholly at its level: a
            # raise timed by the stall's forecast lands after the graph's start
            # whenever the stall is shorter than any seen, and the probe is then missed
            # and repeated graph after graph); the stall after it still at the bottom
            lv = self.top if env is None else env
            if tpl is not None and env is None:
                self._probe_for["decode"] = target
            if tpl is not None and env is not None:
                self._plan_wholly(tpl, target, env)
            return Plan(
                first_level=lv,
                end_level=0 if droppable else -1,
                fallback_level=lv,
                switches=(Switch(Anchor.TIME, t_now, lv),),
            )
        nc, idle_w = self.n_compute, self.power.idle_w
        ref_lvl = self.top
        stall_e = idle_w * (d_med - d_lo) if droppable else idle_w * d_med
        ct = self._cautious("decode", tpl)
        energy_1 = ct.energy_j + stall_e
        block_e = ct.block_energy_j
        # every graph of the horizon has the template's tables
        energy = energy_1[None].repeat(nc, 0)
        # plans below the top have lately slowed their graphs this many times what
        # was planned (a model shape error at the levels used, switches landing later
        # than planned): the solve scales every slowdown by it, so the same debt is
        # not borrowed again graph after graph. Never under 1: plans that slowed
        # their graphs less than planned say the model is off as much as plans that
        # slowed them more, and spending that difference put a generated GPU over
        # its budget (``generated_gpu`` seed 523, graph granularity: the gain fell to
        # 0.71 over three graphs, the next two ran 2.7x their planned slowdown,
        # +5.22% TPOT at 5%; now +3.99%)
        k = max(1.0, self._slow_gain) * max(1.0, self._gain_err.estimate().upper_ns)
        top_col = ct.graph_ns[self.top]
        time_ns = (top_col + k * (ct.graph_ns - top_col))[None].repeat(nc, 0)
        block_ns = ct.block_ns[:, self.top : self.top + 1]
        r = self.rel_err.estimate().upper_ns
        block_ns = block_ns + k * (ct.block_ns - block_ns) + self._timing_risk(tpl, ct.block_ns, r)
        d_ref = float(tpl.graph_ns[ref_lvl])
        if self.clock_coupled:
            d_ref = max(d_ref, self._last_ref_ns.get("decode", 0.0))
        d_ref *= nc
        # the stalls count towards the budget's base only where measured time is the
        # device's (:meth:`_account_stall`)
        d_base = d_med if self.clock_coupled else 0.0
        stalls_total = d_base * nc
        stall_tube = d_early * nc * self._max_slowdown if droppable else 0.0
        debt, ref_elapsed = self._acc["decode"]
        ref_1 = d_ref / nc  # one graph's reference
        after_prompt = self._prev_phase == "prefill"
        for g in range(graph + 1, target):  # running (or about to) on earlier plans
            p = self._planned.get(g)
            if p is not None:
                debt += p.committed_ns if self.clock_coupled else max(p.committed_ns, 0.0)
            elif after_prompt and g == graph + 1 and s_ns < ref_1:
                # the first decode graph after the prompt just learnt has no plan: it
                # runs at the prompt plan's fallback level (a switch lands within a
                # graph), and its time over the reference is debt this plan must leave
                # room for. Not counted, it was spent twice: sim adreno650 (gemma
                # recording, 2%) planned the second decode graph of each request 5.7%
                # over the reference, then ran the third at the top level to repay both
                lv = self._event_fallback_lv
                debt += (1.0 + r) * max(float(time_ns[0, lv]) - ref_1, 0.0)
            ref_elapsed += (p.ref_ns if p is not None else ref_1) + d_base
        allowed = self.slack * (ref_elapsed + d_ref + stalls_total) - debt
        # sum(d) - d_ref + r * (sum(d) - d_ref) + stall_tube <= allowed
        budget = d_ref + (allowed - stall_tube) / (1.0 + r)
        # the next graph alone may spend only slack already earned plus its own: a run
        # can end after any graph, so later graphs must not lend it theirs
        allowed_1 = self.slack * (ref_elapsed + (d_ref + stalls_total) / nc) - debt
        budget_1 = d_ref / nc + (allowed_1 - stall_tube / nc) / (1.0 + r)
        if slow:
            return self._slow_plan(
                t_now, target, energy_1, time_ns[0], ref_1, d_med, d_base, debt, ref_elapsed, r
            )
        penalty = self.switch_count[self.level_at(t_now)] * (self.power.switch_j + 1e-7)
        penalty = penalty + self._order_pref
        sol = solve_horizon(energy, time_ns, budget, penalty, self.combos, budget_1)
        levels = sol.levels
        first = int(levels[0])
        future = sum(float(time_ns[i, levels[i]]) for i in range(1, nc))
        got = (
            block_levels(block_e, block_ns, min(budget - future, budget_1))
            if sol.feasible
            else None
        )
        if got is not None:
            blocks = dwell_merge(got[0], tpl.block_ns, s_ns)
            used_here = float(block_ns[np.arange(len(blocks)), blocks].sum())
        else:
            blocks, used_here = (
                np.full(len(tpl.block_ns), first, dtype=np.int64),
                float(time_ns[0, first]),
            )
        used = used_here + future
        # the first decode graph after a prompt (its own budget, as the next graph's).
        # Not where the default's bound is in use: after a prompt the bound is at the
        # top, and the debt a graph below it ran up was repaid at the top (sim mali-g76,
        # the sweep's first Latin-hypercube point, another app's DRAM load coming and
        # going: -15.5% -> -30.2% saving)
        self._after_prompt_lv = (
            self._flat_level(ct.energy_j, time_ns[0], budget_1)
            if self._default_bound is None
            else self.top
        )
        env_lv = self._bound_level()
        # (a solved plan wholly at that level sums the same energies another way: equal
        # but for rounding, which must not pick; the solved plan keeps its stall's drop
        # and raise, so a tie goes to it)
        if env_lv is not None and float(ct.energy_j[env_lv]) < (1.0 - 1e-9) * float(
            block_e[np.arange(len(blocks)), blocks].sum()
        ):
            # the whole graph at the default's bound level is cheaper than the plan:
            # run it there (it is no slower than the default's, so it costs no debt;
            # a plan around that level whose reference sits a little below the level's
            # own time mixes in higher levels for the difference, at a higher cost)
            self._plan_wholly(tpl, target, env_lv)
            return Plan(
                first_level=env_lv,
                end_level=0 if droppable else -1,
                fallback_level=env_lv,
                switches=(Switch(Anchor.TIME, t_now, env_lv),),
            )
        self._margin_ns = max(0.0, budget - used) + r * max(used - d_ref, 0.0) + stall_tube
        first = int(blocks[0])
        sw, predicted, share = self._block_switches(tpl, blocks, share=self.granularity == "graph")
        # the model's own prediction (the gain is learnt against it) and its time at
        # the top level
        committed = (1.0 + r) * (used_here - ref_1) + stall_tube / nc
        self._planned[target] = _Planned(
            tpl.n,
            predicted,
            float(tpl.block_ns[:, self.top].sum()),
            committed,
            ref_1,
            used_here - ref_1,
            share,
        )
        node_keyed = self.granularity in ("layer", "kernel")
        if droppable:
            # the drop comes at the graph's end (the plan's end level, applied when
            # llama_decode returns), the raise one switch latency before the stall's
            # lower-bound end. No drop is timed ahead of the end: one that lands inside
            # a graph running late slows its last kernels with no boundary to notice it
            # at graph level, and on the simulated adreno650 (gemma recording, 2%) such
            # early drops cost +0.8 points of TPOT for -1.7 points of saving.
            sw.append(Switch(Anchor.TIME, t_now + int(d_lo) - s_ns, first))
        else:
            sw.append(Switch(Anchor.TIME, t_now, first))
        return Plan(
            first_level=first,
            end_level=0 if droppable else -1,
            fallback_level=first,
            n_nodes=tpl.n,
            predicted_ns=int(predicted),
            margin_ns=int(self._margin_ns),
            gain=self.gain if node_keyed else 0.0,
            switches=tuple(sw),
        )
