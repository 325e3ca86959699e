"""PowerSession: the plugin's per-model state, exposed as ``llm.power``.

It owns the eval hook's Python side, the timeline, and (once wired) the device and
controller. Engine-side code calls the small ``on_*`` methods at event boundaries;
they must stay cheap, they run on the decode path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ._clock import now_ns
from .engine.events import Event, EventKind
from .engine.hooks import EvalHook
from .engine.segments import Segment
from .engine.timeline import Timeline
from .settings import PowerSettings
from .trace.perfetto import chrome_trace, write_chrome_trace
from .trace.record import save_trace

log = logging.getLogger("turboinfer_llama")

SegmentSink = Callable[[list[Segment]], None]


class PowerSession:
    def __init__(self, settings: PowerSettings, hook: EvalHook) -> None:
        self.settings = settings
        self.timeline = Timeline()
        self._hook: EvalHook | None = hook
        self._graph = -1
        self._requests = 0
        self._tokens = 0
        self._sinks: list[SegmentSink] = []
        self._closed = False

    # -- wiring ----------------------------------------------------------------
    def add_segment_sink(self, sink: SegmentSink) -> None:
        """Call ``sink(segments)`` with every batch of newly derived segments."""
        self._sinks.append(sink)

    @property
    def hook(self) -> EvalHook | None:
        return self._hook

    # -- engine boundaries (hot path) -------------------------------------------
    def emit(self, kind: EventKind, **fields: Any) -> None:
        self._publish(self.timeline.append(Event(kind, now_ns(), **fields)))

    def on_decode_begin(self, n_tokens: int) -> None:
        hook = self._hook
        if hook is None:
            return
        # Records produced outside eval (e.g. embeddings call llama_decode directly)
        # belong to no graph of ours; the timeline keeps but does not segment them.
        stray = hook.drain()
        if stray:
            self.timeline.extend(stray)
        self._graph = hook.begin_graph()
        self.emit(EventKind.DECODE_BEGIN, graph=self._graph, n_tokens=n_tokens)

    def on_decode_end(self) -> None:
        hook = self._hook
        if hook is None:
            return
        self._publish(self.timeline.extend(hook.drain()))
        self.emit(EventKind.DECODE_END, graph=self._graph)

    def on_request_begin(self, n_prompt: int) -> None:
        self._requests += 1
        self.emit(EventKind.REQUEST_BEGIN, n_tokens=n_prompt)

    def on_token(self, index: int) -> None:
        self._tokens += 1
        self.emit(EventKind.TOKEN, token=index)

    def on_request_end(self, n_generated: int) -> None:
        self.emit(EventKind.REQUEST_END, n_tokens=n_generated)
        self.emit(EventKind.IDLE)

    def _publish(self, segments: list[Segment]) -> None:
        if segments:
            for sink in self._sinks:
                sink(segments)

    # -- reporting -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counts, stall totals by kind, and hook health for this model so far."""
        tl = self.timeline
        hook = self._hook
        return {
            "requests": self._requests,
            "tokens": self._tokens,
            "events": dict(tl.counts),
            "events_dropped": tl.dropped,
            "kernels": {"count": tl.kernel_count, "total_ms": tl.kernel_ns / 1e6},
            "stalls": tl.stall_totals(),
            "hook": {
                "granularity": self.settings.granularity,
                "native": bool(hook and hook.native),
                "overflow": hook.overflow if hook else 0,
                "attached": hook is not None,
            },
        }

    def export_trace(self, path: str | os.PathLike[str]) -> str:
        """Write a Chrome/Perfetto JSON trace (open it in ui.perfetto.dev)."""
        events = chrome_trace(self.timeline.segments())
        return str(write_chrome_trace(path, events, {"source": "turboinfer-llama live run"}))

    def record(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> str:
        """Save the raw events for deterministic replay (``turboinfer bench --replay``)."""
        return str(save_trace(path, self.timeline.events(), meta))

    # -- teardown --------------------------------------------------------------
    def detach(self) -> None:
        """Make the callback inert. Runs before llama.cpp frees the context."""
        if self._hook is not None:
            self._hook.disable()

    def close(self) -> None:
        """Free the hook's ring. Only after the context is gone. Idempotent."""
        if self._closed:
            return
        self._closed = True
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.disable()
            hook.close()
