"""Sensitivity sweep: one recording, replayed across the simulator's uncertain parameters.

Every figure is simulated. The design: for each profile, the nominal parameters at
every slack; one parameter at a time moved to each end of its range (at the nominal
slack); and a small Latin hypercube over all of them (``scipy.stats.qmc``). Each
point runs every controller of the full comparison on a fresh simulated device built
from the point's parameters. ``default`` and the offline controllers (``static-best``,
``phase``, ``phase-request``, ``phase-prefix``, ``oracle``, ``oracle-request``) are
figured by the arrays-based accounting, per graph (the same figures as a per-kernel
replay, within 0.5%); the causal controllers are replayed.

Parameters (``params`` in the JSON):

* ``switch_latency_us``: the direct switch latency, 50 us .. 80 ms;
* ``bus_coupling``: GPU-DDR coupling off (0) or as the profile has it (Adreno: 1);
* ``host_cpu_scale``: times the profile's host CPU factor, 0.5 .. 2;
* ``compute_efficiency_scale``: times the profile's compute efficiency, 0.5 .. 1.5;
* ``clock_gated_idle_fraction``: 0.05 .. 0.3;
* ``background_share``: other apps' share of DRAM bandwidth, 0 .. 0.5;
* ``background_change``: a load that starts a third of the way into the run (40% of
  DRAM bandwidth on top) and stops at two thirds, like a photo backup.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..control.registry import sweep_set

SWEEP_VERSION = 1
CONTROLLERS: tuple[str, ...] = sweep_set()
DEFAULT_PROFILES: tuple[str, ...] = ("adreno650", "mali-g76")
DEFAULT_SLACKS: tuple[float, ...] = (0.0, 0.02, 0.05, 0.10)
NOMINAL_SLACK = 0.02
BACKGROUND_STEP = 0.4  # the mid-run load: 40% of DRAM bandwidth
ORACLE_REFINE = 8  # re-solves after accounting checks of the oracle's schedule (as the bench)

# one-at-a-time values: each parameter moved to the ends of its range
OAT: dict[str, tuple[Any, ...]] = {
    "switch_latency_us": (50.0, 80_000.0),
    "bus_coupling": (0.0,),
    "host_cpu_scale": (0.5, 2.0),
    "compute_efficiency_scale": (0.5, 1.5),
    "clock_gated_idle_fraction": (0.05, 0.3),
    "background_share": (0.5,),
    "background_change": (True,),
}


class SweepError(Exception):
    """A user-facing sweep error."""


@dataclass(frozen=True)
class Point:
    profile: str
    slack: float
    design: str
    params: dict[str, Any]


def nominal(profile: Any) -> dict[str, Any]:
    """The profile's own values of the swept parameters."""
    return {
        "switch_latency_us": profile.switch_latency_direct_ns / 1e3,
        "bus_coupling": profile.bus_coupling,
        "host_cpu_scale": 1.0,
        "compute_efficiency_scale": 1.0,
        "clock_gated_idle_fraction": profile.clock_gated_idle_fraction,
        "background_share": 0.0,
        "background_change": False,
    }


def design(
    profiles: Sequence[str], slacks: Sequence[float], *, lhs: int = 2, seed: int = 0
) -> list[Point]:
    """The sweep's points (see the module docstring)."""
    from scipy.stats import qmc

    from ..devices.sim import load_profile

    if not slacks:
        raise SweepError("need at least one slack")
    at = NOMINAL_SLACK if NOMINAL_SLACK in slacks else slacks[0]
    points: list[Point] = []
    for name in profiles:
        prof = load_profile(name)
        nom = nominal(prof)
        coupled = bool(prof.bus_vote_index) and prof.bus_coupling > 0
        for s in slacks:
            points.append(Point(name, s, "nominal", dict(nom)))
        for key, values in OAT.items():
            if key == "bus_coupling" and not coupled:
                continue  # no votes to couple (Mali): the point would repeat nominal
            for v in values:
                points.append(Point(name, at, f"oat:{key}", {**nom, key: v}))
        if lhs > 0:
            u = qmc.LatinHypercube(d=7, seed=seed).random(lhs)
            for row in u:
                p = dict(nom)
                p["switch_latency_us"] = float(50.0 * (80_000.0 / 50.0) ** row[0])
                p["bus_coupling"] = nom["bus_coupling"] if row[1] >= 0.5 else 0.0
                p["host_cpu_scale"] = float(0.5 * 4.0 ** row[2])
                p["compute_efficiency_scale"] = float(0.5 + row[3])
                p["clock_gated_idle_fraction"] = float(0.05 + 0.25 * row[4])
                p["background_share"] = float(0.5 * row[5])
                p["background_change"] = bool(row[6] >= 0.5)
                points.append(Point(name, at, "lhs", p))
    return points


# ---- one point (runs in a worker process) --------------------------------------------

_RAW: list[Any] | None = None
_GRANULARITY: str | None = None  # the causal controllers' loop (None: the live default)


def _init(recording: str, granularity: str | None = None) -> None:
    global _RAW, _GRANULARITY
    from ..trace.record import load_trace
    from .runner import segments_of

    events, _ = load_trace(recording)
    _RAW = segments_of(events)
    _GRANULARITY = granularity


def _profile_of(point: Point) -> Any:
    from ..devices.sim import load_profile

    base = load_profile(point.profile)
    q = point.params
    return dataclasses.replace(
        base,
        switch_latency_direct_ns=round(q["switch_latency_us"] * 1e3),
        bus_coupling=float(q["bus_coupling"]),
        host_cpu_factor=base.host_cpu_factor * q["host_cpu_scale"],
        compute_efficiency=base.compute_efficiency * q["compute_efficiency_scale"],
        clock_gated_idle_fraction=float(q["clock_gated_idle_fraction"]),
    )


def point_device(point: Point, segs: Sequence[Any]) -> tuple[list[Any], Callable[..., Any]]:
    """The recorded segments as the point's simulated phone runs them, and a factory of
    fresh simulated devices for it (its profile, its background DRAM load; keyword
    arguments go to ``SimGpu``, e.g. ``record_intervals``)."""
    from ..accounting import PhoneTrace, default_shadow, phone_segments
    from ..devices.sim import SimGpu

    prof = _profile_of(point)
    phone = phone_segments(segs, prof)
    share = float(point.params["background_share"])
    schedule: list[tuple[int, float]] = []
    if point.params["background_change"]:
        quiet = default_shadow(
            PhoneTrace.build(phone, prof, host_model=False),
            SimGpu(prof, background_share=share),
        )
        d = quiet.duration_ns
        schedule = [(d // 3, min(share + BACKGROUND_STEP, 0.9)), (2 * d // 3, share)]

    def factory(**kw: Any) -> SimGpu:
        return SimGpu(
            prof, background_share=share, background_schedule=schedule, host_model=True, **kw
        )

    return phone, factory


def evaluate(point: Point, raw: Sequence[Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Every controller at one point: figures relative to ``default`` (fractions). The
    causal controllers are replayed at the granularity ``_init`` was given (None: the
    live loop's default, ``runner.LIVE_GRANULARITY``)."""
    from ..control.baselines.hindsight import StaticBest
    from ..control.factory import for_device, make_controller
    from ..control.replay import replay
    from .runner import LIVE_GRANULARITY

    gran = _GRANULARITY or LIVE_GRANULARITY

    segs = raw if raw is not None else _RAW
    if segs is None:
        raise SweepError("no recording loaded")
    phone, factory = point_device(point, segs)
    slack = point.slack
    figures: dict[str, tuple[float, float, float]] = {}  # energy_j, tpot_ms, ttft_ms
    oracle_gap: float | None = None  # the oracle's Lagrangian optimality gap (its model)
    sb = StaticBest(phone, factory, latency_slack=slack)
    ref = sb.reference
    figures["default"] = (ref.energy_j, ref.tpot_ms, ref.ttft_ms)
    a = sb.by_level[sb.freq_hz]
    figures["static-best"] = (a.energy_j, a.tpot_ms, a.ttft_ms)
    chosen: dict[str, Any] = {"static-best": sb.freq_hz}
    for name in ("phase", "phase-request", "phase-prefix"):  # the splits, as named
        split: Any = make_controller(
            name, **for_device(factory()), latency_slack=slack, trace=phone, device_factory=factory
        )
        acc = split.account()
        figures[name] = (acc.energy_j, acc.tpot_ms, acc.ttft_ms)
        chosen[name] = [split.prefill_hz, split.decode_hz]
    for name in CONTROLLERS:
        if name in figures:
            continue  # default and the hindsight baselines: figured by the accounting
        dev = factory()
        ctl: Any
        ctl = make_controller(
            name,
            **for_device(dev),
            latency_slack=slack,
            trace=phone,
            device_factory=factory,
            seed=seed,
            oracle_refine=ORACLE_REFINE,
        )
        if name in ("oracle", "oracle-request"):  # offline: figured by the accounting
            # the same budget as everyone's: TTFT and TPOT within the slack (the TTFT
            # pooled over the run, or each request's: ``oracle-request``)
            oa = ctl.account()
            if name == "oracle":
                oracle_gap = ctl.bound_summary()["gap"]
            figures[name] = (oa.energy_j, oa.tpot_ms, oa.ttft_ms)
            continue
        r = replay(phone, ctl, dev, seed=seed, granularity=gran)
        figures[name] = (r.energy_j, r.tpot_ms, r.ttft_ms)
    base_e, base_tpot, base_ttft = figures["default"]
    oracle_saving = 1.0 - figures["oracle"][0] / base_e
    request_saving = 1.0 - figures["oracle-request"][0] / base_e
    out: dict[str, Any] = {}
    for name in CONTROLLERS:
        e, tpot, ttft = figures[name]
        saving = 1.0 - e / base_e
        out[name] = {
            "energy_saving_vs_default": _r(saving),
            "latency_change_vs_default": _r(tpot / base_tpot - 1.0),
            "ttft_change_vs_default": _r(ttft / base_ttft - 1.0),
            "oracle_fraction": _r(saving / oracle_saving) if oracle_saving > 1e-9 else None,
            "oracle_request_fraction": _r(saving / request_saving)
            if request_saving > 1e-9
            else None,
        }
    return {
        "profile": point.profile,
        "slack": point.slack,
        "granularity": gran,
        "design": point.design,
        "params": point.params,
        "chosen_hz": chosen,
        "oracle_gap": _r(oracle_gap) if oracle_gap is not None else None,
        "controllers": out,
    }


def _r(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 5)


def _evaluate_in_worker(point: Point) -> dict[str, Any]:
    return evaluate(point)


# ---- the whole sweep -------------------------------------------------------------------


def run_sweep(
    recording: str,
    *,
    profiles: Sequence[str] = DEFAULT_PROFILES,
    slacks: Sequence[float] = DEFAULT_SLACKS,
    lhs: int = 2,
    seed: int = 0,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Callable[[dict[str, Any]], None] | None = None,
    granularity: str | None = None,
) -> dict[str, Any]:
    """Run every point (a process pool over all cores) and return the JSON document.
    ``partial`` receives the document with the points finished so far after each one
    (``"complete": false``), so a long sweep can be saved as it goes. The causal
    controllers are replayed at ``granularity`` (None: the live loop's default)."""
    points = design(profiles, slacks, lhs=lhs, seed=seed)
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(points)))
    results: list[dict[str, Any] | None] = [None] * len(points)
    done = 0

    def document(complete: bool) -> dict[str, Any]:
        return _document(recording, profiles, slacks, lhs, seed, results, complete)

    if n_workers == 1:
        _init(recording, granularity)
        for i, pt in enumerate(points):
            results[i] = evaluate(pt, seed=seed)
            done += 1
            if progress:
                progress(done, len(points))
            if partial:
                partial(document(False))
    else:
        with ProcessPoolExecutor(
            max_workers=n_workers, initializer=_init, initargs=(recording, granularity)
        ) as pool:
            futures = {pool.submit(_evaluate_in_worker, pt): i for i, pt in enumerate(points)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                done += 1
                if progress:
                    progress(done, len(points))
                if partial:
                    partial(document(False))
    return document(True)


def _document(
    recording: str,
    profiles: Sequence[str],
    slacks: Sequence[float],
    lhs: int,
    seed: int,
    results: list[dict[str, Any] | None],
    complete: bool,
) -> dict[str, Any]:
    return {
        "version": SWEEP_VERSION,
        "simulated": True,
        "recording": Path(recording).name,
        "controllers": list(CONTROLLERS),
        "design": {
            "profiles": list(profiles),
            "slacks": list(slacks),
            "one_at_a_time": {k: list(v) for k, v in OAT.items()},
            "latin_hypercube_points_per_profile": lhs,
            "seed": seed,
            "background_change": f"+{BACKGROUND_STEP:.0%} of DRAM bandwidth from 1/3 to 2/3 "
            "of the default run",
            "oracle_refine": ORACLE_REFINE,
            "ztt": "untrained (one replay), as in turboinfer bench",
        },
        "complete": complete,
        "points": [r for r in results if r is not None],
    }


# ---- output -----------------------------------------------------------------------------


def table(doc: dict[str, Any]) -> Any:
    """A rich table: one row per point, per controller saving / TPOT / TTFT change."""
    from rich.table import Table

    t = Table(
        title=f"turboinfer sweep — {doc['recording']} (all figures simulated): "
        "saving / TPOT / TTFT vs default"
    )
    t.add_column("profile")
    t.add_column("slack", justify="right")
    t.add_column("point")
    for name in doc["controllers"][1:]:
        t.add_column(name, justify="right")
    for pt in doc["points"]:
        label = pt["design"]
        if label.startswith("oat:"):
            key = label[4:]
            label = f"{key}={pt['params'][key]:g}" if key != "background_change" else key
        cells = []
        for name in doc["controllers"][1:]:
            c = pt["controllers"][name]
            cells.append(
                f"{_pct(c['energy_saving_vs_default'])} / {_pct(c['latency_change_vs_default'])}"
                f" / {_pct(c['ttft_change_vs_default'])}"
            )
        t.add_row(pt["profile"], f"{pt['slack']:.0%}", label, *cells)
    return t


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def write_plot(path: str | Path, doc: dict[str, Any]) -> Path:
    """Pareto plot per profile: energy saving against TPOT change, every point, one
    colour per controller, with each controller's Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(dict.fromkeys(pt["profile"] for pt in doc["points"]))
    fig, axes = plt.subplots(
        1, len(profiles), figsize=(6.5 * len(profiles), 5), squeeze=False, constrained_layout=True
    )
    for ax, prof in zip(axes[0], profiles, strict=True):
        pts = [pt for pt in doc["points"] if pt["profile"] == prof]
        for name in doc["controllers"][1:]:
            xy = np.array(
                [
                    (
                        pt["controllers"][name]["latency_change_vs_default"],
                        pt["controllers"][name]["energy_saving_vs_default"],
                    )
                    for pt in pts
                    if pt["controllers"][name]["latency_change_vs_default"] is not None
                ],
                dtype=np.float64,
            )
            if not len(xy):
                continue
            sc = ax.scatter(100 * xy[:, 0], 100 * xy[:, 1], s=14, alpha=0.6, label=name)
            order = np.argsort(xy[:, 0])
            front, best = [], -np.inf
            for k in order:
                if xy[k, 1] > best:
                    best = xy[k, 1]
                    front.append(xy[k])
            fr = np.array(front)
            ax.step(100 * fr[:, 0], 100 * fr[:, 1], where="post", color=sc.get_facecolor()[0])
        ax.axvline(0, color="grey", lw=0.6)
        ax.set_xlabel("TPOT change vs default (%)")
        ax.set_ylabel("energy saving vs default (%, simulated)")
        ax.set_title(f"sim:{prof} — Pareto per controller (simulated)")
        ax.legend(fontsize=8)
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
