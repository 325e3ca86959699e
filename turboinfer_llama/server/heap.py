"""Keep Python's cyclic garbage collector from stopping the server for long.

Measured (issue 14, gemma-3-270m, 16 concurrent streams): a full (generation-2)
collection walks every GC-tracked object while holding the GIL; the server holds the
startup heap (~110k objects: modules, functions, pydantic and FastAPI models) plus the
session's accounting backlog (timeline segments waiting to be settled, up to a few
hundred thousand objects while requests run). Full collections came every ~1.5 s under
load and took 20-300 ms each, stopping the event loop, the engine thread and every
``/v1/power`` answer with them; they collected almost nothing (under 200 objects in
30 s: the backlog is freed by reference counting, not by the cycle collector).

``HeapFreezer`` moves what has survived into the collector's permanent generation
(``gc.freeze()``, O(1)) every ``interval_s``, so a full collection only walks what was
allocated since (at most ``interval_s`` of survivors). Frozen objects are still freed
by reference counting as usual; only garbage *cycles* among them wait: when the
server is quiet (no model request in flight, accounting settled) and the frozen heap
has grown by ``reclaim_objects`` since the last reclaim, the freezer unfreezes, runs
one full collection and freezes again (a pause at a quiet moment, bounded by the heap
at that moment, which is then the startup heap plus the retained timeline window).
Closing unfreezes everything.

The server's default (``interval_s=None``) freezes the startup heap only, once. The
periodic freezing was measured to cost memory: garbage cycles made while requests run
(llama-cpp-python's and the HTTP stack's, some holding large buffers) were frozen with
the survivors and waited for a quiet moment that a sustained load never gives; RSS grew
by ~40 MiB per 1,000 generated tokens (issue 14: 1,102 MiB against upstream's 613 after
10,000 tokens). With the accounting backlog held as arrays (``engine.segment_store``)
instead of objects, what a full collection walks besides the startup heap is the
timeline window and the requests' own objects, a few tens of thousands.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class HeapFreezer:
    RECLAIM_OBJECTS = 50_000  # frozen growth that asks for a reclaim once quiet
    RECLAIM_EVERY_S = 60.0  # ... at most this often

    def __init__(
        self,
        quiet: Callable[[], bool],
        interval_s: float | None = 1.0,
        *,
        reclaim_objects: int | None = None,
    ) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError(f"interval_s must be positive or None, not {interval_s}")
        self.quiet = quiet
        self.interval_s = interval_s
        self.reclaim_objects = self.RECLAIM_OBJECTS if reclaim_objects is None else reclaim_objects
        self.freezes = 0
        self.reclaims = 0
        self.reclaimed = 0  # objects the reclaims' full collections freed
        self._baseline = 0
        self._last_reclaim = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HeapFreezer:
        """Collect once (the startup heap's garbage), freeze, and keep freezing every
        ``interval_s`` (None: only this once)."""
        gc.collect()
        gc.freeze()
        self._baseline = gc.get_freeze_count()
        if self.interval_s is not None:
            self._thread = threading.Thread(target=self._run, name="turboinfer-heap", daemon=True)
            self._thread.start()
        log.debug("heap frozen: %d objects out of the collector's scans", self._baseline)
        return self

    def _run(self) -> None:
        assert self.interval_s is not None
        while not self._stop.wait(self.interval_s):
            self.step()

    def step(self) -> None:
        """One tick: freeze the survivors; reclaim frozen cycles if due and quiet."""
        gc.freeze()
        self.freezes += 1
        grown = gc.get_freeze_count() - self._baseline
        due = time.monotonic() - self._last_reclaim >= self.RECLAIM_EVERY_S
        if grown > self.reclaim_objects and due and self.quiet():
            self.reclaim()

    def reclaim(self) -> int:
        """Unfreeze, collect everything, freeze again; the objects collected."""
        gc.unfreeze()
        n = gc.collect()
        gc.freeze()
        self._baseline = gc.get_freeze_count()
        self._last_reclaim = time.monotonic()
        self.reclaims += 1
        self.reclaimed += n
        log.debug("heap reclaim: %d objects collected, %d frozen", n, self._baseline)
        return n

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        gc.unfreeze()
