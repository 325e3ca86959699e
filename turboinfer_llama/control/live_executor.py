"""The executor the live loop drives: the native one when it is built, else a Python one.

Both run a :class:`~turboinfer_llama.control.plan.Plan` with the semantics written in
``control/plan.py``. The native executor (``engine.executor``, ``hooks/ti_exec.c``)
sees node boundaries from the eval callback and actuates without the GIL; the Python
:class:`ThreadedExecutor` wraps :class:`ExecutorModel` with a timer thread on the real
clock and sees no node boundaries (plans for it are time-keyed), so it is the fallback
for builds without the C library and for the adb backend, whose round trip is
milliseconds anyway: its switches are issued off the engine thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Protocol

from .._clock import now_ns
from ..devices.base import DeviceError, GpuDevice
from .executor_model import ExecutorModel
from .plan import Applied, Plan

log = logging.getLogger(__name__)


class LiveExecutor(Protocol):
    native: bool

    def attach(self, hook: Any) -> bool:
        """Receive the eval callback's node events; False when it cannot."""
        ...

    def set_plan(self, plan: Plan) -> None: ...
    def graph_begin(self, graph: int) -> None: ...
    def graph_end(self) -> None: ...
    def switch_now(self, level: int) -> None: ...
    def drain_log(self) -> list[Applied]: ...
    def error(self) -> str | None: ...
    def status(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


class ThreadedExecutor:
    """:class:`ExecutorModel` on the real clock: a timer thread fires time-keyed
    switches; ``actuate`` is the device's ``set_hz`` (or nothing: record only)."""

    native = False

    def __init__(self, device: GpuDevice | None, levels_hz: list[int]) -> None:
        self._device = device
        self._levels = list(levels_hz)
        self._lock = threading.Lock()  # guards the model, the log cursor and _error
        self._model = ExecutorModel(self._levels, actuate=self._actuate)
        self._seen = 0
        self._error: str | None = None
        self._stopped = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._timer, name="turboinfer-executor", daemon=True)
        self._thread.start()

    def _actuate(self, t_ns: int, level: int) -> None:
        if self._stopped or self._error is not None or self._device is None:
            return
        try:
            self._device.set_hz(self._levels[level])
        except (DeviceError, OSError) as e:
            self._error = f"{type(e).__name__}: {e}"

    def attach(self, hook: Any) -> bool:
        return False

    def set_plan(self, plan: Plan) -> None:
        # no node boundaries here: node counts cannot be checked
        plan = dataclasses.replace(plan, n_nodes=0)
        with self._lock:
            self._model.set_plan(plan, now_ns())
        self._wake.set()

    def graph_begin(self, graph: int) -> None:
        with self._lock:
            self._model.graph_begin(graph)
            # no node events here: the graph "starts" now for its time-keyed switches
            self._model.on_node(0, True, now_ns())
        self._wake.set()

    def graph_end(self) -> None:
        with self._lock:
            self._model.graph_end(now_ns())

    def switch_now(self, level: int) -> None:
        with self._lock:
            self._model.switch_now(level, now_ns())

    def drain_log(self) -> list[Applied]:
        with self._lock:
            new = self._model.log[self._seen :]
            self._seen = len(self._model.log)
            if self._seen > 4096:  # keep the model's log short
                del self._model.log[: self._seen]
                self._seen = 0
            return new

    def error(self) -> str | None:
        return self._error

    def status(self) -> dict[str, Any]:
        m = self._model
        return {
            "native": False,
            "applied": m.applied,
            "late_plans": m.late_plans,
            "mismatches": m.mismatches,
            "error": self._error,
        }

    def _timer(self) -> None:
        while not self._stopped:
            with self._lock:
                self._model.advance(now_ns())
                due = self._model.next_due()
                self._wake.clear()
            timeout = None if due is None else max(0.0, (due - now_ns()) / 1e9)
            self._wake.wait(timeout)

    def stop(self) -> None:
        """Join the timer thread; no switch is applied afterwards."""
        with self._lock:
            self._stopped = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def close(self) -> None:
        self.stop()


def make_executor(
    device: GpuDevice, levels_hz: list[int], *, record_only: bool, native: bool = True
) -> LiveExecutor:
    """The native executor with the device's actuator when both exist, else Python."""
    if native:
        try:
            from ..engine.executor import native_executor_for
        except ImportError:
            native_executor_for = None  # type: ignore[assignment]
        if native_executor_for is not None:
            ex = native_executor_for(device, levels_hz, record_only=record_only)
            if ex is not None:
                return ex  # type: ignore[no-any-return]
    return ThreadedExecutor(None if record_only else device, levels_hz)
