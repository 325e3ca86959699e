"""Chrome/Perfetto JSON export (``traceEvents``), viewable at ui.perfetto.dev.

Kernels are slices on one track per layer, stalls are slices on a track per stall
kind, and optional counter series (frequency, power) become counter tracks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engine.segments import Segment

_PID = 1
_STALL_TID_BASE = 1000


def chrome_trace(
    segments: Iterable[Segment],
    counters: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    *,
    pid: int = _PID,
    process_name: str = "llama.cpp",
) -> list[dict[str, Any]]:
    """Trace events; ``counters`` maps a name to ``(t_ns, value)`` samples."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process_name}}
    ]
    named: set[int] = set()
    stall_tids: dict[str, int] = {}
    for seg in segments:
        if seg.kind == "kernel":
            tid = seg.layer + 1 if seg.layer >= 0 else 0
            label = f"layer {seg.layer}" if seg.layer >= 0 else "graph (no layer)"
            name = seg.op or "kernel"
            args: dict[str, Any] = {"node": seg.node, "name": seg.name, "phase": seg.phase}
        else:
            kind = seg.stall.value if seg.stall else "stall"
            tid = stall_tids.setdefault(kind, _STALL_TID_BASE + len(stall_tids))
            label = f"stall: {kind}"
            name = kind
            args = {"phase": seg.phase, "token": seg.token}
        if tid not in named:
            named.add(tid)
            out.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}}
            )
        out.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "name": name,
                "ts": seg.t_ns / 1e3,
                "dur": seg.dur_ns / 1e3,
                "args": args,
            }
        )
    for cname, samples in (counters or {}).items():
        for t_ns, value in samples:
            out.append(
                {"ph": "C", "pid": pid, "name": cname, "ts": t_ns / 1e3, "args": {cname: value}}
            )
    return out


def write_chrome_trace(
    path: str | os.PathLike[str],
    trace_events: list[dict[str, Any]],
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    p = Path(path)
    doc = {"traceEvents": trace_events, "displayTimeUnit": "ms", "metadata": dict(metadata or {})}
    p.write_text(json.dumps(doc))
    return p
