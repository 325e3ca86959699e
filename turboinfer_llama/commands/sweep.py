"""`turboinfer sweep`: one recording across the simulator's uncertain parameters."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import CliError, check_writable, require_matplotlib


def register(sub: Any) -> None:
    from ..bench.sweep import DEFAULT_PROFILES, DEFAULT_SLACKS
    from ..settings import GRANULARITIES

    p = sub.add_parser(
        "sweep",
        help="replay one recording across a grid of simulator parameters (all simulated)",
        description="Replay a `turboinfer bench --record` trace through every controller "
        "across switch latency, GPU-DDR coupling, host CPU speed, compute efficiency, "
        "idle power, background DRAM load (steady and changing mid-run), per profile and "
        "latency slack. Every figure is simulated.",
    )
    p.add_argument("--replay", required=True, help="recorded trace (turboinfer bench --record)")
    p.add_argument("--json", dest="json_path", required=True, help="write the points here")
    p.add_argument(
        "--profiles",
        default=",".join(DEFAULT_PROFILES),
        help=f"comma-separated simulator profiles (default {','.join(DEFAULT_PROFILES)})",
    )
    p.add_argument(
        "--slacks",
        default=",".join(f"{s:g}" for s in DEFAULT_SLACKS),
        help="comma-separated latency slacks, fractions (default 0,0.02,0.05,0.1)",
    )
    p.add_argument("--lhs", type=int, default=2, help="Latin hypercube points per profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default=None,
        help="the loop granularity the causal controllers are replayed at (default: graph, "
        "the live default)",
    )
    p.add_argument("--plot", dest="plot_path", help="write a Pareto plot (needs matplotlib)")
    p.set_defaults(func=run)


def _floats(raw: str, flag: str) -> list[float]:
    try:
        out = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{flag}: expected comma-separated numbers, got {raw!r}") from None
    if not out or any(not 0 <= x <= 1 for x in out):
        raise CliError(f"{flag}: each slack must be within 0..1, got {raw!r}")
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.sweep import SweepError, run_sweep, table, write_plot
    from ..devices.sim import list_profiles, load_profile

    rec = Path(args.replay)
    if not rec.is_file():
        raise CliError(f"--replay {rec}: no such file")
    profiles = [x.strip() for x in args.profiles.split(",") if x.strip()]
    for name in profiles:
        try:
            load_profile(name)
        except Exception as e:
            raise CliError(f"--profiles: {e} (shipped: {', '.join(list_profiles())})") from None
    slacks = _floats(args.slacks, "--slacks")
    if args.lhs < 0 or (args.workers is not None and args.workers < 1):
        raise CliError("--lhs must be >= 0 and --workers >= 1")
    for path, flag in ((args.json_path, "--json"), (args.plot_path, "--plot")):
        check_writable(path, flag)
    require_matplotlib(args.plot_path)
    try:
        from ..trace.record import TraceFormatError, load_trace

        load_trace(rec)  # fail fast, before the pool starts
    except (TraceFormatError, ValueError, OSError) as e:
        raise CliError(f"--replay {rec}: {e}") from e
    with Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        out = Path(args.json_path)

        def save(partial_doc: dict[str, Any]) -> None:
            tmp = out.with_name(out.name + ".partial")
            tmp.write_text(json.dumps(partial_doc, indent=2) + "\n")
            tmp.replace(out)

        try:
            doc = run_sweep(
                str(rec),
                profiles=profiles,
                slacks=slacks,
                lhs=args.lhs,
                seed=args.seed,
                workers=args.workers,
                progress=progress,
                partial=save,
                granularity=args.granularity,
            )
        except SweepError as e:
            raise CliError(str(e)) from e
    Path(args.json_path).write_text(json.dumps(doc, indent=2) + "\n")
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 220)
    console.print(table(doc))
    if args.plot_path:
        write_plot(args.plot_path, doc)
    print(
        f"turboinfer sweep: {len(doc['points'])} points written to {args.json_path}",
        file=sys.stderr,
    )
    return 0
