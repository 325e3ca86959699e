"""PowerSession: the plugin's per-model state, exposed as ``llm.power``.

It owns the eval hook's Python side, the timeline, and (once wired) the device and
controller. Engine-side code calls the small ``on_*`` methods at event boundaries;
they must stay cheap, they run on the decode path.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._clock import now_ns
from .devices.base import GpuDevice
from .engine.events import Event, EventKind
from .engine.hooks import EvalHook, GraphRecords
from .engine.segments import Segment
from .engine.timeline import Derived, Timeline, expand
from .live import RealDeviceControl, SettleAborted, SimulatedAccount
from .settings import PowerSettings
from .trace.perfetto import chrome_trace, write_chrome_trace
from .trace.record import save_trace

if TYPE_CHECKING:
    from .control.governor import Governor

log = logging.getLogger("turboinfer_llama")

SegmentSink = Callable[[list[Segment]], None]
Live = SimulatedAccount | RealDeviceControl


_OPEN_SESSIONS: weakref.WeakSet[PowerSession] = weakref.WeakSet()


@atexit.register
def _close_open_sessions() -> None:
    """Close sessions while their (daemon) worker threads can still run: after
    atexit, the interpreter freezes daemon threads, possibly holding our locks."""
    for session in list(_OPEN_SESSIONS):
        session.close()


def _trim_heap() -> None:
    """Give freed heap pages back to the OS after a backlog is settled (glibc keeps
    them otherwise, and a long-running server's RSS would stay at its peak)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _no_decoder(raw: Any) -> Any:
    raise RuntimeError("hook records arrived after the session closed")


class PowerSession:
    """Hot path: ``on_*`` methods only append events and undecoded hook records to a
    pending list (a numpy copy per decode call; no per-node Python work). Decoding,
    segment derivation and simulated accounting run on a worker thread while no
    request is in flight (or once more than ``WAKE_RECORDS`` records wait, to bound
    memory), and synchronously when something reads the timeline or the figures."""

    # the pure-Python hook's records, decoded between GIL hand-offs (about 0.5 ms of
    # work); the native hook's are derived one drain at a time, as arrays
    SLICE_RECORDS = 128
    WAKE_RECORDS = 262_144  # about 60 MB of raw records, ~320 gemma-3-270m decode steps
    # Simulated accounting (settling) starts once no request has run for this long: a
    # client's next request usually follows within a few ms, and settling must not
    # sit between it and its first token.
    SETTLE_QUIET_NS = 50_000_000
    # close() settles everything still owed, so figures read afterwards are complete. A
    # server turns this off: replaying a backlog would hold up its shutdown.
    SETTLE_ON_CLOSE = True

    def __init__(self, settings: PowerSettings, hook: EvalHook, live: Live | None = None) -> None:
        self.settings = settings
        self.live = live
        self._real = live if isinstance(live, RealDeviceControl) else None
        account = live if isinstance(live, SimulatedAccount) else None
        self._account = account
        window_s = settings.timeline_window_s
        # The window drops its Segment objects on its bounds even before accounting
        # has settled them: the accounting keeps its own copy of every segment it has
        # not settled, packed in arrays (``live.SimulatedAccount``), so none is lost
        # and a backlog costs no small Python objects (issue 14's memory bound).
        self._timeline = Timeline(
            settings.timeline_max_events,
            window_ns=int(window_s * 1e9) if window_s > 0 else None,
        )
        # Memory bound: past these backlogs the worker decodes and settles even while
        # requests run (unsettled segments wait in the accounting's arrays).
        self._wake_records = self.WAKE_RECORDS
        self._settle_backlog = max(self.WAKE_RECORDS, settings.timeline_max_events)
        self._last_end_ns = now_ns()
        # Set at every request begin and end: the worker waits on it (never polls), so
        # an idle or paused worker takes no GIL while requests run.
        self._activity = threading.Event()
        self._last_yield_ns = 0
        self._hook: EvalHook | None = hook
        self._decode_raw = hook.decode_raw
        # records as arrays (engine.blocks), where the hook can: no object per record
        self._decode_block: Callable[[Any], Any] | None = getattr(hook, "decode_block", None)
        # a graph's records as a repeat of the last graph's, where the hook can
        self._drain_graph: Callable[[int], Any] | None = getattr(hook, "drain_graph", None)
        if self._drain_graph is not None and hook.granularity == "graph":
            # a repeated decode graph stays out of the ring (its ask times only): the
            # engine thread drains it at each graph's end, and every drain of ours runs
            # there between decodes (hooks.NativeHook.set_compact)
            set_compact = getattr(hook, "set_compact", None)
            if set_compact is not None:
                set_compact(True)
        self._pending: list[Any] = []
        self._pending_records = 0
        self._swap_lock = threading.Lock()  # guards _pending/_pending_records (brief)
        self._derive_lock = threading.Lock()  # one materialisation at a time, in order
        self._graph = -1
        self._requests = 0
        self._in_flight = 0
        self._held = 0  # requests announced by the caller (server), not yet generating
        self._held_lock = threading.Lock()
        self._tokens = 0
        self._sinks: list[SegmentSink] = []
        # sinks taking segments as derived: objects, or a graph's as arrays
        self._derived_sinks: list[Callable[[list[Derived]], None]] = []
        self._closed = False
        self._decode_begin = (0, 1)
        # the live loop (engine-side calls): the real-device governor, or the
        # simulated device's recording loop
        self._loop: Governor | None = live.engine if live is not None else None
        if live is not None:
            live.bind_hook(hook)
        self.offload: dict[str, Any] | None = None  # set by Llama: where the layers run
        if isinstance(live, SimulatedAccount):
            self._derived_sinks.append(live.add_derived)
        self._wake = threading.Event()
        # the timeline's figures as of the last derivation or settle: what stats(settle=
        # False) reads, with no lock a worker holds (a settle's eviction can hold the
        # timeline's lock for tens of ms)
        self._tl_figures = self._timeline_figures()
        self._worker = threading.Thread(target=self._work, name="turboinfer-timeline", daemon=True)
        self._worker.start()
        _OPEN_SESSIONS.add(self)

    # -- wiring ----------------------------------------------------------------
    def add_segment_sink(self, sink: SegmentSink) -> None:
        """Call ``sink(segments)`` with every batch of newly derived segments."""
        self._sinks.append(sink)

    def control(self, device: GpuDevice, controller: str | None = None) -> None:
        """Drive a device you opened (and will close) with ``controller`` (default: the
        settings'), replacing the current device wiring. Used by the benchmark on real
        hardware, where one device serves several controllers in turn."""
        self.materialize()
        old, self.live, self._real, self._loop = self.live, None, None, None
        self._account = None
        if old is not None:
            old.close()
        live = RealDeviceControl(self.settings, device, controller, owns_device=False)
        if self._hook is not None:
            live.bind_hook(self._hook)
        self.live = live
        self._real = live
        self._loop = live.engine

    @property
    def hook(self) -> EvalHook | None:
        return self._hook

    @property
    def timeline(self) -> Timeline:
        """All events so far, decoded and segmented (derives what is pending)."""
        self.materialize()
        return self._timeline

    @property
    def _busy(self) -> bool:
        return self._in_flight > 0 or self._held > 0

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark a request as under way before it reaches ``generate`` (a server wraps
        each model request from its arrival to its last byte): deferred decoding and
        settling hold off meanwhile, so they never compete with its parsing,
        tokenisation or response for the GIL."""
        with self._held_lock:
            self._held += 1
        self._activity.set()
        try:
            yield
        finally:
            with self._held_lock:
                self._held -= 1
            self._last_end_ns = now_ns()
            self._activity.set()
            self._wake.set()

    # -- engine boundaries (hot path) -------------------------------------------
    def _push(self, item: Any, n_records: int = 0) -> None:
        with self._swap_lock:
            self._pending.append(item)
            self._pending_records += n_records
            full = self._pending_records > self._wake_records
        if full:
            self._wake.set()

    def emit(self, kind: EventKind, t_ns: int | None = None, **fields: Any) -> Event:
        """Record an event; the live loop gets the kinds it takes (``event_kinds``:
        its controller's, ``control.base``)."""
        event = Event(kind, now_ns() if t_ns is None else t_ns, **fields)
        self._push(event)
        loop = self._loop
        if loop is not None and kind in loop.event_kinds:
            loop.on_event(event)
        return event

    def _drain(self, graph: int | None = None) -> Any:
        """Queue the hook's pending records; at a graph's end (``graph``), as a repeat
        of the last graph's where the hook can (``NativeHook.drain_graph``)."""
        hook = self._hook
        if hook is None:
            return None
        drain_graph = self._drain_graph
        raw = hook.drain_raw() if graph is None or drain_graph is None else drain_graph(graph)
        if len(raw):
            self._push(raw, len(raw))
        return raw

    def on_decode_begin(self, n_tokens: int) -> None:
        if self._hook is None:
            return
        # Records produced outside eval (e.g. embeddings call llama_decode directly)
        # belong to no graph of ours; the timeline keeps but does not segment them.
        self._drain()
        self._graph = self._hook.begin_graph()
        if self._loop is not None:
            self._loop.on_decode_begin(self._graph)
        ev = self.emit(EventKind.DECODE_BEGIN, graph=self._graph, n_tokens=n_tokens)
        self._decode_begin = (ev.t_ns, n_tokens)

    def on_compute_begin(self) -> None:
        """Right before llama_decode, after the decode-begin event's work: the clock
        stand-in's start (tests only; nothing otherwise)."""
        if self._hook is not None and self._loop is not None:
            self._loop.compute_begin()

    def entering_decode(self) -> None:
        """Right before each ``llama_decode`` call (after llama-cpp-python's own
        ctypes calls that precede it): the planner runs while the engine is inside."""
        loop = self._loop
        if loop is not None:
            loop.entering_decode(self._decode_begin[1])

    def on_decode_end(self) -> None:
        if self._hook is None:
            return
        # the decode ended now, where the executor's end-of-graph switch lands (first,
        # after the clock stand-in's wait in tests): the drain below may wait for the
        # GIL (the planner holds it) for milliseconds, which belongs to the stall after
        # the graph, not to its kernels
        loop = self._loop
        t_end = now_ns() if loop is None else loop.graph_end()
        raw = self._drain(self._graph)
        ev = self.emit(EventKind.DECODE_END, t_end, graph=self._graph)
        if loop is not None:
            t_begin, n_tokens = self._decode_begin
            loop.on_decode_end(
                raw,
                graph=self._graph,
                n_tokens=n_tokens,
                t_begin_ns=t_begin,
                t_end_ns=ev.t_ns,
            )

    def on_request_begin(self, n_prompt: int) -> None:
        self._requests += 1
        self._in_flight += 1
        self._activity.set()
        self.emit(EventKind.REQUEST_BEGIN, n_tokens=n_prompt)

    def on_token(self, index: int) -> None:
        self._tokens += 1
        self.emit(EventKind.TOKEN, token=index)

    def on_request_end(self, n_generated: int) -> None:
        self._in_flight -= 1
        self._last_end_ns = now_ns()
        self._activity.set()
        self.emit(EventKind.REQUEST_END, n_tokens=n_generated)
        self.emit(EventKind.IDLE)
        if self._loop is not None:
            self._loop.engine_idle()
        self._wake.set()

    # -- the worker ----------------------------------------------------------------
    def _work(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            if self._busy and not self._pressed():
                continue  # a request is decoding; the end of the last one wakes us
            if not self._pressed() and not self._quiet():
                continue  # a request started meanwhile; its end wakes us
            try:
                self.materialize(yield_to_requests=True)
                self._settle()
            except SettleAborted:
                return  # closing
            except Exception:  # the worker must survive; the error is logged
                log.exception("turboinfer timeline worker failed on a batch")

    def _pressed(self) -> bool:
        """More decode or accounting backlog than the memory bound allows."""
        if self._pending_records > self._wake_records:
            return True
        account = self._account
        return account is not None and account.unsettled_segments > self._settle_backlog

    def _yield_settling(self) -> bool:
        return self._closed or (self._busy and not self._pressed())

    def _quiet(self) -> bool:
        """Wait until no request has run for ``SETTLE_QUIET_NS`` (a client's next
        request usually follows within a few ms, and deferred work must not sit
        between it and its first token). False if a request started meanwhile or the
        session closed; True at once when the backlog is over the bound."""
        return self._wait_quiet(through_requests=False)

    def _wait_quiet(self, *, through_requests: bool) -> bool:
        """Block (GIL released, woken only by request begin/end) until no request has
        run for ``SETTLE_QUIET_NS``. A running request ends the wait with False, unless
        ``through_requests``. True at once when the backlog is over the bound."""
        while not self._closed and not self._pressed():
            self._activity.clear()
            if self._busy:
                if not through_requests:
                    return False
                self._activity.wait(1.0)  # re-checks the bound now and then
                continue
            left_ns = self.SETTLE_QUIET_NS - (now_ns() - self._last_end_ns)
            if left_ns <= 0:
                return True
            self._activity.wait(min(left_ns / 1e9, 1.0))
        return not self._closed

    def _hold_settling(self) -> None:
        """Pause point inside a replay (before every simulated kernel): while a request
        runs, wait, GIL released, until the server is quiet again, so settling never
        competes with a request for the GIL (unless the backlog is over the bound).
        Closing a server session aborts; a library session finishes the request."""
        if self._closed:
            if self.SETTLE_ON_CLOSE:
                return
            raise SettleAborted
        if not self._busy:
            return
        if self._pressed():
            # Settling during requests (the memory bound): hand the GIL over every
            # millisecond, so requests and /v1/power never wait out switch intervals.
            t = now_ns()
            if t - self._last_yield_ns >= 1_000_000:
                time.sleep(0)
                self._last_yield_ns = t
            return
        self._wait_quiet(through_requests=True)
        if self._closed and not self.SETTLE_ON_CLOSE:
            raise SettleAborted

    def _settle(self) -> None:
        """Settle the simulated accounting off the request path, one request at a
        time, stopping as soon as a request starts (unless over the bound)."""
        account = self._account
        if account is None or account.unsettled_segments == 0 or self._yield_settling():
            return
        account.flush(stop=self._yield_settling, pause=self._hold_settling)
        self._timeline.mark_settled(account.settled_upto)
        self._tl_figures = self._timeline_figures()
        if account.unsettled_segments == 0:
            _trim_heap()

    # -- deferred derivation -----------------------------------------------------
    def materialize(self, *, yield_to_requests: bool = False) -> None:
        """Decode pending records into the timeline and hand segments to the sinks.

        ``yield_to_requests`` (the worker): stop as soon as a request starts decoding,
        unless the backlog is over ``WAKE_RECORDS``, and leave the rest pending."""
        with self._derive_lock:
            try:
                self._derive(yield_to_requests)
            finally:
                self._tl_figures = self._timeline_figures()

    def _derive(self, yield_to_requests: bool) -> None:
        with self._swap_lock:
            items, self._pending = self._pending, []
            backlog, self._pending_records = self._pending_records, 0
        tl = self._timeline
        account = self.live if isinstance(self.live, SimulatedAccount) else None
        for n, item in enumerate(items):
            if yield_to_requests and self._busy and backlog <= self._wake_records:
                self._requeue(items[n:])
                return
            if isinstance(item, Event):
                self._publish(tl.extend_lazy((item,)))
                if account is not None and item.kind is EventKind.REQUEST_END:
                    account.request_done()
                continue
            backlog -= len(item)
            decode_block = self._decode_block
            if decode_block is not None and isinstance(item, np.ndarray | GraphRecords):
                # one drain (a graph's records) as arrays: its segments come at its
                # DECODE_END, as arrays too
                tl.extend_block(decode_block(item))
                time.sleep(0)  # let the decode thread take the GIL
                continue
            for i in range(0, len(item), self.SLICE_RECORDS):
                self._publish(tl.extend_lazy(self._decode_raw(item[i : i + self.SLICE_RECORDS])))
                time.sleep(0)  # let the decode thread take the GIL between slices

    def _requeue(self, items: list[Any]) -> None:
        """Put undone items back in front of whatever arrived meanwhile."""
        n_records = sum(len(it) for it in items if not isinstance(it, Event))
        with self._swap_lock:
            self._pending = items + self._pending
            self._pending_records += n_records

    def _publish(self, derived: list[Derived]) -> None:
        if derived:
            for lazy in self._derived_sinks:
                lazy(derived)
            if self._sinks:
                segments = expand(derived)
                for sink in self._sinks:
                    sink(segments)

    # -- reporting -------------------------------------------------------------
    @property
    def request_count(self) -> int:
        """Requests (``generate`` calls) begun so far; the next one gets this index in
        the timeline's segments (``Segment.request``) and in settled records."""
        return self._requests

    def add_settled_sink(self, sink: Callable[[dict[str, Any]], None]) -> bool:
        """Call ``sink(record)`` with each request's simulated figures once settled
        (``record["request"]`` is its index). False when nothing is settled later
        (real device or observing only)."""
        if self._account is None:
            return False
        self._account.add_settled_sink(sink)
        return True

    def stats(self, settle: bool = True) -> dict[str, Any]:
        """Counts, stall totals by kind, and hook health for this model so far.

        ``settle=False`` reads only what the worker has already derived and settled:
        it never decodes, replays or waits for either (the server's ``/v1/power``)."""
        if settle:
            self.materialize()
            energy = self.energy()
            totals, window, overflow = self._timeline_figures()
        else:
            # no lock: the figures the last derivation or settle published, and the
            # settled energy (published likewise)
            energy = self.settled_energy()
            totals, window, overflow = self._tl_figures
        hook = self._hook
        accounting = energy.get("accounting") if energy else None
        if isinstance(accounting, dict):
            pending = len(self._pending)  # one read of a list's length (atomic)
            energy = {
                **energy,  # type: ignore[dict-item]
                "accounting": {
                    **accounting,
                    "pending_items": pending,
                    "settled": bool(accounting.get("settled")) and pending == 0,
                },
            }
        return {
            "requests": self._requests,
            "in_flight": self._in_flight,
            "tokens": self._tokens,
            "events": totals["events"],
            "events_dropped": window["events_dropped"],
            "timeline": window,
            "kernels": totals["kernels"],
            "stalls": totals["stalls"],
            "hook": {
                "granularity": self.settings.granularity,
                "native": bool(hook and hook.native),
                "overflow": overflow,
                "attached": hook is not None,
            },
            "device": energy.get("device") if energy else None,
            "offload": self.offload,
            "controller": self.settings.controller,
            "energy": energy,
        }

    def energy(self) -> dict[str, Any] | None:
        """Energy, frequency and controller health; None when observing only.
        With a simulated device every figure is simulated (``"simulated": true``)."""
        if self.live is None:
            return None
        self.materialize()
        out = self.live.summary()
        if self._account is not None:
            self._timeline.mark_settled(self._account.settled_upto)
            self._tl_figures = self._timeline_figures()
        return out

    def _timeline_figures(
        self,
    ) -> tuple[dict[str, Any], dict[str, int | bool | None], int]:
        """(totals, window, hook overflow) now; takes the timeline's and hook's locks."""
        hook = self._hook
        tl = self._timeline
        window = tl.window()
        account = self._account
        if account is not None:  # held by the accounting, not by the window
            window["unsettled_segments"] = account.unsettled_segments
        return tl.totals(), window, (hook.overflow if hook else 0)

    def settled_energy(self) -> dict[str, Any] | None:
        """``energy()`` as last settled by the worker, at once (no replay, no wait)."""
        if self.live is None:
            return None
        return self.live.summary(settle=False)

    def export_trace(self, path: str | os.PathLike[str]) -> str:
        """Write a Chrome/Perfetto JSON trace (open it in ui.perfetto.dev) of the
        retained window (``settings.timeline_max_events``/``timeline_window_s``)."""
        tl = self.timeline
        meta = {"source": "turboinfer-llama live run", "window": tl.window()}
        return str(write_chrome_trace(path, chrome_trace(tl.segments()), meta))

    def record(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> str:
        """Save the raw events of the retained window for deterministic replay
        (``turboinfer bench --replay``); ``meta["window"]`` says whether older events
        were dropped (``"complete": false``)."""
        meta = dict(meta or {})
        loop = self._loop if self._loop is not None else self._live_loop()
        if loop is not None and loop.plan_delay_ns:
            # when each graph's plan was set, live: replay models the same delays
            meta.setdefault("plan_delay_ns", {str(g): d for g, d in loop.plan_delay_ns.items()})
            meta.setdefault("log_cutoff_ns", {str(g): d for g, d in loop.log_cutoff_ns.items()})
            meta.setdefault("graph_input_ns", {str(g): d for g, d in loop.graph_input_ns.items()})
            meta.setdefault("plans_dropped", sorted(loop.plans_dropped))
        tl = self.timeline
        return str(save_trace(path, tl.events(), {**meta, "window": tl.window()}))

    def _live_loop(self) -> Governor | None:
        """The live loop of ``live`` (also after ``detach``)."""
        return self.live.engine if self.live is not None else None

    # -- teardown --------------------------------------------------------------
    def _release_now(self) -> None:
        hook, self._hook = self._hook, None
        self._drain_graph = None
        if hook is not None:
            hook.disable()
            hook.close()

    def detach(self) -> None:
        """Make the callback inert. Runs before llama.cpp frees the context."""
        if self._hook is not None:
            self._hook.disable()
        self._real = None
        self._loop = None

    def close(self) -> None:
        """Free the hook's ring. Only after the context is gone. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._real = None
        self._loop = None
        self._wake.set()
        self._activity.set()
        if sys.is_finalizing():  # the worker is frozen and may hold our locks
            self._release_now()
            return
        if self._worker is not threading.current_thread():
            self._worker.join()
        try:
            if self.SETTLE_ON_CLOSE:
                if self._hook is not None:
                    self._drain()
                self.materialize()  # decode what is pending while the decoder exists
            if self._account is not None:
                # final figures (settled now, or as settled so far), then the simulators
                self._account.close(settle=self.SETTLE_ON_CLOSE)
            elif self.live is not None:
                self.live.close()  # the device's governor, min, max
        finally:
            hook, self._hook = self._hook, None
            self._decode_raw = _no_decoder
            self._drain_graph = None  # a bound method: it would keep the hook alive
            if self._decode_block is not None:
                self._decode_block = _no_decoder
            if hook is not None:
                hook.disable()
                hook.close()
