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
import errno
import logging
import os
import threading
from typing import Any, Protocol

from .._clock import now_ns
from ..devices.base import DeviceError, GpuDevice
from ..devices.os_errors import translate
from .clock_standin import ClockStandIn
from .executor_model import ExecutorModel
from .plan import Applied, Plan

log = logging.getLogger(__name__)


class LiveExecutor(Protocol):
    native: bool

    def attach(self, hook: Any) -> bool:
        """Receive the eval callback's node events; False when it cannot."""
        ...

    def set_plan(self, plan: Plan) -> int:
        """Hand over a plan; returns the executor's clock (ns) when it took it."""
        ...

    def graph_begin(self, graph: int) -> None: ...
    def graph_end(self) -> None: ...
    def switch_now(self, level: int) -> None: ...
    def drain_log(self) -> list[Applied]: ...
    def error(self) -> str | None: ...
    def exception(self) -> DeviceError | None:
        """The failure as our own error type (None while healthy)."""
        ...

    def cur_level(self) -> int:
        """The level last applied (-1 unknown)."""
        ...

    def status(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...

    # TESTS AND BENCHMARKS ONLY: the CPU stand-in for a GPU clock (control/clock_standin.py)
    def enable_standin(self, memory_share: float) -> None: ...
    def standin_begin(self) -> None:
        """Right before llama_decode, on its thread."""
        ...

    def standin_wait(self) -> int:
        """Right after llama_decode returns: sleep until the graph's work is done at the
        levels applied; ns slept, -1 when off."""
        ...

    def standin_status(self) -> dict[str, int] | None: ...


class ThreadedExecutor:
    """:class:`ExecutorModel` on the real clock: a timer thread fires time-keyed
    switches; the actuator is the device's ``set_hz`` (or nothing: record only). It
    sees no node boundaries: a graph "starts" at ``graph_begin`` (DECODE_BEGIN)."""

    native = False

    def __init__(self, device: GpuDevice | None, levels_hz: list[int]) -> None:
        self._device = device
        self._levels = list(levels_hz)
        self._lock = threading.Lock()  # guards the model, the log cursor and _error
        init = -1  # unknown: the first switch is always written (see _native_for)
        self._model = ExecutorModel(self._levels, initial_level=init, fail_at=self._actuate)
        self._seen = 0
        self._error: str | None = None
        self._exc: DeviceError | None = None
        self._wake = threading.Event()
        self._stopped = False
        self._standin: ClockStandIn | None = None
        self._thread = threading.Thread(target=self._timer, name="turboinfer-executor", daemon=True)
        self._thread.start()

    def _actuate(self, level: int) -> int:
        if self._device is None:
            if self._standin is not None:
                self._standin.switched(level, now_ns())
            return 0
        try:
            self._device.set_hz(self._levels[level])
        except DeviceError as e:
            self._exc = e
            self._error = f"{type(e).__name__}: {e}"
            return errno.EIO
        except OSError as e:
            self._exc = translate(e, getattr(self._device, "name", "?"), "set the clock of")
            self._error = f"{type(self._exc).__name__}: {self._exc}"
            return e.errno or errno.EIO
        if self._standin is not None:  # the write has landed: the new clock from here
            self._standin.switched(level, now_ns())
        return 0

    def exception(self) -> DeviceError | None:
        if self._exc is None and self._model.status.failed_errno:
            code = self._model.status.failed_errno
            return translate(OSError(code, os.strerror(code)), "the executor", "switch")
        return self._exc

    def attach(self, hook: Any) -> bool:
        return False

    def set_plan(self, plan: Plan) -> int:
        # no node boundaries here: node counts cannot be checked
        plan = dataclasses.replace(plan, n_nodes=0)
        with self._lock:
            t = now_ns()
            self._model.set_plan(plan, t)
        self._wake.set()
        return t

    def graph_begin(self, graph: int) -> None:
        with self._lock:
            t = now_ns()
            self._model.graph_begin(graph, t)
            self._model.on_node(0, True, t)
        self._wake.set()

    def graph_end(self) -> None:
        with self._lock:
            self._model.graph_end(now_ns())

    def switch_now(self, level: int) -> None:
        with self._lock:
            self._model.switch_now(level, now_ns())

    def drain_log(self) -> list[Applied]:
        with self._lock:
            log_ = self._model.log
            new = log_[self._seen :]
            del log_[:]
            self._seen = 0
            return new

    def error(self) -> str | None:
        if self._error is None and self._model.status.failed_errno:
            return os.strerror(self._model.status.failed_errno)
        return self._error

    def cur_level(self) -> int:
        return int(self._model.status.cur_level)

    def status(self) -> dict[str, Any]:
        st = self._model.status
        return {
            "native": False,
            "applied": st.applied,
            "late_plans": st.late_plans,
            "mismatches": st.mismatches,
            "failed_errno": st.failed_errno,
        }

    def _timer(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._model.advance(now_ns())
                due = self._model.due()
                self._wake.clear()
            timeout = None if due is None else max(0.0, (due - now_ns()) / 1e9)
            self._wake.wait(timeout)

    def enable_standin(self, memory_share: float) -> None:
        with self._lock:
            self._standin = ClockStandIn(self._levels, memory_share)
            if self._model.status.cur_level >= 0:
                self._standin.switched(self._model.status.cur_level, now_ns())

    def standin_begin(self) -> None:
        s = self._standin
        if s is not None:
            s.begin()

    def standin_wait(self) -> int:
        s = self._standin
        return -1 if s is None else s.wait()  # never under _lock: switches must land

    def standin_status(self) -> dict[str, int] | None:
        s = self._standin
        return None if s is None else s.status()

    def stop(self) -> None:
        """Join the timer thread; no switch is applied afterwards."""
        if self._standin is not None:
            self._standin.stop()
        with self._lock:
            self._stopped = True
            self._model.stop()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def close(self) -> None:
        self.stop()


class NativeLiveExecutor:
    """The native executor (``engine.executor``) behind the live loop's interface."""

    native = True

    def __init__(self, ex: Any) -> None:
        self._ex = ex
        self._attached = False
        self._standin = False

    def attach(self, hook: Any) -> bool:
        from ..engine.hooks import NativeHook

        if not isinstance(hook, NativeHook):
            return False
        self._ex.attach(hook)
        self._attached = True
        return True

    def set_plan(self, plan: Plan) -> int:
        if not self._attached:
            plan = dataclasses.replace(plan, n_nodes=0)
        return int(self._ex.set_plan(plan))

    def graph_begin(self, graph: int) -> None:
        if not self._attached:  # an attached hook's begin_graph does it natively
            self._ex.graph_begin(graph)
            self._ex.on_node(0, True, now_ns())

    def graph_end(self) -> None:
        self._ex.graph_end()

    def switch_now(self, level: int) -> None:
        self._ex.switch_now(level)

    def drain_log(self) -> list[Applied]:
        return list(self._ex.drain_log())

    def error(self) -> str | None:
        code = self._ex.status().get("failed_errno", 0)
        return f"{os.strerror(code)} (errno {code})" if code else None

    def exception(self) -> DeviceError | None:
        code = self._ex.status().get("failed_errno", 0)
        if not code:
            return None
        what = getattr(self._ex, "actuator", "the native executor")
        return translate(OSError(code, os.strerror(code)), str(what), "write the clock of")

    def cur_level(self) -> int:
        return int(self._ex.status().get("cur_level", -1))

    def status(self) -> dict[str, Any]:
        return {"native": True, **self._ex.status()}

    def enable_standin(self, memory_share: float) -> None:
        self._ex.enable_standin(memory_share)
        self._standin = True

    def standin_begin(self) -> None:
        if self._standin:
            self._ex.standin_begin()

    def standin_wait(self) -> int:
        return int(self._ex.standin_wait()) if self._standin else -1

    def standin_status(self) -> dict[str, int] | None:
        return dict(self._ex.standin_status()) if self._standin else None

    def stop(self) -> None:
        self._ex.stop()

    def close(self) -> None:
        self._ex.close()


def _native_for(device: GpuDevice, levels_hz: list[int], record_only: bool) -> Any:
    try:
        from ..devices.native import RecordActuator
        from ..engine.executor import ExecutorError, NativeExecutor
    except ImportError:
        return None
    get = getattr(device, "native_actuator", None)
    if get is None and not record_only:
        return None
    try:
        actuator = RecordActuator() if record_only or get is None else get()
    except (DeviceError, OSError) as e:
        log.info("%s: no native actuator (%s); Python executor", getattr(device, "name", "?"), e)
        return None
    # a real device's clock reading says nothing about what is pinned: the first
    # switch is always written (-1 = unknown); the simulator's recorder starts where it is
    init = -1
    if record_only:
        try:
            init = levels_hz.index(device.current_hz())
        except (ValueError, DeviceError, OSError):
            init = -1
    try:
        return NativeLiveExecutor(NativeExecutor(levels_hz, actuator, initial_level=init))
    except ExecutorError as e:
        log.info("native executor unavailable (%s); Python executor", e)
        return None


def make_executor(
    device: GpuDevice, levels_hz: list[int], *, record_only: bool, native: bool = True
) -> LiveExecutor:
    """The native executor with the device's actuator when both exist, else Python."""
    if native:
        ex = _native_for(device, levels_hz, record_only)
        if ex is not None:
            return ex  # type: ignore[no-any-return]
    return ThreadedExecutor(None if record_only else device, levels_hz)
