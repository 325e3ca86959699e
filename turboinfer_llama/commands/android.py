"""``turboinfer android probe|deploy|calibrate|install|bench|restore|push-run``: a phone on USB,
driven from the host over adb (adb server from TURBOINFER_ADB_SERVER or adb's own
ANDROID_ADB_SERVER_PORT)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import CliError

PUSH_RUN_REMOTE = "/sdcard/Download/turboinfer-termux.sh"


def _examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "android"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "android", help="probe, deploy to and benchmark an Android phone over adb"
    )
    sub = p.add_subparsers(dest="android_command", metavar="ACTION", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--serial", help="phone serial (see `adb devices`); default: the only phone"
        )

    sp = sub.add_parser("probe", help="what the phone's GPU, kernel and battery expose")
    common(sp)
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.add_argument(
        "--no-calibrate",
        action="store_true",
        help="do not run the short idle-vs-load battery calibration",
    )
    sp.set_defaults(func=_probe)

    sp = sub.add_parser("deploy", help="push turboinfer.ko and insmod it with target=<GPU devfreq>")
    common(sp)
    sp.add_argument("module", type=Path, help="turboinfer.ko built for the phone's kernel")
    sp.add_argument("--target", help="devfreq device to attach to (default: the phone's GPU)")
    sp.set_defaults(func=_deploy)

    sp = sub.add_parser("calibrate", help="decide the fuel gauge's current sign and unit")
    common(sp)
    sp.add_argument("--seconds", type=float, default=2.0, help="length of each phase (idle, load)")
    sp.add_argument("--force-charging", action="store_true", help="calibrate even while charging")
    sp.set_defaults(func=_calibrate)

    sp = sub.add_parser(
        "bench", help="benchmark with the phone's GPU and battery (runner required)"
    )
    common(sp)
    sp.add_argument("--model", help="GGUF model path, passed to the runner")
    sp.add_argument("--controller", help="controller spec, passed to the runner")
    sp.add_argument(
        "--n-ctx", type=int, help="context size, passed to the runner (default: bench's)"
    )
    sp.add_argument(
        "--max-tokens", type=int, help="tokens per prompt, passed to the runner (default: bench's)"
    )
    sp.add_argument(
        "--force-charging",
        action="store_true",
        help="report energy even while the phone charges (numbers are then wrong)",
    )
    sp.set_defaults(func=_bench)

    sp = sub.add_parser(
        "install",
        help="build our sdist here, push it, and install it in Termux with a GPU build "
        "of llama-cpp-python (never from a package index)",
    )
    common(sp)
    sp.add_argument(
        "--dist",
        type=Path,
        help="a turboinfer-llama wheel or sdist to push (default: an sdist of this checkout)",
    )
    gpu = sp.add_mutually_exclusive_group()
    gpu.add_argument(
        "--vulkan",
        dest="gpu_backend",
        action="store_const",
        const="vulkan",
        help="llama.cpp's Vulkan backend (default; Adreno 6xx via Turnip, Mali)",
    )
    gpu.add_argument(
        "--opencl",
        dest="gpu_backend",
        action="store_const",
        const="opencl",
        help="llama.cpp's OpenCL backend (Adreno 7xx and newer)",
    )
    sp.add_argument(
        "--push-only",
        action="store_true",
        help="push the files and print the Termux command instead of running it",
    )
    sp.set_defaults(func=_install, gpu_backend="vulkan")

    sp = sub.add_parser("restore", help="put back GPU settings left pinned by a lost connection")
    common(sp)
    sp.set_defaults(func=_restore)

    sp = sub.add_parser("push-run", help="run turboinfer on the phone itself (Termux): how-to")
    common(sp)
    sp.add_argument(
        "--push", action="store_true", help=f"copy the Termux helper script to {PUSH_RUN_REMOTE}"
    )
    sp.set_defaults(func=_push_run)


def _settings() -> Any:
    from ..devices.adb_settings import AdbSettings

    try:
        return AdbSettings()
    except ValueError as e:
        raise CliError(str(e)) from e


def _probe(args: argparse.Namespace) -> int:
    from ..android.probe import format_probe, probe
    from ..devices.base import DeviceError

    try:
        info = probe(args.serial, settings=_settings(), calibrate=not args.no_calibrate)
    except DeviceError as e:
        raise CliError(str(e)) from e
    print(json.dumps(info, indent=2) if args.json else format_probe(info))
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from ..android.deploy import deploy
    from ..devices.adb_link import AdbLink
    from ..devices.base import DeviceError

    try:
        report = deploy(AdbLink(args.serial, _settings()), args.module, args.target)
    except DeviceError as e:
        raise CliError(str(e)) from e
    for step in report.steps:
        print(f"  {step}")
    print(
        f"turboinfer loaded on {report.serial}, attached to {report.target}; "
        f"use --device kmod on the phone (Termux) or adb:{report.serial} from here"
    )
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from ..android import fuelgauge
    from ..devices.adb_link import AdbLink
    from ..devices.base import DeviceError

    settings = _settings()
    try:
        link = AdbLink(args.serial, settings)
        record = fuelgauge.calibrate(
            link, seconds=args.seconds, force=args.force_charging, settings=settings
        )
    except DeviceError as e:
        raise CliError(str(e)) from e
    print(f"{link.serial}: {record.describe()}; saved in {settings.state_dir}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from ..android.bench import RunnerMissing, run
    from ..devices.base import DeviceError

    options = {
        k: v
        for k, v in (
            ("model", args.model),
            ("controller", args.controller),
            ("n_ctx", args.n_ctx),
            ("max_tokens", args.max_tokens),
        )
        if v
    }
    from ..bench.runner import BenchError

    try:
        result = run(args.serial, options, force_charging=args.force_charging, settings=_settings())
    except (RunnerMissing, DeviceError, BenchError) as e:
        raise CliError(str(e)) from e
    report = result.report
    headline = f"turboinfer android bench: {report['inference']}"
    if not result.on_phone:
        headline += f" (why: {result.why})"
    print(headline, file=sys.stderr)
    if report.get("controllers"):
        from rich.console import Console

        from ..bench.report import table

        Console().print(table(report))
    print(json.dumps(report, indent=2, sort_keys=True, default=str))
    return 0


def _install(args: argparse.Namespace) -> int:
    from ..android.termux import install
    from ..devices.adb_link import AdbLink
    from ..devices.base import DeviceError

    script = _examples_dir() / "termux-run.sh"
    if not script.is_file():
        raise CliError(f"the Termux script is missing: {script} (source checkout needed)")
    try:
        report = install(
            AdbLink(args.serial, _settings()),
            dist=args.dist,
            backend=args.gpu_backend,
            script=script,
            run_setup=not args.push_only,
        )
    except DeviceError as e:
        raise CliError(str(e)) from e
    for step in report.steps:
        print(f"  {step}")
    if report.ran_setup:
        print(
            f"turboinfer installed in Termux on {report.serial}; "
            "`turboinfer android bench` now runs inference on the phone"
        )
    return 0


def _restore(args: argparse.Namespace) -> int:
    from ..devices.adb import restore_phone, saved_state
    from ..devices.adb_link import AdbLink
    from ..devices.base import DeviceError

    settings = _settings()
    try:
        link = AdbLink(args.serial, settings)
        path, state = saved_state(link.serial, settings)
        done = restore_phone(link.serial, state, settings)
    except DeviceError as e:
        raise CliError(str(e)) from e
    path.unlink()
    print(done)
    return 0


def _push_run(args: argparse.Namespace) -> int:
    readme = _examples_dir() / "README.md"
    script = _examples_dir() / "termux-run.sh"
    if not readme.exists() or not script.exists():
        raise CliError(
            f"the Termux guide is missing from {_examples_dir()} (source checkout needed)"
        )
    text = readme.read_text()
    start = text.find("## On the phone (Termux)")
    print(text[start:] if start >= 0 else text)
    if args.push:
        from ..devices.adb_link import AdbLink
        from ..devices.base import DeviceError

        try:
            link = AdbLink(args.serial, _settings())
            link.push(script, PUSH_RUN_REMOTE)
        except DeviceError as e:
            raise CliError(str(e)) from e
        print(
            f"pushed {script.name} to {link.serial}:{PUSH_RUN_REMOTE}; in Termux run: "
            f"sh {PUSH_RUN_REMOTE} --help"
        )
    return 0
