"""`turboinfer bench`: power saving on vs off and against every baseline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import CliError, check_writable, require_matplotlib


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark controllers on a recorded run (simulated GPU by default)",
        description="Record real llama.cpp runs, replay them through each controller on "
        "the device model, and A/B the live plugin on vs off.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..bench.runner import ALL_CONTROLLERS, DEFAULT_CONTROLLERS
    from ..control.factory import CONTROLLER_NAMES
    from ..settings import GRANULARITIES

    p.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    p.add_argument("--prompts", help="prompts file: JSON list or one per line")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    p.add_argument("--n-ctx", type=int, default=2048, help="context size (default 2048)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: auto)")
    p.add_argument("--device", default="sim:adreno650", help="device spec (default sim:adreno650)")
    p.add_argument(
        "--controllers",
        default=",".join(DEFAULT_CONTROLLERS),
        help=f"comma-separated, of {', '.join(CONTROLLER_NAMES)} "
        f"(default {','.join(DEFAULT_CONTROLLERS)})",
    )
    p.add_argument(
        "--meter",
        help="energy meter for a real device: battery[:supply], rapl[:zone], nvml[:index], "
        "monsoon[:serial] (a simulated device is metered by the simulator)",
    )
    p.add_argument(
        "--n-gpu-layers",
        type=int,
        default=None,
        help="layers to offload to the GPU on a real local device (default: all, -1)",
    )
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        default=None,
        help="on a real local GPU, run even if the model stays on the CPU (a warning, "
        "not an error; env TURBOINFER_ALLOW_CPU)",
    )
    p.add_argument("--all", action="store_true", help=f"run {','.join(ALL_CONTROLLERS)}")
    p.add_argument("--latency-slack", type=float, default=0.02, help="fraction (default 0.02)")
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default=None,
        help="the controllers' loop granularity (default: graph, the live default, where no "
        "node is observed during compute; layer and kernel force a GPU sync per observed "
        "node on a real device: docs/gpu-backends.md). On the simulator the recording is "
        "made at kernel granularity and the controllers are replayed at this one",
    )
    p.add_argument("--live-rounds", type=int, default=3, help="live on/off A/B rounds (0: skip)")
    p.add_argument(
        "--no-timing",
        action="store_true",
        help="omit wall-clock decision times so the JSON is byte-reproducible",
    )
    p.add_argument("--json", dest="json_path", help="write the report as JSON")
    p.add_argument("--csv", dest="csv_path", help="write the table as CSV")
    p.add_argument("--plot", dest="plot_path", help="write a PNG figure (needs the plot extra)")
    p.add_argument("--trace", dest="trace_path", help="write a Perfetto/Chrome JSON trace")
    p.add_argument("--record", help="save the recorded engine trace here")
    p.add_argument("--replay", help="replay a recorded trace instead of running the model")
    p.add_argument("--debug", action="store_true", help="tracebacks on errors")


def _positive(value: int, flag: str) -> None:
    if value <= 0:
        raise CliError(f"{flag} must be positive, got {value}")


def run(args: argparse.Namespace) -> int:
    from ..bench.prompts import PromptsError, load_prompts
    from ..bench.runner import ALL_CONTROLLERS, LIVE_GRANULARITY, BenchConfig

    for v, f in (
        (args.max_tokens, "--max-tokens"),
        (args.n_ctx, "--n-ctx"),
        (args.repeats, "--repeats"),
    ):
        _positive(v, f)
    if not 0 <= args.latency_slack <= 1:
        raise CliError(f"--latency-slack must be within 0..1, got {args.latency_slack}")
    for path, flag in (
        (args.json_path, "--json"),
        (args.csv_path, "--csv"),
        (args.plot_path, "--plot"),
        (args.trace_path, "--trace"),
        (args.record, "--record"),
    ):
        check_writable(path, flag)
    require_matplotlib(args.plot_path)
    try:
        prompts = load_prompts(args.prompts)
    except PromptsError as e:
        raise CliError(str(e)) from e
    controllers = (
        list(ALL_CONTROLLERS)
        if args.all
        else [c.strip() for c in args.controllers.split(",") if c.strip()]
    )
    if "default" not in controllers:
        controllers.insert(0, "default")  # every figure is relative to it
    cfg = BenchConfig(
        model=args.model,
        prompts=prompts,
        max_tokens=args.max_tokens,
        n_ctx=args.n_ctx,
        threads=args.threads,
        device=args.device,
        controllers=controllers,
        latency_slack=args.latency_slack,
        repeats=args.repeats,
        seed=args.seed,
        granularity=args.granularity or LIVE_GRANULARITY,
        live_rounds=args.live_rounds,
        record=args.record,
        replay=args.replay,
        timing=not args.no_timing,
        n_gpu_layers=args.n_gpu_layers,
        allow_cpu=args.allow_cpu,
        intervals=bool(args.plot_path or args.trace_path),
    )
    device, meter = _open_hardware(args.device, args.meter)
    try:
        return _run(args, cfg, device, meter)
    finally:
        if meter is not None and hasattr(meter, "close"):
            meter.close()
        if device is not None:
            device.close()  # restores governor, min and max


def _open_hardware(spec: str, meter_spec: str | None) -> tuple[Any, Any]:
    """(device, meter) for a real device; (None, None) for the simulator."""
    from ..devices import open_device
    from ..devices.base import DeviceError
    from ..power import open_meter

    if spec.startswith("sim") and meter_spec in (None, "sim"):
        return None, None
    try:
        device = open_device(spec)
    except (DeviceError, ValueError) as e:
        raise CliError(f"device {spec!r}: {e}") from e
    if device.capabilities.simulated:
        device.close()
        if meter_spec not in (None, "sim"):
            raise CliError("a simulated device is metered by the simulator; drop --meter")
        return None, None
    if not meter_spec:
        device.close()
        raise CliError(f"device {spec!r} is real hardware: name an energy meter with --meter")
    try:
        meter = open_meter(meter_spec, device=device)
    except (DeviceError, ValueError) as e:
        device.close()
        raise CliError(f"meter {meter_spec!r}: {e}") from e
    return device, meter


def _run(args: argparse.Namespace, cfg: Any, device: Any, meter: Any) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..bench.default_phases import spread_line
    from ..bench.report import accounting_line, live_line, table, write_csv, write_trace
    from ..bench.runner import BenchError, preflight, run_bench

    try:
        preflight(cfg, device=device)
    except BenchError as e:
        raise CliError(str(e)) from e
    console = Console(stderr=False)
    if not console.is_terminal:
        console.width = max(console.width, 190)  # keep the table whole in files and CI logs
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        try:
            outcome = run_bench(cfg, progress, device=device, meter=meter)
        except BenchError as e:
            raise CliError(str(e)) from e
    report = outcome.report
    if report["controllers"]:
        console.print(table(report))
    for line in (live_line(report), accounting_line(report), spread_line(report)):
        if line:
            console.print(line)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if args.csv_path and report["controllers"]:
        write_csv(args.csv_path, report)
    if args.plot_path and report["controllers"]:
        from ..bench.plot import write_plot

        write_plot(args.plot_path, report, outcome.intervals)
    if args.trace_path and outcome.segments:
        write_trace(args.trace_path, outcome.segments, outcome.intervals, report)
    if outcome.interrupted:
        print("turboinfer bench: interrupted; partial results written", file=sys.stderr)
        return 130
    return 0
