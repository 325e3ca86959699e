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
from collections import deque
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


class SimulatedAccount:
    """Controller + simulator in virtual time, fed with completed requests; and the
    live loop on a recording executor, whose switches are accounted on the recorded
    timeline (applied energy)."""

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
        self._lock = threading.Lock()
        self._pending: list[Segment] = []
        self._ready: list[Segment] = []
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self.tokens = 0
        self.requests = 0
        self.switches = 0
        self.virtual_s = 0.0
        self.decision_us: deque[float] = deque(maxlen=4096)
        self.last_error: str | None = None
        self._final: dict[str, Any] | None = None

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

    def request_done(self) -> None:
        """Everything pending belongs to finished requests: ready to replay."""
        with self._lock:
            self._ready.extend(self._pending)
            self._pending = []

    def flush(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            if not ready or not any(s.kind == "kernel" for s in ready):
                return
            self.loop.wait_idle()
            applied = list(self.loop.applied_log)
            for req in _by_request(ready):
                self._account_applied(req, applied)
                e0, b0 = self.device.energy_j, self.shadow.energy_j
                try:
                    r = replay(req, self.controller, self.device)
                    base = replay(req, self.baseline, self.shadow)
                except (DeviceError, ValueError) as e:
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.warning("simulated accounting skipped a request: %s", e)
                    continue
                self.virtual_s += r.duration_s
                self.tokens += r.tokens
                self.requests += r.requests
                self.switches += r.switches
                self.decision_us.extend(r.decision_us)
                if r.tokens:
                    self.recent.append(
                        {
                            "energy_j": self.device.energy_j - e0,
                            "default_energy_j": self.shadow.energy_j - b0,
                            "tokens": r.tokens,
                            "tpot_ms": r.tpot_ms,
                            "default_tpot_ms": base.tpot_ms,
                            "simulated": True,
                        }
                    )

    def _account_applied(self, req: list[Segment], applied: list[tuple[int, int]]) -> None:
        """Applied energy of the live loop's switches on this request's recorded
        timeline, and a pass-through replay of the same request through a fresh
        controller accounted alike (both simulated)."""
        tokens = sum(1 for s in req if s.stall is StallKind.SAMPLE)
        if not tokens:
            return
        got = energy_on_timeline(req, applied, self.device, initial_level=self._initial_level)
        dev = SimGpu(self.device.profile)
        try:
            r = replay(req, self.pass_through, dev, timing="recorded")
        except (DeviceError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return
        self.applied_j += got.energy_j
        self.replay_pass_j += r.energy_j
        self.pass_tokens += tokens

    def summary(self) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        self.flush()
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
        }

    def close(self) -> None:
        """Settle the figures (kept readable afterwards), then close both simulators."""
        if self._final is None:
            self.request_done()
            self._final = self.summary()
        self.loop.close()
        self.device.close()
        self.shadow.close()


def _by_request(segments: list[Segment]) -> list[list[Segment]]:
    """Split at idle stalls; each part keeps its leading idle gap."""
    parts: list[list[Segment]] = [[]]
    for s in segments:
        if s.stall is StallKind.IDLE and parts[-1]:
            parts.append([])
        parts[-1].append(s)
    return [p for p in parts if any(s.kind == "kernel" for s in p)]


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

    def summary(self) -> dict[str, Any]:
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
