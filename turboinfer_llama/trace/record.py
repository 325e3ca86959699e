"""Trace files: the recorded engine events of a run, for deterministic replay.

Format: JSON ``{"version": 1, "meta": {...}, "events": [Event.to_json(), ...]}``,
gzip-compressed where the path ends in ``.gz`` (a recording of four gemma-3-270m
requests is 72 MB of JSON, 3.8 MB gzipped). A gzipped trace is read whatever its name.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..engine.events import Event, EventKind, NodeShape

TRACE_VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"


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
    data = json.dumps(doc, separators=(",", ":")).encode()
    if p.suffix == ".gz":
        # mtime 0: the same events give the same bytes
        data = gzip.compress(data, compresslevel=9, mtime=0)
    p.write_bytes(data)
    return p


def _loads(data: bytes) -> Any:
    """JSON text to Python: orjson when installed (about 4x faster on a recording of
    hundreds of thousands of node events), else the standard library."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a dependency; json still works
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise json.JSONDecodeError(str(e), "", 0) from e


def load_trace(path: str | os.PathLike[str]) -> tuple[list[Event], dict[str, Any]]:
    p = Path(path)
    # millions of small objects, none in a cycle: the cyclic collector would rescan
    # them all again and again while they are built (half the load time)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(p)
    finally:
        if was_enabled:
            gc.enable()


def _load(p: Path) -> tuple[list[Event], dict[str, Any]]:
    try:
        data = p.read_bytes()
        if data[:2] == _GZIP_MAGIC:
            data = gzip.decompress(data)
        doc = _loads(data)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, ValueError) as e:  # gzip: BadGzipFile, or cut short
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
    built once and shared (``NodeShape`` is frozen). A node's DONE record and the same
    node of the next graph mostly repeat its last shape: that is one comparison of the
    raw dicts (equal dicts make equal keys, so the same shared shape)."""
    kinds = {k.value: k for k in EventKind}
    shapes: dict[tuple[Any, ...], NodeShape] = {}
    last: dict[Any, tuple[dict[str, Any], NodeShape]] = {}  # by node: its last shape
    out: list[Event] = []
    append = out.append
    for d in raw:
        sh = d.get("shape")
        shape = None
        if sh is not None:
            node = d.get("node", -1)
            hit = last.get(node)
            if hit is not None and hit[0] == sh and type(sh) is dict:
                shape = hit[1]
            else:
                ne, s0, s1 = sh.get("ne"), sh.get("src0_ne"), sh.get("src1_ne")
                key = (
                    len(sh),
                    tuple(ne) if ne is not None else None,
                    sh.get("type"),
                    tuple(s0) if s0 is not None else None,
                    sh.get("src0_type"),
                    tuple(s1) if s1 is not None else None,
                    sh.get("src1_type"),
                    sh.get("nbytes"),
                )
                shape = shapes.get(key)
                if shape is None:
                    shape = shapes[key] = Event.from_json(  # type: ignore[assignment]
                        {"kind": d["kind"], "t_ns": 0, "shape": sh}
                    ).shape
                if type(sh) is dict:
                    last[node] = (sh, shape)  # type: ignore[assignment]
        if not d.keys() <= _KNOWN:
            extra = dict(d)  # a key Event does not know: let Event refuse it
            extra["kind"] = kinds[d["kind"]]
            extra["shape"] = shape
            append(Event(**extra))
            continue
        get = d.get
        append(
            Event(
                kinds[d["kind"]],
                d["t_ns"],
                get("graph", -1),
                get("node", -1),
                get("op", ""),
                get("name", ""),
                get("layer", -1),
                get("token", -1),
                get("n_tokens", 0),
                shape,
                get("detail", ""),
            )
        )
    return out


_KNOWN = frozenset(
    ("kind", "t_ns", "graph", "node", "op", "name", "layer", "token", "n_tokens", "shape", "detail")
)
