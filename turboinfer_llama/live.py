"""Live wiring: a PowerSession's device and controller.

Two modes, chosen by the device:

* **Simulated device** (the default, ``sim:<profile>``). There is no GPU to drive in
  real time: the live loop (``control.governor.Governor`` on the recording actuator)
  runs the controller while llama.cpp decodes and logs the switches it issues. The
  session queues the segments the engine produced and, when settling (the server's
  worker, ``stats()``, ``energy()``), accounts each finished request on the phone's
  simulator with the arrays-based passes of ``accounting``: the energy of the
  recorded timeline under the switches the loop actually issued (the controller is
  not run again), and the same timeline under the device's default governor on a
  shadow simulator, for "energy saved vs default". Nothing of this runs on the decode
  path; it costs well under a millisecond of CPU per token. All its figures are
  simulated.
* **Real device** (kgsl, devfreq, kmod, adb). The controller runs in the producer's
  context through ``control.governor.Governor`` at the engine's Python event boundaries
  (decode begin/end, sample, token), and applies frequencies through the device.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .accounting import PhoneTrace, Switches, applied_energy, default_shadow
from .control.factory import for_device, make_controller
from .control.replay import replay
from .devices import open_device
from .devices.base import DeviceError, GpuDevice
from .devices.sim import SimGpu
from .engine.events import Event
from .engine.segment_store import SegmentColumns, SegmentStore, is_idle_stall, is_kernel
from .engine.segments import Segment
from .settings import PowerSettings

if TYPE_CHECKING:
    from .control.governor import Governor

log = logging.getLogger("turboinfer_llama")

RECENT_REQUESTS = 32


class SettleAborted(Exception):
    """A pause point stopped settling in the middle of a request (the session closes
    without settling); the figures stay as last published."""


class _Gated:
    """The simulator as a replay sees it, with a pause point before every kernel and
    gap: settling can be held in the middle of a request (while a live request runs)
    and resumed where it stopped, state untouched. Everything else is forwarded."""

    __slots__ = ("_dev", "_pause")

    def __init__(self, dev: SimGpu, pause: Callable[[], None]) -> None:
        object.__setattr__(self, "_dev", dev)
        object.__setattr__(self, "_pause", pause)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dev, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dev, name, value)

    def run_kernel(self, *args: Any, **kwargs: Any) -> Any:
        self._pause()
        return self._dev.run_kernel(*args, **kwargs)

    def run_gap(self, *args: Any, **kwargs: Any) -> Any:
        self._pause()
        return self._dev.run_gap(*args, **kwargs)

    def run_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._pause()
        return self._dev.run_batch(*args, **kwargs)


class _EngineCalls:
    """The engine thread's calls, passed straight to the live loop (cheap): one list
    for both the simulated and the real device. The session calls the loop itself
    (``engine``), one Python frame fewer on each of the ~11 calls per decoded token."""

    _governor: Governor

    @property
    def engine(self) -> Governor:
        """The live loop the engine thread calls at its boundaries."""
        return self._governor

    def on_event(self, event: Event) -> None:
        self._governor.on_event(event)

    def on_decode_begin(self, graph: int) -> None:
        self._governor.on_decode_begin(graph)

    def compute_begin(self) -> None:
        self._governor.compute_begin()

    def entering_decode(self, n_tokens: int) -> None:
        self._governor.entering_decode(n_tokens)

    def engine_idle(self) -> None:
        self._governor.engine_idle()

    def graph_end(self) -> int:
        return self._governor.graph_end()

    def on_decode_end(self, raw: Any, **kw: Any) -> None:
        self._governor.on_decode_end(raw, **kw)

    def bind_hook(self, hook: Any) -> None:
        self._governor.bind_hook(hook)


class SimulatedAccount(_EngineCalls):
    """The live loop on a recording executor, and the simulated accounting of what it
    did: each finished request's recorded timeline, on the phone's host model, under
    the switches the loop actually issued (``accounting.applied_energy``) and under
    the device's default governor (``accounting.default_shadow``).

    ``flush()`` (settling) accounts the finished requests; ``summary(settle=False)``
    returns the figures of the last settle without settling or waiting for one, so
    a reader (the server's ``/v1/power``) never pays for it. Settled per-request
    figures go to ``recent`` and to every settled sink, keyed by the engine's request
    index (``"request"``: the n-th ``generate`` of this session).

    ``replay_check`` (default: ``PowerSettings.replay_check``, off): also replay each
    request through a fresh controller in pass-through timing (per-kernel, tens of ms
    of CPU per token) and account its switches like the live loop's, both on fresh
    userspace devices, for ``replay_energy_per_token_j`` next to
    ``applied_energy_per_token_j`` (issue 11: does live do what replay does?); both
    are null while it is off.
    """

    def __init__(
        self, settings: PowerSettings, device: SimGpu, *, replay_check: bool | None = None
    ) -> None:
        from .control.governor import Governor

        if settings.clock_standin:
            raise ValueError(
                "clock_standin is for fake real-device backends: the simulated device "
                "already scales the recorded timeline by its clock"
            )
        self.device = device
        self.shadow = SimGpu(device.profile)
        # the graphs run on this host at its own speed whatever the simulated clock:
        # what tmpc measures does not follow the levels it sets (TubeMPC.clock_coupled)
        kw = {
            **for_device(device),
            "latency_slack": settings.latency_slack,
            "clock_coupled": False,
        }
        # what the figures are labelled with; never run (the live loop runs its own)
        self.controller = make_controller(settings.controller, **kw)
        self._device_governs = self.controller.uses_device_governor
        # the loop that runs live: same controller kind, fresh state, switches recorded
        self.loop = Governor(
            make_controller(settings.controller, **kw),
            device,
            record_only=True,
            granularity=settings.granularity,
            native=settings.native_hooks,
        ).start()
        self._governor = self.loop
        self.replay_check = settings.replay_check if replay_check is None else replay_check
        self.pass_through = make_controller(settings.controller, **kw)
        self.applied_j = 0.0
        self.replay_pass_j = 0.0
        self.pass_tokens = 0
        self._lock = threading.Lock()  # guards _store/counters below (brief)
        self._replay_lock = threading.Lock()  # one settle at a time, in order
        # the segments not yet settled, as arrays (engine.segment_store): a backlog of
        # Segment objects would fragment pymalloc's arenas for good (issue 14)
        self._store = SegmentStore()
        self.received = 0  # segments handed to add() so far
        self._ready_upto = 0  # segments up to the last finished request
        self.settled_upto = 0  # segments processed by settling (in order)
        self._applied_seen = 0  # entries of the loop's applied_log accounted so far
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self._settled_sinks: list[Callable[[dict[str, Any]], None]] = []
        self.tokens = 0
        self.requests = 0
        self.switches = 0
        self.issued = 0  # switches the loop issued, as accounted
        self.virtual_s = 0.0
        self.settle_cpu_ns = 0  # everything settling costs (the replay check included)
        self.build_cpu_ns = 0  # recorded segments -> PhoneTrace (host model applied)
        self.passes_cpu_ns = 0  # the applied-energy and default-shadow passes
        self.check_cpu_ns = 0  # the replay check
        self.last_error: str | None = None
        self._final: dict[str, Any] | None = None
        self._published: dict[str, Any] = self._figures()

    def add(self, segments: list[Segment]) -> None:
        with self._lock:
            self._store.extend(segments)
            self.received += len(segments)

    def add_derived(self, derived: list[Segment | SegmentColumns]) -> None:
        """``add``, where a graph's segments may come as arrays (``SegmentColumns``)."""
        with self._lock:
            run: list[Segment] = []
            for x in derived:
                if isinstance(x, SegmentColumns):
                    if run:
                        self._store.extend(run)
                        self.received += len(run)
                        run = []
                    self._store.extend_columns(x)
                    self.received += len(x)
                else:
                    run.append(x)
            if run:
                self._store.extend(run)
                self.received += len(run)

    def request_done(self) -> None:
        """Everything received belongs to finished requests: ready to settle."""
        with self._lock:
            self._ready_upto = self.received

    def add_settled_sink(self, sink: Callable[[dict[str, Any]], None]) -> None:
        """Call ``sink(record)`` with each request's figures once settled."""
        self._settled_sinks.append(sink)

    @property
    def unsettled_segments(self) -> int:
        """Segments received and not yet settled (pending or ready)."""
        return self.received - self.settled_upto

    def flush(
        self, stop: Callable[[], bool] | None = None, pause: Callable[[], None] | None = None
    ) -> bool:
        """Settle: account the finished requests, one at a time. ``stop()`` is asked
        before each; when it says True the rest is left for later. ``pause()`` is
        called before every simulated batch of kernels and every gap: it may block
        (holding the pass where it is) or raise ``SettleAborted``. True when every
        finished request has been settled."""
        with self._replay_lock:
            with self._lock:
                first, upto = self.settled_upto, self._ready_upto
                bounds, has_kernel, t_next = self._parts(first, upto)
            if has_kernel.any():
                self.loop.wait_idle()
            try:
                for i in range(len(bounds) - 1):
                    if stop is not None and stop():
                        return False
                    lo, hi = int(bounds[i]), int(bounds[i + 1])
                    if has_kernel[i]:
                        with self._lock:
                            part = self._store.columns(lo, hi)
                        # the loop's switches issued before this request's end (or the
                        # next one's start): those of this request
                        end = (
                            int(part.t_ns[-1]) + max(int(part.dur_ns[-1]), 0)
                            if i + 2 == len(bounds)
                            else int(t_next[i])
                        )
                        self._settle_one(part, self._issued_until(end), pause)
                        del part
                    self._advance(hi)
            except SettleAborted:
                raise
            except Exception:
                self._advance(upto)  # as before: a failed batch is not settled again
                raise
            return True

    def _parts(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The finished requests among segments ``lo``..``hi`` (``_split_requests``, on
        the arrays): their bounds (absolute indices, ``len(parts) + 1`` of them),
        whether each has a kernel, and the start of the part after each (last: -1)."""
        store = self._store
        meta = store.column("meta", lo, hi)
        idle = store.meta_mask(is_idle_stall)[meta]
        kern = store.meta_mask(is_kernel)[meta]
        cuts = np.flatnonzero(idle)
        cuts = cuts[cuts > 0]
        rel = np.concatenate(([0], cuts, [hi - lo])) if hi > lo else np.zeros(1, np.int64)
        has = (
            np.add.reduceat(kern.astype(np.int64), rel[:-1]) > 0
            if len(rel) > 1
            else np.zeros(0, dtype=bool)
        )
        t_ns = store.column("t_ns", lo, hi)
        t_next = np.append(t_ns[rel[1:-1]], -1) if len(rel) > 1 else np.zeros(0, np.int64)
        return rel + lo, has, t_next

    def _advance(self, upto: int) -> None:
        """Segments before ``upto`` are settled: forget them."""
        with self._lock:
            self.settled_upto = upto
            self._store.drop_before(upto)

    def _issued_until(self, end_ns: int) -> list[tuple[int, int]]:
        """The live loop's applied switches (host t_ns, Hz) not yet accounted, issued
        before ``end_ns`` (the log is in issue order)."""
        log = self.loop.applied_log
        levels = self.loop.levels_hz
        out: list[tuple[int, int]] = []
        k = self._applied_seen
        while k < len(log) and log[k][0] < end_ns:
            t, level = log[k]
            out.append((int(t), int(levels[level])))
            k += 1
        self._applied_seen = k
        return out

    def _settle_one(
        self,
        req: SegmentColumns | list[Segment],
        issued: list[tuple[int, int]],
        pause: Callable[[], None] | None,
    ) -> None:
        """Account one finished request: its segments as arrays (the backlog's rows,
        ``PhoneTrace.build_columns``) or as objects (``PhoneTrace.build``); the same
        figures either way."""
        t0 = time.thread_time_ns()
        profile = self.device.profile
        dev: Any = self.device if pause is None else _Gated(self.device, pause)
        shadow: Any = self.shadow if pause is None else _Gated(self.shadow, pause)
        try:
            if isinstance(req, SegmentColumns):
                trace = PhoneTrace.build_columns(req, profile, pause=pause)
            else:
                trace = PhoneTrace.build(req, profile, pause=pause)
            t1 = time.thread_time_ns()
            switches = trace.place([t for t, _ in issued], [hz for _, hz in issued])
            if self._device_governs:  # the loop issues nothing: the governor decides
                acc = default_shadow(trace, dev)
            else:
                acc = applied_energy(trace, dev, switches)
            base = default_shadow(trace, shadow)
            t2 = time.thread_time_ns()
        except (DeviceError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("simulated accounting skipped a request: %s", e)
            self.settle_cpu_ns += time.thread_time_ns() - t0
            return
        self.build_cpu_ns += t1 - t0
        self.passes_cpu_ns += t2 - t1
        if self.replay_check and not self._device_governs:
            self._check(req if isinstance(req, list) else req.segments(), trace, switches)
        self.settle_cpu_ns += time.thread_time_ns() - t0
        self.virtual_s += acc.duration_ns * 1e-9
        self.tokens += acc.tokens
        self.requests += 1
        self.switches += acc.switches
        self.issued += len(issued)
        record = {
            "request": (
                next(s.request for s in req if s.kind == "kernel")
                if isinstance(req, list)
                else int(req.request[req.entry_mask(is_kernel)][0])
            ),
            "energy_j": acc.energy_j,
            "default_energy_j": base.energy_j,
            "tokens": acc.tokens,
            "tpot_ms": acc.tpot_ms,
            "default_tpot_ms": base.tpot_ms,
            "switches_issued": len(issued),
            "simulated": True,
        }
        if acc.tokens:
            self.recent.append(record)
        self._published = self._figures()
        for sink in self._settled_sinks:
            try:
                sink(record)
            except Exception:  # a reader's bug must not stop accounting
                log.exception("settled-request sink failed")

    def _check(self, req: list[Segment], trace: PhoneTrace, live: Switches) -> None:
        """The replay check: the request through a fresh controller in pass-through
        timing (recorded durations, as live saw them), its switches placed on the
        recording like the live loop's, both accounted alike on fresh userspace
        devices (simulated), so the two figures differ only by the decisions."""
        t0 = time.thread_time_ns()
        try:
            if not trace.tokens:
                return
            # on the recorded clock: the pass-through controller keeps its state (request
            # ends, switch history) across requests, so its clock must not restart at 0
            dev = SimGpu(self.device.profile, start_ns=req[0].t_ns)
            issued: list[tuple[int, int]] = []
            set_hz = dev.set_hz

            def logged(hz: int) -> int:
                issued.append((dev.now_ns(), int(hz)))
                return set_hz(hz)

            dev.set_hz = logged  # type: ignore[method-assign]
            # with the live run's timing (when each graph reached the planner and its
            # plan the executor; engine timing alone), so it is a replay of this run;
            # recorded timing keeps the recording's clock, so its switch times are
            # recording times already
            replay(
                req,
                self.pass_through,
                dev,
                timing="recorded",
                counters=False,
                plan_delays_ns=dict(self.loop.plan_delay_ns),
                graph_inputs_ns=dict(self.loop.graph_input_ns),
                plans_dropped=set(self.loop.plans_dropped),
            )
            t_rec = [t for t, _ in issued]
            profile = self.device.profile
            rep = applied_energy(trace, profile, trace.place(t_rec, [h for _, h in issued]))
            got = applied_energy(trace, profile, live)
        except (DeviceError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return
        finally:
            self.check_cpu_ns += time.thread_time_ns() - t0
        self.applied_j += got.energy_j
        self.replay_pass_j += rep.energy_j
        self.pass_tokens += trace.tokens

    def _figures(self) -> dict[str, Any]:
        loop = self.loop.health()
        d, s = self.device, self.shadow
        t_s = self.virtual_s
        saved = s.energy_j - d.energy_j
        tok = self.tokens
        return {
            "simulated": True,
            "source": f"simulated {d.name} (profile data, see devices/profiles)",
            "device": d.name,
            "controller": getattr(self.controller, "name", "?"),
            "current_hz": d.current_hz(),
            "energy_j": d.energy_j,
            "default_energy_j": s.energy_j,
            "saved_j": saved,
            "saving_fraction": saved / s.energy_j if s.energy_j else None,
            "virtual_time_s": t_s,
            "avg_power_w": d.energy_j / t_s if t_s > 0 else None,
            "by_phase_j": dict(d.energy_by_phase_j),
            "tokens": self.tokens,
            "energy_per_token_j": d.energy_j / self.tokens if self.tokens else None,
            "switches": self.switches,
            "decision_us_median": loop["decision_us_median"],
            "recent_requests": list(self.recent),
            # the headline figure is already the applied one (the loop's issued switches
            # on the recording); the replay check, when on, recomputes it beside the
            # replay estimate on fresh devices, so the pair differs only by decisions
            "applied_energy_per_token_j": (
                self.applied_j / self.pass_tokens
                if self.pass_tokens
                else (
                    d.energy_j / self.tokens if self.tokens and not self._device_governs else None
                )
            ),
            "replay_energy_per_token_j": (
                self.replay_pass_j / self.pass_tokens if self.pass_tokens else None
            ),
            "live": {
                "switches": loop["decisions_applied"],
                "levels_used": loop["levels_used"],
                "graphs_planned": loop["graphs_planned"],
                "graph_plan_us_median": loop["graph_plan_us_median"],
                "graph_plan_cpu_us_median": loop["graph_plan_cpu_us_median"],
                "graph_cpu_us": loop["graph_cpu_us"],
                "plan_holds": loop["plan_holds"],
                "planner_wake": loop["planner_wake"],
                "feedback": loop["feedback"],
                "executor": loop["executor"],
                "actuation": "recorded (simulated device): switches are logged, not applied",
            },
            "health": {
                "ok": self.last_error is None and loop["ok"],
                "last_error": self.last_error or loop["error"],
            },
            "accounting": {
                "settled_requests": self.requests,
                "method": "arrays-based passes (accounting.applied_energy of the switches "
                "the live loop issued, accounting.default_shadow), phone host model",
                "switches_issued": self.issued,
                # CPU time on this host (measured), per token: the two passes ...
                "accounting_ms_per_token": self.passes_cpu_ns / 1e6 / tok if tok else None,
                # ... building the trace from the recorded segments ...
                "trace_build_ms_per_token": self.build_cpu_ns / 1e6 / tok if tok else None,
                # ... the replay check (replay_energy_per_token_j) ...
                "replay_check_ms_per_token": self.check_cpu_ns / 1e6 / tok if tok else None,
                # ... and everything settling cost
                "cpu_ms_per_token": self.settle_cpu_ns / 1e6 / tok if tok else None,
            },
        }

    def summary(self, settle: bool = True) -> dict[str, Any]:
        """The figures. ``settle=False``: those of the last settle, at once (no replay,
        no waiting), plus how much is still unsettled."""
        if self._final is not None:
            return self._final
        if settle:
            self.flush()
            with self._replay_lock:
                self._published = self._figures()
        out = dict(self._published)
        out["accounting"] = {
            **out["accounting"],
            "unsettled_segments": self.unsettled_segments,
            "settled": self.unsettled_segments == 0,
        }
        return out

    def close(self, settle: bool = True) -> None:
        """Settle the figures (kept readable afterwards; ``settle=False``: keep those
        settled so far), then close both simulators."""
        if self._final is None:
            if settle:
                self.request_done()
            self._final = self.summary(settle=settle)
        self.loop.close()
        self.device.close()
        self.shadow.close()


class RealDeviceControl(_EngineCalls):
    """The controller acting on real hardware at event boundaries.

    ``owns_device``: close (and so restore) the device on ``close()``; False when the
    caller lends a device it will close itself (the benchmark, across controllers).
    """

    def __init__(
        self,
        settings: PowerSettings,
        device: GpuDevice,
        controller: str | None = None,
        *,
        owns_device: bool = True,
    ) -> None:
        from .control.governor import Governor

        self.device = device
        self.owns_device = owns_device
        ctrl = make_controller(
            controller or settings.controller,
            **for_device(device),
            latency_slack=settings.latency_slack,
        )
        self.governor = Governor(
            ctrl, device, granularity=settings.granularity, native=settings.native_hooks
        ).start()
        self._governor = self.governor
        if settings.clock_standin:
            # tests and benchmarks only; the executor refuses hardware actuators, and
            # Llama refuses it when a layer runs on a GPU (llama.py)
            log.warning(
                "clock_standin is on: each graph is stretched to the time it would take "
                "at the applied clock (a test stand-in; never for real hardware)"
            )
            try:
                self.governor.enable_clock_standin(settings.clock_standin_memory_share)
            except BaseException:
                self.governor.close()
                raise

    def summary(self, settle: bool = True) -> dict[str, Any]:
        """Live figures (nothing to settle: ``settle`` is accepted for symmetry)."""
        d = self.device
        health = self.governor.health()
        out: dict[str, Any] = {
            "simulated": bool(d.capabilities.simulated),
            "device": d.name,
            "controller": health["controller"],
            "switches": health["decisions_applied"],
            "levels_used": health["levels_used"],
            "feedback": health["feedback"],
            "executor": health["executor"],
            "clock_standin": health["clock_standin"],
            "decision_us_median": health["decision_us_median"],
            "graph_plan_us_median": health["graph_plan_us_median"],
            "graph_plan_cpu_us_median": health["graph_plan_cpu_us_median"],
            "graph_cpu_us": health["graph_cpu_us"],
            "plan_holds": health["plan_holds"],
            "planner_wake": health["planner_wake"],
            "health": {"ok": health["ok"], "last_error": health["error"], **health},
        }
        try:
            out["current_hz"] = d.current_hz()
        except DeviceError as e:
            out["current_hz"] = None
            out["health"]["last_error"] = str(e)
        return out

    def close(self) -> None:
        try:
            self.governor.close()
        finally:
            if self.owns_device:
                self.device.close()


def attach(settings: PowerSettings) -> SimulatedAccount | RealDeviceControl | None:
    """Open the configured device and controller; None when observing only."""
    if settings.controller == "none":
        return None
    device = open_device(settings.device)
    try:
        if isinstance(device, SimGpu):
            return SimulatedAccount(settings, device)
        return RealDeviceControl(settings, device)
    except BaseException:
        device.close()
        raise
