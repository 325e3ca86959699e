"""Trace files: the recorded engine events of a run, for deterministic replay.

Format: JSON ``{"version": 1, "meta": {...}, "events": [Event.to_json(), ...]}``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..engine.events import Event

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
        events = [Event.from_json(d) for d in doc["events"]]
    except (KeyError, TypeError, ValueError) as e:
        raise TraceFormatError(f"{p}: malformed event ({e})") from e
    return events, dict(doc.get("meta", {}))
