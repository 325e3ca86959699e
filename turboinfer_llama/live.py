"""Live wiring: a PowerSession's device and controller.

Two modes, chosen by the device:

* **Simulated device** (the default, ``sim:<profile>``). There is no GPU to drive in
  real time, so the session queues the segments the engine produced and, when figures
  are asked for (``stats()``, ``energy()``), replays the completed requests through
  the controller on the simulator in virtual time — the same code path as
  ``turboinfer bench`` — and, in parallel, through the default governor on a shadow
  simulator, for "energy saved vs default". Nothing of this runs on the decode path;
  it costs tens of ms of CPU per token (per-kernel replay, twice), paid by whoever
  asks for the figures. All its figures are simulated.
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
from typing import Any

from .control.applied import energy_on_timeline
from .control.factory import for_device, make_controller
from .control.replay import replay
from .devices import open_device
from .devices.base import DeviceError, GpuDevice
from .devices.sim import SimGpu
from .engine.events import Event, StallKind
from .engine.segments import Segment
from .settings import PowerSettings

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


class SimulatedAccount:
    """Controller + simulator in virtual time, fed with completed requests; and the
    live loop on a recording executor, whose switches are accounted on the recorded
    timeline (applied energy).

    ``flush()`` (settling) replays the finished requests; ``summary(settle=False)``
    returns the figures of the last settle without replaying or waiting for one, so
    a reader (the server's ``/v1/power``) never pays for the replay. Settled
    per-request figures go to ``recent`` and to every settled sink, keyed by the
    engine's request index (``"request"``: the n-th ``generate`` of this session).
    """

    def __init__(self, settings: PowerSettings, device: SimGpu) -> None:
        from .control.governor import Governor

        self.device = device
        self.shadow = SimGpu(device.profile)
        kw = {**for_device(device), "latency_slack": settings.latency_slack}
        self.controller = make_controller(settings.controller, **kw)
        self.baseline = make_controller("default", **for_device(self.shadow))
        self._initial_level = device.frequencies_hz().index(device.current_hz())
        # the loop that runs live: same controller kind, fresh state, switches recorded
        self.loop = Governor(
            make_controller(settings.controller, **kw),
            device,
            record_only=True,
            granularity=settings.granularity,
            native=settings.native_hooks,
        ).start()
        self.pass_through = make_controller(settings.controller, **kw)
        self.applied_j = 0.0
        self.replay_pass_j = 0.0
        self.pass_tokens = 0
        self._lock = threading.Lock()  # guards _pending/_ready/counters below (brief)
        self._replay_lock = threading.Lock()  # one settle at a time, in order
        self._pending: list[Segment] = []
        self._ready: list[Segment] = []
        self.received = 0  # segments handed to add() so far
        self._ready_upto = 0  # segments up to the last finished request
        self.settled_upto = 0  # segments processed by settling (in order)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self._settled_sinks: list[Callable[[dict[str, Any]], None]] = []
        self.tokens = 0
        self.requests = 0
        self.switches = 0
        self.virtual_s = 0.0
        self.settle_cpu_ns = 0
        self.decision_us: deque[float] = deque(maxlen=4096)
        self.last_error: str | None = None
        self._final: dict[str, Any] | None = None
        self._published: dict[str, Any] = self._figures()

    # -- the live loop (engine thread; cheap) --
    def on_event(self, event: Event) -> None:
        self.loop.on_event(event)

    def on_decode_begin(self, graph: int) -> None:
        self.loop.on_decode_begin(graph)

    def graph_end(self) -> None:
        self.loop.graph_end()

    def on_decode_end(self, raw: Any, **kw: Any) -> None:
        self.loop.on_decode_end(raw, **kw)

    def bind_hook(self, hook: Any) -> None:
        self.loop.bind_hook(hook)

    def add(self, segments: list[Segment]) -> None:
        with self._lock:
            self._pending.extend(segments)
            self.received += len(segments)

    def request_done(self) -> None:
        """Everything pending belongs to finished requests: ready to replay."""
        with self._lock:
            self._ready.extend(self._pending)
            self._pending = []
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
        """Settle: replay the finished requests, one at a time. ``stop()`` is asked
        before each; when it says True the rest is left for later. ``pause()`` is
        called before every simulated kernel and gap: it may block (holding the replay
        where it is) or raise ``SettleAborted``. True when every finished request has
        been settled."""
        with self._replay_lock:
            with self._lock:
                ready, self._ready = self._ready, []
                first = self._ready_upto - len(ready)  # index of ready[0] in received
            parts = _split_requests(ready)
            applied: list[tuple[int, int]] = []
            if any(s.kind == "kernel" for s in ready):
                self.loop.wait_idle()
                applied = list(self.loop.applied_log)
            done = 0
            for i, part in enumerate(parts):
                if stop is not None and stop():
                    rest = [s for p in parts[i:] for s in p]
                    with self._lock:
                        self._ready = rest + self._ready
                    return False
                if any(s.kind == "kernel" for s in part):
                    t0 = time.thread_time_ns()
                    self._account_applied(part, applied)
                    self.settle_cpu_ns += time.thread_time_ns() - t0
                    self._settle_one(part, pause)
                done += len(part)
                self.settled_upto = first + done
            return True

    def _account_applied(self, req: list[Segment], applied: list[tuple[int, int]]) -> None:
        """Applied energy of the live loop's switches on this request's recorded
        timeline, and a pass-through replay of the same request through a fresh
        controller accounted alike (both simulated)."""
        tokens = sum(1 for s in req if s.stall is StallKind.SAMPLE)
        if not tokens:
            return
        got = energy_on_timeline(req, applied, self.device, initial_level=self._initial_level)
        # on the recorded clock: the pass-through controller keeps its state (request
        # ends, switch history) across requests, so its clock must not restart at 0
        dev = SimGpu(self.device.profile, start_ns=req[0].t_ns)
        try:
            # with the live run's timing (when each graph reached the planner and its
            # plan the executor; engine timing alone), so it is a replay of this run
            r = replay(
                req,
                self.pass_through,
                dev,
                timing="recorded",
                counters=False,
                plan_delays_ns=dict(self.loop.plan_delay_ns),
                graph_inputs_ns=dict(self.loop.graph_input_ns),
                plans_dropped=set(self.loop.plans_dropped),
            )
        except (DeviceError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return
        self.applied_j += got.energy_j
        self.replay_pass_j += r.energy_j
        self.pass_tokens += tokens

    def _settle_one(self, req: list[Segment], pause: Callable[[], None] | None) -> None:
        t0 = time.thread_time_ns()
        e0, b0 = self.device.energy_j, self.shadow.energy_j
        dev: Any = self.device if pause is None else _Gated(self.device, pause)
        shadow: Any = self.shadow if pause is None else _Gated(self.shadow, pause)
        try:
            r = replay(req, self.controller, dev)
            base = replay(req, self.baseline, shadow)
        except (DeviceError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("simulated accounting skipped a request: %s", e)
            return
        finally:
            self.settle_cpu_ns += time.thread_time_ns() - t0
        self.virtual_s += r.duration_s
        self.tokens += r.tokens
        self.requests += r.requests
        self.switches += r.switches
        self.decision_us.extend(r.decision_us)
        record = {
            "request": next(s.request for s in req if s.kind == "kernel"),
            "energy_j": self.device.energy_j - e0,
            "default_energy_j": self.shadow.energy_j - b0,
            "tokens": r.tokens,
            "tpot_ms": r.tpot_ms,
            "default_tpot_ms": base.tpot_ms,
            "simulated": True,
        }
        if r.tokens:
            self.recent.append(record)
        self._published = self._figures()
        for sink in self._settled_sinks:
            try:
                sink(record)
            except Exception:  # a reader's bug must not stop accounting
                log.exception("settled-request sink failed")

    def _figures(self) -> dict[str, Any]:
        loop = self.loop.health()
        d, s = self.device, self.shadow
        t_s = self.virtual_s
        saved = s.energy_j - d.energy_j
        us = sorted(self.decision_us)
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
            "decision_us_median": us[len(us) // 2] if us else None,
            "recent_requests": list(self.recent),
            "applied_energy_per_token_j": (
                self.applied_j / self.pass_tokens if self.pass_tokens else None
            ),
            "replay_energy_per_token_j": (
                self.replay_pass_j / self.pass_tokens if self.pass_tokens else None
            ),
            "live": {
                "switches": loop["decisions_applied"],
                "levels_used": loop["levels_used"],
                "graphs_planned": loop["graphs_planned"],
                "graph_plan_us_median": loop["graph_plan_us_median"],
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
                "cpu_ms_per_token": self.settle_cpu_ns / 1e6 / self.tokens if self.tokens else None,
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


def _split_requests(segments: list[Segment]) -> list[list[Segment]]:
    """Split at idle stalls; each part keeps its leading idle gap."""
    parts: list[list[Segment]] = [[]]
    for s in segments:
        if s.stall is StallKind.IDLE and parts[-1]:
            parts.append([])
        parts[-1].append(s)
    return [p for p in parts if p]


class RealDeviceControl:
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

    def on_event(self, event: Event) -> None:
        self.governor.on_event(event)

    def on_decode_begin(self, graph: int) -> None:
        self.governor.on_decode_begin(graph)

    def graph_end(self) -> None:
        self.governor.graph_end()

    def on_decode_end(self, raw: Any, **kw: Any) -> None:
        self.governor.on_decode_end(raw, **kw)

    def bind_hook(self, hook: Any) -> None:
        self.governor.bind_hook(hook)

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
            "decision_us_median": health["decision_us_median"],
            "graph_plan_us_median": health["graph_plan_us_median"],
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
