"""`turboinfer trace`: inspect a recorded engine trace or convert it for Perfetto."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import CliError


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="inspect or export a recorded trace (bench --record)")
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    e = tsub.add_parser("export", help="write a Chrome/Perfetto JSON trace (ui.perfetto.dev)")
    e.add_argument("recording", help="a trace written by `turboinfer bench --record`")
    e.add_argument("output", help="Perfetto JSON to write")
    e.set_defaults(func=export)
    s = tsub.add_parser("stats", help="print kernel and stall totals by kind as JSON")
    s.add_argument("recording")
    s.set_defaults(func=stats)


def _load(path: str) -> Any:
    from ..engine.timeline import Timeline
    from ..trace.record import TraceFormatError, load_trace

    try:
        events, meta = load_trace(path)
    except FileNotFoundError:
        raise CliError(f"trace not found: {path}") from None
    except TraceFormatError as e:
        raise CliError(str(e)) from e
    return Timeline.from_events(events), meta


def export(args: argparse.Namespace) -> int:
    from ..trace.perfetto import chrome_trace, write_chrome_trace

    tl, meta = _load(args.recording)
    try:
        write_chrome_trace(args.output, chrome_trace(tl.segments()), meta)
    except OSError as e:
        raise CliError(f"cannot write {args.output}: {e.strerror or e}") from e
    return 0


def stats(args: argparse.Namespace) -> int:
    tl, meta = _load(args.recording)
    print(
        json.dumps(
            {
                "meta": meta,
                "events": dict(tl.counts),
                "kernels": {"count": tl.kernel_count, "total_ms": tl.kernel_ns / 1e6},
                "stalls": tl.stall_totals(),
            },
            indent=2,
        )
    )
    return 0
