"""The live governor loop: engine events in, frequency decisions out to a GpuDevice.

Fast path -- the governor runs in the producer's context. The engine's hooks call
``Governor.on_event`` synchronously at each event boundary (graph start, node,
graph end, token). That call first applies any timed decision that has come due,
then asks the controller, then applies an immediate decision with ``set_hz`` -- all
on the engine's own thread, so a planned switch lands at the boundary without
waiting for another Python thread to be scheduled (on a loaded phone a thread
wake-up costs tens to hundreds of microseconds, the GIL hand-off more; the inline
path costs one controller call, measured by ``bench/decision_time.py``).
Decisions planned for instants *between* events (the raise one switch latency
before a stall ends) go to a small timer thread that sleeps until the next one is
due; it is the only path that waits for a wake-up, and it is used only inside stalls.

Health: if the device fails (``DeviceError`` or ``OSError``: a write error, the
device gone), the governor restores the snapshot it took at start (the device's
default governor and range), stops steering, keeps accepting events so generation
goes on, logs the error and reports it in ``health()``.
"""

from __future__ import annotations

import bisect
import logging
import statistics
import threading
import time
from typing import Any

from .._clock import now_ns
from ..devices.base import DeviceError, DeviceState, GpuDevice
from ..engine.events import Event, EventKind
from .base import Controller, Decision

log = logging.getLogger(__name__)

_COUNTER_EVENTS = (EventKind.DECODE_END,)


class Governor:
    """Drive ``device`` with ``controller`` from live events (see module docstring)."""

    def __init__(
        self,
        controller: Controller,
        device: GpuDevice,
        *,
        timer: bool = True,
        clock: Any = now_ns,
    ) -> None:
        self.controller = controller
        self.device = device
        self._clock = clock
        self._lock = threading.RLock()
        self._queue: list[tuple[int, int, Decision]] = []
        self._seq = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._use_timer = timer
        self._snapshot: DeviceState | None = None
        self._steering = not getattr(controller, "uses_device_governor", False)
        self._on_counters = getattr(controller, "on_counters", None)
        self.failed = False
        self.error: str | None = None
        self.fallback: str | None = None
        self.applied = 0
        self.events = 0
        self._graph = -1
        self._decision_ns: list[int] = []

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> Governor:
        try:
            self._snapshot = self.device.snapshot()
        except (DeviceError, OSError) as e:
            self._fail(e, restore=False)
            return self
        if self._use_timer and self._steering:
            self._thread = threading.Thread(
                target=self._timer_loop, name="turboinfer-governor", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the timer and put the device back as it was found."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._lock:
            if self._snapshot is not None and not self.failed:
                try:
                    self.device.restore(self._snapshot)
                except (DeviceError, OSError) as e:
                    log.warning("could not restore %s on close: %s", self.device.name, e)

    def __enter__(self) -> Governor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- fast path: called by the engine's hooks -------------------------------------

    def on_event(self, event: Event) -> None:
        """Handle one engine event on the caller's thread."""
        with self._lock:
            self.events += 1
            if self.failed:
                return
            self._apply_due(self._clock())
            if self._on_counters is not None and event.kind in _COUNTER_EVENTS:
                try:
                    counters = self.device.read_counters()
                except (DeviceError, OSError) as e:
                    self._fail(e)
                    return
                self._on_counters(counters)
            graph_start = event.kind is EventKind.NODE_ASK and event.graph != self._graph
            if graph_start:
                self._graph = event.graph
            t0 = time.perf_counter_ns()
            d = self.controller.on_event(event)
            plan = (
                self.controller.plan(event.t_ns)
                if d is not None or graph_start or event.kind in _PLAN_EVENTS
                else None
            )
            self._decision_ns.append(time.perf_counter_ns() - t0)
            if len(self._decision_ns) > 100_000:
                del self._decision_ns[:50_000]
            if plan is not None:
                self._queue = []
                for p in plan:
                    self._push(p)
            if d is not None:
                self._push(d)
            self._apply_due(self._clock())

    def _push(self, d: Decision) -> None:
        self._seq += 1
        bisect.insort(self._queue, (d.at_ns, self._seq, d))
        self._wake.set()

    def _apply_due(self, now: int) -> None:
        while self._queue and self._queue[0][0] <= now and not self.failed:
            _, _, d = self._queue.pop(0)
            try:
                self.device.set_hz(d.freq_hz)
                self.applied += 1
            except (DeviceError, OSError) as e:
                self._fail(e)

    # ---- timer path: decisions due between events ----------------------------------

    def _timer_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._apply_due(self._clock())
                nxt = self._queue[0][0] if self._queue else None
                self._wake.clear()
            timeout = None if nxt is None else max(0.0, (nxt - self._clock()) / 1e9)
            self._wake.wait(timeout)

    # ---- health ----------------------------------------------------------------------

    def _fail(self, err: BaseException, *, restore: bool = True) -> None:
        self.failed = True
        self.error = f"{type(err).__name__}: {err}"
        self._queue = []
        log.error(
            "GPU device %s failed: %s; handing it back to its default governor",
            getattr(self.device, "name", "?"),
            self.error,
        )
        if not restore or self._snapshot is None:
            self.fallback = "none (no snapshot)"
            return
        try:
            self.device.restore(self._snapshot)
            self.fallback = f"restored default governor {self._snapshot.governor!r}"
        except (DeviceError, OSError) as e:
            self.fallback = f"restore failed: {type(e).__name__}: {e}"
            log.error("restoring %s failed too: %s", getattr(self.device, "name", "?"), e)

    def health(self) -> dict[str, Any]:
        """State for ``llm.power.stats()`` and logs."""
        return {
            # the device's own: foreign writes seen, lock, state file, guardian
            "device_health": getattr(self.device, "health", lambda: None)(),
            "ok": not self.failed,
            "controller": getattr(self.controller, "name", type(self.controller).__name__),
            "device": getattr(self.device, "name", "?"),
            "error": self.error,
            "fallback": self.fallback,
            "events": self.events,
            "decisions_applied": self.applied,
            "decision_us_median": (
                statistics.median(self._decision_ns) / 1e3 if self._decision_ns else None
            ),
        }


_PLAN_EVENTS = (
    EventKind.DECODE_END,
    EventKind.REQUEST_END,
    EventKind.IDLE,
)
