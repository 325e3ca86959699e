"""Python side of the native plan executor (``hooks/ti_exec.c``).

The executor runs ``control.plan.Plan`` inside ``llama_decode`` without the GIL: node
switches from the eval callback, timed ones from its own timer thread, through an
actuator opened once (``devices.native``). Python sets a plan between decodes with one
call and reads the log of applied switches afterwards. Where the library was not built,
``control.executor_model.ExecutorModel`` has the same semantics in pure Python.

Lifecycle: ``stop()`` joins the timer thread (no write lands after it returns); call it
before restoring the device. Each executor registers a ``RestoreGuard`` after its device
did, and guards run newest first, so atexit and SIGTERM/SIGINT stop it before the device
is restored. ``close()`` also detaches from hooks and frees the library state.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import threading
from typing import Any

import numpy as np

from ..control.executor_model import SOURCES
from ..control.plan import Anchor, Applied, Plan
from ..devices.guard import RestoreGuard
from ..devices.native import (
    KmodActuator,
    NativeActuator,
    RecordActuator,
    SysfsOneActuator,
    SysfsPairActuator,
)
from . import hooks

PLAN_MAX = 256  # TI_PLAN_MAX
MAX_LEVELS = 32  # TI_EXEC_MAX_LEVELS
VALUE_LEN = 32  # TI_EXEC_VALUE_LEN
PATH_LEN = 256  # TI_EXEC_PATH_LEN
MAX_LOG = 1 << 20  # TI_EXEC_MAX_LOG
_ACT_RECORD, _ACT_KMOD, _ACT_SYSFS_PAIR, _ACT_SYSFS_ONE = 0, 1, 2, 3


class ExecutorError(RuntimeError):
    """The native executor refused a request, or is unavailable."""


class _Switch(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_int64),
        ("expect_ns", ctypes.c_int64),
        ("anchor", ctypes.c_int32),
        ("level", ctypes.c_int32),
    ]


class _Plan(ctypes.Structure):
    _fields_ = [
        ("graph", ctypes.c_uint64),
        ("predicted_ns", ctypes.c_int64),
        ("margin_ns", ctypes.c_int64),
        ("gain", ctypes.c_double),
        ("first_level", ctypes.c_int32),
        ("end_level", ctypes.c_int32),
        ("fallback_level", ctypes.c_int32),
        ("n_nodes", ctypes.c_uint32),
        ("n_switches", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("after_graph", ctypes.c_uint64),
        ("after_t0_ns", ctypes.c_int64),
        ("switches", _Switch * PLAN_MAX),
    ]


class _Config(ctypes.Structure):
    _fields_ = [
        ("n_levels", ctypes.c_uint32),
        ("log_capacity", ctypes.c_uint32),
        ("actuator", ctypes.c_int32),
        ("initial_level", ctypes.c_int32),
        ("initial_floor", ctypes.c_int32),
        ("initial_ceiling", ctypes.c_int32),
        ("record_cost_ns", ctypes.c_int64),
        ("levels_hz", ctypes.c_uint64 * MAX_LEVELS),
        ("path", (ctypes.c_char * PATH_LEN) * 2),
        ("values", ((ctypes.c_char * VALUE_LEN) * MAX_LEVELS) * 2),
    ]


class _Status(ctypes.Structure):
    _fields_ = [
        ("applied", ctypes.c_uint64),
        ("skipped", ctypes.c_uint64),
        ("mismatches", ctypes.c_uint64),
        ("late_plans", ctypes.c_uint64),
        ("log_overflow", ctypes.c_uint64),
        ("deferred", ctypes.c_uint64),
        ("defer_overflow", ctypes.c_uint64),
        ("plans_set", ctypes.c_uint64),
        ("failed_errno", ctypes.c_int32),
        ("cur_level", ctypes.c_int32),
        ("stopped", ctypes.c_int32),
        ("timer_rt", ctypes.c_int32),
        ("timer_wakes", ctypes.c_uint64),
    ]


# struct ti_applied, drained straight into a numpy array.
APPLIED_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"),
        ("freq_hz", "<u8"),
        ("cost_ns", "<i8"),
        ("graph", "<u8"),
        ("level", "<i4"),
        ("source", "<i4"),
        ("node", "<i4"),
        ("err", "<i4"),
        ("due_ns", "<i8"),
    ]
)

_STRUCTS: dict[str, Any] = {
    "ti_switch": _Switch,
    "ti_plan": _Plan,
    "ti_exec_config": _Config,
    "ti_exec_status": _Status,
}


def _abi_mismatch(lib: ctypes.CDLL) -> str:
    """Empty if every struct's size and field offsets match the library, else why not."""
    for name, struct in _STRUCTS.items():
        if lib.ti_exec_struct_size(name.encode()) != ctypes.sizeof(struct):
            return f"{name} size {lib.ti_exec_struct_size(name.encode())}"
        for field, *_ in struct._fields_:
            if field == "reserved":
                continue
            off = getattr(struct, field).offset
            if lib.ti_exec_field_offset(name.encode(), field.encode()) != off:
                return f"{name}.{field} is not at offset {off}"
    if lib.ti_exec_struct_size(b"ti_applied") != APPLIED_DTYPE.itemsize:
        return "ti_applied size"
    fields: dict[str, Any] = dict(APPLIED_DTYPE.fields or {})
    for field in APPLIED_DTYPE.names or ():
        if lib.ti_exec_field_offset(b"ti_applied", field.encode()) != fields[field][1]:
            return f"ti_applied.{field} is not at offset {fields[field][1]}"
    return ""


def _load() -> tuple[ctypes.CDLL | None, str]:
    path = hooks._native_path()
    if path is None or not hooks.NATIVE_AVAILABLE:
        return None, "turboinfer_llama/_ti_hooks was not built"
    try:
        lib = ctypes.CDLL(str(path))
        vp, i32, u32, u64, i64 = (
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_uint32,
            ctypes.c_uint64,
            ctypes.c_int64,
        )
        for name, restype, argtypes in [
            ("ti_exec_create", ctypes.c_int, [ctypes.POINTER(_Config), ctypes.POINTER(vp)]),
            ("ti_exec_destroy", None, [vp]),
            ("ti_exec_stop", None, [vp]),
            ("ti_exec_set_plan", ctypes.c_int, [vp, ctypes.POINTER(_Plan)]),
            (
                "ti_exec_set_plan_at",
                ctypes.c_int,
                [vp, ctypes.POINTER(_Plan), ctypes.POINTER(ctypes.c_int64)],
            ),
            ("ti_exec_graph_begin", None, [vp, u64]),
            ("ti_exec_on_node", None, [vp, i32, ctypes.c_bool, i64]),
            ("ti_exec_graph_end", None, [vp]),
            ("ti_exec_graph_end_at", None, [vp, ctypes.POINTER(ctypes.c_int64)]),
            ("ti_exec_switch_now", ctypes.c_int, [vp, i32]),
            ("ti_exec_drain_log", u32, [vp, vp, u32]),
            ("ti_exec_status", None, [vp, ctypes.POINTER(_Status)]),
            ("ti_exec_struct_size", i64, [ctypes.c_char_p]),
            ("ti_exec_field_offset", i64, [ctypes.c_char_p, ctypes.c_char_p]),
            ("ti_exec_standin_enable", ctypes.c_int, [vp, ctypes.c_double]),
            ("ti_exec_standin_begin", None, [vp]),
            ("ti_exec_standin_wait", i64, [vp]),
            ("ti_exec_standin_status", None, [vp, ctypes.POINTER(u64), ctypes.POINTER(i64)]),
            ("ti_exec_bench_nodes", None, [vp, i32, u32, ctypes.c_bool, vp]),
            ("ti_exec_bench_eval", None, [vp, vp, u32, vp]),
            ("ti_hook_set_executor", None, [vp, vp]),
        ]:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
    except (OSError, AttributeError) as e:
        return None, f"cannot load the executor from {path}: {e}"
    why = _abi_mismatch(lib)
    if why:
        return None, f"{path} does not match this package ({why})"
    return lib, ""


_LIB, _WHY = _load()
EXECUTOR_AVAILABLE: bool = _LIB is not None


def _load_held(lib: ctypes.CDLL | None) -> Any:
    """``ti_exec_graph_end_at`` bound so that it keeps the GIL (``ctypes.PyDLL``): the
    engine thread calls it right after ``llama_decode`` returns, and a call that
    released the GIL handed it to a waiting planner, the engine then waiting for it
    back for up to the switch interval. It takes only the executor's mutex (held by
    native code, never across a call into Python) and may write the end-of-graph
    switch. Falls back to ``lib``'s binding."""
    if lib is None:
        return None
    try:
        held = ctypes.PyDLL(lib._name)
        fn = held.ti_exec_graph_end_at
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    except (OSError, AttributeError):
        return lib.ti_exec_graph_end_at
    return fn


_GRAPH_END_AT = _load_held(_LIB)


def _require() -> ctypes.CDLL:
    if _LIB is None:
        raise ExecutorError(f"native plan executor unavailable: {_WHY}")
    return _LIB


def _put(dst: Any, text: str, cap: int, what: str) -> None:
    raw = text.encode()
    if not raw or len(raw) >= cap or b"\0" in raw:
        raise ValueError(f"{what} {text!r}: must be 1..{cap - 1} bytes with no NUL")
    ctypes.memmove(dst, raw, len(raw))


def _config(
    levels_hz: list[int], actuator: NativeActuator, initial_level: int, log_capacity: int
) -> _Config:
    n = len(levels_hz)
    if not 0 < n <= MAX_LEVELS or list(levels_hz) != sorted(set(levels_hz)) or levels_hz[0] <= 0:
        raise ValueError(f"levels_hz must be 1..{MAX_LEVELS} ascending positive distinct values")
    if not -1 <= initial_level < n:
        raise ValueError(f"initial_level {initial_level} outside -1..{n - 1}")
    if not 0 < log_capacity <= MAX_LOG:
        raise ValueError(f"log_capacity must be 1..{MAX_LOG}")
    cfg = _Config(n_levels=n, log_capacity=log_capacity, initial_level=initial_level)
    for i, hz in enumerate(levels_hz):
        cfg.levels_hz[i] = int(hz)
    cfg.initial_floor, cfg.initial_ceiling = 0, n - 1
    tables: list[tuple[str, tuple[str, ...]]] = []
    if isinstance(actuator, RecordActuator):
        cfg.actuator = _ACT_RECORD
        if not 0 <= actuator.cost_ns <= 1_000_000_000:
            raise ValueError("RecordActuator.cost_ns must be 0..1 s")
        cfg.record_cost_ns = actuator.cost_ns
    elif isinstance(actuator, KmodActuator):
        cfg.actuator = _ACT_KMOD
        _put(cfg.path[0], actuator.path, PATH_LEN, "path")
    elif isinstance(actuator, SysfsPairActuator):
        cfg.actuator = _ACT_SYSFS_PAIR
        tables = [
            (actuator.floor_path, actuator.floor_values),
            (actuator.ceiling_path, actuator.ceiling_values),
        ]
        ceiling = actuator.initial_ceiling if actuator.initial_ceiling >= 0 else n - 1
        if not 0 <= actuator.initial_floor <= ceiling < n:
            raise ValueError("need 0 <= initial_floor <= initial_ceiling < number of levels")
        cfg.initial_floor, cfg.initial_ceiling = actuator.initial_floor, ceiling
    elif isinstance(actuator, SysfsOneActuator):
        cfg.actuator = _ACT_SYSFS_ONE
        tables = [(actuator.path, actuator.values)]
    else:
        raise TypeError(f"unknown actuator description {actuator!r}")
    for which, (path, values) in enumerate(tables):
        if len(values) != n:
            raise ValueError(f"{path}: {len(values)} values for {n} levels")
        _put(cfg.path[which], path, PATH_LEN, "path")
        for i, v in enumerate(values):
            _put(cfg.values[which][i], v, VALUE_LEN, "value")
    return cfg


def plan_struct(plan: Plan) -> _Plan:
    """``control.plan.Plan`` as ``struct ti_plan``."""
    p = _Plan(
        graph=plan.graph,
        predicted_ns=plan.predicted_ns,
        margin_ns=plan.margin_ns,
        gain=plan.gain,
        first_level=plan.first_level,
        end_level=plan.end_level,
        fallback_level=plan.fallback_level,
        n_nodes=plan.n_nodes,
        n_switches=len(plan.switches),
        after_graph=plan.after_graph,
        after_t0_ns=plan.after_t0_ns,
    )
    for i, sw in enumerate(plan.switches):
        p.switches[i] = _Switch(
            key=sw.key, expect_ns=sw.expect_ns, anchor=int(Anchor(sw.anchor)), level=sw.level
        )
    return p


def applied_list(records: np.ndarray) -> list[Applied]:
    """Log records (``APPLIED_DTYPE``) as ``control.plan.Applied``."""
    return [
        Applied(t, lv, hz, cost, SOURCES[src], g, node, due)
        for t, hz, cost, g, lv, src, node, due in zip(
            records["t_ns"].tolist(),
            records["freq_hz"].tolist(),
            records["cost_ns"].tolist(),
            records["graph"].tolist(),
            records["level"].tolist(),
            records["source"].tolist(),
            records["node"].tolist(),
            records["due_ns"].tolist(),
            strict=True,
        )
    ]


class NativeExecutor:
    """One native executor over ``levels_hz`` (ascending) driving ``actuator``.

    ``initial_level``: the level in effect now (-1 unknown; a switch to the level in
    effect is skipped). ``log_capacity``: applied records kept between drains; more are
    dropped and counted. Raises ``ExecutorError`` when the library is missing or an
    actuator file cannot be opened (the message carries the errno).
    """

    def __init__(
        self,
        levels_hz: list[int],
        actuator: NativeActuator,
        *,
        initial_level: int = -1,
        log_capacity: int = 4096,
    ) -> None:
        lib = _require()
        cfg = _config(list(levels_hz), actuator, initial_level, log_capacity)
        handle = ctypes.c_void_p()
        rc = lib.ti_exec_create(ctypes.byref(cfg), ctypes.byref(handle))
        if rc != 0:
            code = -rc
            raise ExecutorError(
                f"ti_exec_create failed: {os.strerror(code)} "
                f"({errno_mod.errorcode.get(code, code)}) for {actuator!r}"
            )
        self.levels_hz = tuple(int(h) for h in levels_hz)
        self.actuator = actuator
        self._lib = lib
        self._handle: int | None = handle.value
        # Two locks, both only to keep ``close`` from freeing the handle under a call
        # (the native side locks its own state). ``_lock``: the planner's and the
        # control calls; ``_engine``: the calls the engine thread makes around each
        # ``llama_decode`` (graph begin and end, the stand-in). They are separate so
        # that the engine never waits for the planner: under a busy host the planner,
        # holding ``_lock`` across a native call, then waits for the GIL, and a
        # graph's end switch waited behind it for milliseconds (issue 11). ``close``
        # takes both (``_lock`` first; nothing else takes both). Re-entrant because
        # the restore guard may call stop() from a signal handler inside a call.
        self._lock = threading.RLock()
        self._engine = threading.RLock()
        self._hooks: list[hooks.NativeHook] = []
        self._buf = np.zeros(min(log_capacity, 4096), dtype=APPLIED_DTYPE)
        # graph_end's out-parameter, reused (engine thread only, under _engine)
        self._end_ns = ctypes.c_int64(0)
        self._end_ref = ctypes.byref(self._end_ns)
        self._graph_end_at = _GRAPH_END_AT or lib.ti_exec_graph_end_at
        # close, atexit and SIGTERM/SIGINT stop us before the device (guarded earlier)
        # is restored: guards run newest first
        self._guard = RestoreGuard(self.stop, "native plan executor")

    @property
    def handle(self) -> int | None:
        """The native ``struct ti_exec *`` (None once closed)."""
        return self._handle

    def _h(self) -> int:
        if self._handle is None:
            raise ExecutorError("executor is closed")
        return self._handle

    def set_plan(self, plan: Plan) -> int:
        """Hand over the plan for the next graph (or the running one, when late).
        Returns the executor's clock (ns) at which it took the plan."""
        if len(plan.switches) > PLAN_MAX:
            raise ValueError(f"a plan holds at most {PLAN_MAX} switches")
        t_ns = ctypes.c_int64(0)
        with self._lock:
            rc = self._lib.ti_exec_set_plan_at(
                self._h(), ctypes.byref(plan_struct(plan)), ctypes.byref(t_ns)
            )
        if rc != 0:
            raise ValueError(f"plan rejected by the executor (levels or anchors invalid): {plan}")
        return int(t_ns.value)

    def graph_begin(self, graph_seq: int) -> None:
        """Only without a hook attached: an attached hook's begin_graph does it."""
        with self._engine:
            self._lib.ti_exec_graph_begin(self._h(), graph_seq)

    def on_node(self, ordinal: int, ask: bool, t_ns: int) -> None:
        """What the eval callback calls natively; here for tests and drivers."""
        with self._engine:
            self._lib.ti_exec_on_node(self._h(), ordinal, ask, t_ns)

    def graph_end(self) -> int:
        """Right after llama_decode returns. Returns the executor's clock (ns) at which
        it ended the graph (a plan retargeted past this graph times its stall switches
        from it)."""
        with self._engine:
            self._graph_end_at(self._h(), self._end_ref)
            return int(self._end_ns.value)

    def enable_standin(self, memory_share: float = 0.0) -> None:
        """TESTS AND BENCHMARKS ONLY (``hooks/ti_exec.h``): make each graph take the time
        it would take on a GPU at the levels applied, its host time being the work at
        the top level (``memory_share``: the part that does not scale with the clock).
        Refused (``ExecutorError``) for hardware actuators: kmod, and sysfs files that
        are not regular files outside sysfs."""
        with self._lock:
            rc = self._lib.ti_exec_standin_enable(self._h(), float(memory_share))
        if rc == -errno_mod.EPERM:
            raise ExecutorError(
                f"the clock stand-in is for fake devices only, not {self.actuator!r}"
            )
        if rc != 0:
            raise ValueError(f"memory_share {memory_share} outside [0, 1)")

    def standin_begin(self) -> None:
        """Right before llama_decode, on the thread that calls it."""
        with self._engine:
            self._lib.ti_exec_standin_begin(self._h())

    def standin_wait(self) -> int:
        """Right after llama_decode returns, on the same thread, before ``graph_end``:
        sleep (GIL released) until the graph's work is done at the levels applied. ns
        slept, -1 when off."""
        with self._engine:
            return int(self._lib.ti_exec_standin_wait(self._h()))

    def standin_status(self) -> dict[str, int]:
        """Graphs the stand-in stretched and the ns it slept in all."""
        graphs, waited = ctypes.c_uint64(0), ctypes.c_int64(0)
        with self._lock:
            self._lib.ti_exec_standin_status(self._h(), ctypes.byref(graphs), ctypes.byref(waited))
        return {"graphs": int(graphs.value), "waited_ns": int(waited.value)}

    def switch_now(self, level: int) -> None:
        if not 0 <= level < len(self.levels_hz):
            raise ValueError(f"level {level} outside 0..{len(self.levels_hz) - 1}")
        with self._lock:
            self._lib.ti_exec_switch_now(self._h(), level)

    def drain_raw(self) -> np.ndarray:
        """Applied switches since the last drain (``APPLIED_DTYPE``), oldest first."""
        chunks: list[np.ndarray] = []
        with self._lock:
            if self._handle is None:
                return self._buf[:0].copy()
            buf = self._buf
            while True:
                n = self._lib.ti_exec_drain_log(self._handle, buf.ctypes.data, len(buf))
                chunks.append(buf[:n].copy())
                if n < len(buf):
                    break
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def drain_log(self) -> list[Applied]:
        return applied_list(self.drain_raw())

    def status(self) -> dict[str, int]:
        """Counters: applied, skipped, mismatches, late_plans, log_overflow, deferred
        (callback events handed to the lock holder), defer_overflow, plans_set,
        failed_errno (0 = ok), cur_level, stopped, timer_rt (1: the timer thread got
        SCHED_FIFO; 0: it runs at normal priority, and wakes late on a busy host),
        timer_wakes (signals to the sleeping timer thread: only when a deadline came
        earlier than the one it sleeps to)."""
        st = _Status()
        with self._lock:
            self._lib.ti_exec_status(self._h(), ctypes.byref(st))
        return {f: int(getattr(st, f)) for f, *_ in _Status._fields_ if f != "reserved"}

    def attach(self, hook: hooks.NativeHook) -> None:
        """Feed this executor from ``hook``'s callback (between decodes only)."""
        hook.attach_executor(self)

    def _attached(self, hook: hooks.NativeHook, on: bool) -> None:
        if on and hook not in self._hooks:
            self._hooks.append(hook)
        elif not on and hook in self._hooks:
            self._hooks.remove(hook)

    def stop(self) -> None:
        """Stop and join the timer thread: once this returns no actuator call is in
        flight and none will start. Idempotent."""
        with self._lock:
            if self._handle is not None:
                self._lib.ti_exec_stop(self._handle)

    def close(self) -> None:
        """Stop, detach from every hook, close the actuator files. Idempotent."""
        self._guard.restore()  # stop(), and no longer in the guard list
        for hook in list(self._hooks):
            hook.attach_executor(None)
        with self._lock, self._engine:
            if self._handle is None:
                return
            self._lib.ti_exec_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> NativeExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- benchmarks (bench.executor_cost) -----------------------------------------

    def bench_nodes(self, first: int, n: int, ask: bool = True) -> np.ndarray:
        """ns taken by each of n native ``on_node`` calls (ordinals first..first+n-1)."""
        out = np.zeros(n, dtype=np.int64)
        with self._lock:
            self._lib.ti_exec_bench_nodes(self._h(), first, n, ask, out.ctypes.data)
        return out


def bench_eval(tensor: int, hook: hooks.NativeHook, n: int) -> np.ndarray:
    """ns taken by each of n native ``ti_hook_eval`` ask(+done) pairs on ``tensor``."""
    lib = _require()
    out = np.zeros(n, dtype=np.int64)
    lib.ti_exec_bench_eval(tensor, hook.user_data, n, out.ctypes.data)
    return out


def set_hook_executor(hook_handle: int, executor_handle: int | None) -> None:
    """``ti_hook_set_executor`` (used by ``NativeHook.attach_executor``)."""
    _require().ti_hook_set_executor(hook_handle, executor_handle)


__all__ = [
    "APPLIED_DTYPE",
    "EXECUTOR_AVAILABLE",
    "ExecutorError",
    "KmodActuator",
    "NativeExecutor",
    "RecordActuator",
    "SysfsOneActuator",
    "SysfsPairActuator",
    "applied_list",
    "bench_eval",
    "plan_struct",
]
