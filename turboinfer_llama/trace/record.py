"""Trace files: the recorded engine events of a run, for deterministic replay.

Format: JSON ``{"version": 1, "meta": {...}, "events": [Event.to_json(), ...]}``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..engine.events import Event, EventKind, NodeShape

TRACE_VERSION = 1


class TraceFormatError(ValueError):
    """The file is not a turboinfer trace we can read."""


def save_trace(
    path: str | os.PathLike[str], events: Iterable[Event], meta: dict[str, Any] | None = None
) -> Path:
    p = Path(path)
    doc = {
        "version": TRACE_VERSION,
        "meta": meta or {},
        "events": [e.to_json() for e in events],
    }
    p.write_text(json.dumps(doc, separators=(",", ":")))
    return p


def load_trace(path: str | os.PathLike[str]) -> tuple[list[Event], dict[str, Any]]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise
    except (OSError, json.JSONDecodeError) as e:
        raise TraceFormatError(f"{p}: not a readable JSON trace ({e})") from e
    if not isinstance(doc, dict) or doc.get("version") != TRACE_VERSION:
        raise TraceFormatError(f"{p}: not a turboinfer trace (expected version {TRACE_VERSION})")
    try:
        events = _events(doc["events"])
    except (KeyError, TypeError, ValueError) as e:
        raise TraceFormatError(f"{p}: malformed event ({e})") from e
    return events, dict(doc.get("meta", {}))


def _events(raw: list[dict[str, Any]]) -> list[Event]:
    """``Event.from_json`` over a whole trace, faster: a recording repeats a few hundred
    node shapes over hundreds of thousands of node events, so each distinct shape is
    built once and shared (``NodeShape`` is frozen)."""
    kinds = {k.value: k for k in EventKind}
    shapes: dict[tuple[Any, ...], NodeShape] = {}
    out: list[Event] = []
    append = out.append
    for d in raw:
        sh = d.get("shape")
        if sh is None:
            d = dict(d)
            d["kind"] = kinds[d["kind"]]
            append(Event(**d))
            continue
        key = (
            len(sh),
            tuple(sh["ne"]) if sh.get("ne") is not None else None,
            sh.get("type"),
            tuple(sh["src0_ne"]) if sh.get("src0_ne") is not None else None,
            sh.get("src0_type"),
            tuple(sh["src1_ne"]) if sh.get("src1_ne") is not None else None,
            sh.get("src1_type"),
            sh.get("nbytes"),
        )
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = Event.from_json({"kind": d["kind"], "t_ns": 0, "shape": sh}).shape  # type: ignore[assignment]
        d = dict(d)
        d["kind"] = kinds[d["kind"]]
        d["shape"] = shape
        append(Event(**d))
    return out
