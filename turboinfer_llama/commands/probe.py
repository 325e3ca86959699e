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


# Words that name a sysfs GPU's vendor, and the words its llama.cpp device would carry
# (Vulkan/OpenCL device descriptions: "Adreno (TM) 650", "Mali-G76", "NVIDIA Orin").
_VENDOR_WORDS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("kgsl", "adreno"), ("adreno", "qualcomm", "turnip")),
    (("mali",), ("mali",)),
    (("ga10b", "gv11b", "gp10b", "tegra"), ("nvidia", "orin", "tegra", "xavier")),
)


def _llama_cpp_devices() -> dict[str, Any]:
    """llama.cpp's view: ggml's backend registry (backends, devices, memory)."""
    from ..engine.backends import backends, devices, supports_gpu_offload
    from ..engine.ggml_mirror import GgmlUnavailable

    try:
        return {
            "gpu_offload": supports_gpu_offload(),
            "backends": backends(),
            "devices": [d.to_json() for d in devices()],
        }
    except (GgmlUnavailable, ImportError) as e:
        return {"gpu_offload": False, "backends": [], "devices": [], "error": str(e)}


def match_backends(gpus: list[dict[str, Any]], llama: dict[str, Any]) -> dict[str, Any]:
    """Does llama.cpp compute on the GPU whose clock we would steer?"""
    compute = [d for d in llama.get("devices", []) if d["type"] in ("gpu", "igpu")]
    steer = [g for g in gpus if "error" not in g]
    if not steer:
        return {"match": None, "why": "no real GPU to steer here (the simulator stands in)"}
    names = ", ".join(g["name"] for g in steer)
    if not compute:
        return {
            "match": False,
            "why": f"llama.cpp has no GPU device: the model would run on the CPU while "
            f"{names} is steered; build llama-cpp-python with -DGGML_VULKAN=ON "
            "(or -DGGML_OPENCL=ON on Adreno 7xx and newer)",
        }
    for g in steer:
        key = g["name"].lower()
        for sysfs_words, llama_words in _VENDOR_WORDS:
            if not any(w in key for w in sysfs_words):
                continue
            hits = [d for d in compute if any(w in d["description"].lower() for w in llama_words)]
            if hits:
                d = hits[0]
                return {
                    "match": True,
                    "why": f'{d["backend"]} device {d["name"]} "{d["description"]}" '
                    f"is the GPU behind {g['name']}",
                }
            listed = ", ".join(f'{d["name"]} "{d["description"]}"' for d in compute)
            return {
                "match": False,
                "why": f"{g['name']} is steered, but llama.cpp computes on {listed}",
            }
    listed = ", ".join(f'{d["name"]} "{d["description"]}"' for d in compute)
    return {"match": None, "why": f"cannot tell whether {listed} is the GPU behind {names}"}


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
    gpus = _real_devices(root)
    llama = _llama_cpp_devices()
    return {
        "root": root,
        "leftover_state": _leftover_state(),
        "backends": backends,
        "devices": gpus,
        "llama_cpp": llama,
        "compute_matches_steered": match_backends(gpus, llama),
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

    llama = report["llama_cpp"]
    t = Table(
        title="llama.cpp compute devices (ggml backend registry; "
        f"GPU offload {'yes' if llama['gpu_offload'] else 'no'})"
    )
    for col in ("backend", "device", "type", "description", "memory MiB (free/total)"):
        t.add_column(col)
    for d in llama["devices"]:
        t.add_row(
            d["backend"],
            d["name"],
            d["type"],
            d["description"],
            f"{d['memory_free_bytes'] >> 20}/{d['memory_total_bytes'] >> 20}",
        )
    if llama.get("error"):
        t.add_row("-", "", "", llama["error"], "")
    console.print(t)
    verdict = report["compute_matches_steered"]
    word = {True: "yes", False: "NO", None: "unknown"}[verdict["match"]]
    console.print(f"llama.cpp computes on the steered GPU: [bold]{word}[/bold] ({verdict['why']})")

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
