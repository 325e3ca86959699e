"""Every controller name, once, with what it is: live or offline, and which lists it is in.

Settings validation, ``make_controller``, ``compare``, the benchmark runner and the
CLI help all derive their lists from ``CONTROLLERS``; nothing else spells the names.
This module imports nothing heavy, so ``settings`` can use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerInfo:
    """``live``: runs causally on a live engine and device. ``offline``: needs the whole
    recorded run (hindsight), so only the benchmark replays it. ``in_all``: part of the
    full comparison (``bench --all``, ``compare``'s default, ``sweep``).
    ``bench_default``: in ``turboinfer bench``'s short default run. ``in_sweep``: run
    at every point of ``turboinfer sweep`` (the full set but the pinned top level,
    which ``static-best`` covers). ``observe_only``:
    opens no device (``none``). ``pattern``: a name with a parameter (``static:<hz>``)."""

    name: str
    help: str
    live: bool = True
    offline: bool = False
    in_all: bool = False
    bench_default: bool = False
    in_sweep: bool = True
    observe_only: bool = False
    pattern: bool = False

    def matches(self, name: str) -> bool:
        if self.pattern:
            prefix = self.name.split("<", 1)[0]
            return name.startswith(prefix) and len(name) > len(prefix)
        return name == self.name


CONTROLLERS: tuple[ControllerInfo, ...] = (
    ControllerInfo(
        "default", "the device's own governor, untouched", in_all=True, bench_default=True
    ),
    ControllerInfo(
        "tmpc",
        "tube MPC: lowers the clock through forecast stalls",
        in_all=True,
        bench_default=True,
    ),
    ControllerInfo("max", "the top level, pinned", in_all=True, in_sweep=False),
    ControllerInfo("static:<hz>", "one level, pinned", pattern=True),
    ControllerInfo("reactive", "low on a detected stall, high on detected compute", in_all=True),
    ControllerInfo("ztt", "zTT-style Q-learning baseline", in_all=True),
    ControllerInfo("none", "observe only: no device is opened", observe_only=True),
    ControllerInfo(
        "oracle",
        "offline minimum-energy schedule within the budget",
        live=False,
        offline=True,
        in_all=True,
    ),
    ControllerInfo(
        "oracle-request",
        "the oracle with each request's TTFT within the budget (the promise tmpc keeps; "
        "the oracle's TTFT budget is pooled over the run)",
        live=False,
        offline=True,
        in_all=True,
    ),
    ControllerInfo(
        "static-best",
        "hindsight: the least-energy single level within the TTFT and TPOT budget",
        live=False,
        offline=True,
        in_all=True,
    ),
    ControllerInfo(
        "phase",
        "hindsight: prefill at the lowest level within the TTFT budget, decode at the "
        "lowest within the TPOT budget",
        live=False,
        offline=True,
        in_all=True,
    ),
    ControllerInfo(
        "phase-request",
        "the phase split with each request's TTFT within the budget (the promise tmpc "
        "keeps; the phase split's TTFT budget is pooled over the run)",
        live=False,
        offline=True,
        in_all=True,
    ),
    ControllerInfo(
        "phase-prefix",
        "the phase split with its TTFT and TPOT within the budget whatever request the "
        "run ends at (a live controller cannot know the last one)",
        live=False,
        offline=True,
        in_all=True,
    ),
)


def info(name: str) -> ControllerInfo | None:
    """The registry entry a name belongs to (``static:490000000`` -> ``static:<hz>``)."""
    return next((c for c in CONTROLLERS if c.matches(name)), None)


def names(*, live: bool | None = None, offline: bool | None = None) -> tuple[str, ...]:
    """Registry names (patterns as written, ``static:<hz>``), filtered by flags."""
    return tuple(
        c.name
        for c in CONTROLLERS
        if (live is None or c.live == live) and (offline is None or c.offline == offline)
    )


def replayable() -> tuple[str, ...]:
    """Names the benchmark can replay (everything but observe-only)."""
    return tuple(c.name for c in CONTROLLERS if not c.observe_only)


def all_set() -> tuple[str, ...]:
    """The full comparison, ``default`` first."""
    return tuple(c.name for c in CONTROLLERS if c.in_all)


def sweep_set() -> tuple[str, ...]:
    """What ``turboinfer sweep`` runs at each point, ``default`` first."""
    return tuple(c.name for c in CONTROLLERS if c.in_all and c.in_sweep)


def bench_default_set() -> tuple[str, ...]:
    return tuple(c.name for c in CONTROLLERS if c.bench_default)


def is_live(name: str) -> bool:
    c = info(name)
    return c is not None and c.live


def is_offline(name: str) -> bool:
    c = info(name)
    return c is not None and c.offline
