"""``turboinfer probe [--root DIR] [--json]``: what GPUs and meters this machine offers.

Reads only: devices are opened to read their table, clock, governor and permissions,
then closed (nothing was changed, so nothing is written back).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import CliError

# adb is probed by `turboinfer android probe`: it talks to a phone, not to this machine.
LOCAL_BACKENDS = ("kmod", "kgsl", "devfreq")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "probe", help="list GPUs, frequencies, governors, permissions, meters"
    )
    p.add_argument("--root", default="/", help="sysfs root (a fake tree for tests; default /)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def _describe(gpu: Any) -> dict[str, Any]:
    caps = gpu.capabilities
    info: dict[str, Any] = {
        "name": gpu.name,
        "frequencies_mhz": [round(h / 1e6, 2) for h in gpu.frequencies_hz()],
        "current_mhz": round(gpu.current_hz() / 1e6, 2),
        "governor": getattr(gpu, "governor", None),
        "can_set": caps.can_set,
        "has_pmu": caps.has_pmu,
        "simulated": caps.simulated,
    }
    cap = getattr(gpu, "thermal_cap_hz", None)
    cap_hz = cap() if callable(cap) else cap
    if cap_hz:
        info["thermal_cap_mhz"] = round(cap_hz / 1e6, 2)
    if getattr(gpu, "busy_source", None):
        info["busy_source"] = gpu.busy_source
    return info


def _real_devices(root: str) -> list[dict[str, Any]]:
    """Every KGSL and GPU devfreq node, usable or not (permissions show in can_set)."""
    from ..devices.base import DeviceError
    from ..devices.devfreq import DevfreqGpu, find_gpu_devfreq
    from ..devices.kgsl import KGSL_DIR, KgslGpu
    from ..devices.sysfs_io import LocalSysfs

    io = LocalSysfs(root)
    found = []
    candidates: list[tuple[str, Any]] = []
    if io.exists(f"{KGSL_DIR}/gpu_available_frequencies"):
        candidates.append(("kgsl", lambda: KgslGpu(io, own=False)))
    for path in find_gpu_devfreq(io):
        candidates.append(("devfreq", lambda path=path: DevfreqGpu(io, path, own=False)))
    for backend, make in candidates:
        try:
            gpu = make()
        except DeviceError as e:
            found.append({"backend": backend, "error": str(e)})
            continue
        try:
            found.append({"backend": backend, **_describe(gpu)})
        finally:
            gpu.close()
    return found


def _leftover_state() -> list[dict[str, Any]]:
    """State files whose owner died: those GPUs may still be pinned."""
    from ..devices.state import leftovers

    return [
        {
            "file": str(path),
            "device": rec.name,
            "pid": rec.pid,
            "stale": rec.stale,
            "governor": rec.state.governor,
            "min_hz": rec.state.min_hz,
            "max_hz": rec.state.max_hz,
        }
        for path, rec in leftovers()
    ]


def warnings(report: dict[str, Any]) -> list[str]:
    """One line per left-over state file."""
    return [
        f"WARNING: {s['device']} may still be pinned: pid {s['pid']} died without "
        f"restoring it (state file {s['file']}"
        + (", from an earlier boot" if s["stale"] else "")
        + "); run `turboinfer restore`"
        for s in report.get("leftover_state", [])
    ]


def collect(root: str) -> dict[str, Any]:
    from ..devices import probe as probe_backend
    from ..devices.sim import DEFAULT_PROFILE, SimGpu, list_profiles
    from ..power import probe_meters

    backends = []
    for name in LOCAL_BACKENDS:
        ok, why = probe_backend(name, root=root)
        backends.append({"backend": name, "usable": ok, "why": why})
    auto = next((b["backend"] for b in backends if b["usable"]), "sim")
    sim = SimGpu(DEFAULT_PROFILE)
    meters = [
        {"meter": name, "usable": ok, "why": why} for name, ok, why in probe_meters(root=root)
    ]
    meters.insert(0, {"meter": "sim", "usable": True, "why": "simulated GPU energy integral"})
    return {
        "root": root,
        "leftover_state": _leftover_state(),
        "backends": backends,
        "devices": _real_devices(root),
        "auto_picks": auto if auto != "sim" else f"sim:{DEFAULT_PROFILE} (simulated)",
        "simulator": {"profiles": list_profiles(), "default": _describe(sim)},
        "meters": meters,
    }


def _print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for line in warnings(report):
        console.print(f"[bold yellow]{line}[/bold yellow]", soft_wrap=True)
    t = Table(title=f"GPU backends (sysfs root {report['root']})")
    for col in ("backend", "usable", "why"):
        t.add_column(col)
    for b in report["backends"]:
        t.add_row(b["backend"], "yes" if b["usable"] else "no", b["why"])
    console.print(t)

    t = Table(title="GPUs found")
    for col in ("backend", "name", "governor", "current MHz", "levels MHz", "can set", "notes"):
        t.add_column(col)
    for d in report["devices"]:
        if "error" in d:
            t.add_row(d["backend"], "", "", "", "", "", d["error"])
            continue
        notes = [f"busy: {d['busy_source']}"] if d.get("busy_source") else []
        if "thermal_cap_mhz" in d:
            notes.append(f"cap {d['thermal_cap_mhz']:g} MHz")
        if not d["can_set"]:
            notes.append("no write permission: run as root or chmod min/max")
        t.add_row(
            d["backend"],
            d["name"],
            str(d["governor"]),
            f"{d['current_mhz']:g}",
            " ".join(f"{f:g}" for f in d["frequencies_mhz"]),
            "yes" if d["can_set"] else "no",
            "; ".join(notes),
        )
    if not report["devices"]:
        t.add_row("-", "none", "", "", "", "", "")
    console.print(t)

    sim = report["simulator"]
    console.print(
        f"auto picks: [bold]{report['auto_picks']}[/bold]; simulator profiles: "
        f"{', '.join(sim['profiles'])} (all simulator figures are simulated)"
    )

    t = Table(title="Energy meters")
    for col in ("meter", "usable", "why"):
        t.add_column(col)
    for m in report["meters"]:
        t.add_row(m["meter"], "yes" if m["usable"] else "no", m["why"])
    console.print(t)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if not Path(args.root).is_dir():
        raise CliError(f"--root {args.root}: no such directory")
    report = collect(args.root)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_tables(report)
    return 0
