"""``turboinfer restore [--device SPEC] [--root DIR]``: put back any GPU left pinned.

Every backend keeps the state it found in a state file while it steers a GPU
(``devices/state.py``). A file whose owner died (SIGKILL, OOM kill, crash, a lost
phone) means the GPU may still be pinned: this command restores governor, min and max
from it, locally or over adb, and removes the file. Files from an earlier boot are
removed (the reboot reset the GPU); files of live owners are left alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import CliError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "restore", help="put back GPU settings left pinned by a process that died"
    )
    p.add_argument(
        "--device",
        help="only this device: devfreq[:name-or-path], kgsl, kmod[:path], adb[:serial]",
    )
    p.add_argument(
        "--root", help="sysfs root of local devices (default: the one in each state file)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _matches(rec: Any, name: str, arg: str | None) -> bool:
    if rec.kind != name:
        return False
    if not arg:
        return True
    if name == "adb":
        return bool(rec.where.get("serial") == arg)
    path = str(rec.where.get("path", ""))
    return path == arg or path.rstrip("/").endswith("/" + arg.strip("/"))


def restore_leftovers(spec: str | None = None, root: str | None = None) -> list[dict[str, Any]]:
    """Restore every left-over state file (matching ``spec``); one result per file."""
    from ..devices import parse_spec
    from ..devices.base import DeviceError
    from ..devices.owner import DeviceLock
    from ..devices.restore import restore_record
    from ..devices.state import leftovers

    name, arg = parse_spec(spec) if spec else ("", None)
    results: list[dict[str, Any]] = []
    for path, rec in leftovers():
        if spec and not _matches(rec, name, arg):
            continue
        out: dict[str, Any] = {"file": str(path), "device": rec.name, "pid": rec.pid}
        results.append(out)
        if rec.stale:
            path.unlink(missing_ok=True)
            out.update(ok=True, result="from an earlier boot (the reboot reset it): removed")
            continue
        lock = DeviceLock(path.with_suffix(".lock"), rec.name)
        try:
            if rec.kind != "adb":
                lock.acquire()
            out["result"] = restore_record(rec, root=root)
            path.unlink(missing_ok=True)
            out["ok"] = True
        except DeviceError as e:
            out.update(ok=False, result=str(e))
        finally:
            lock.release()
    return results


def run(args: argparse.Namespace) -> int:
    from ..devices.base import DeviceError
    from ..devices.state import state_dir

    if args.root is not None and not Path(args.root).is_dir():
        raise CliError(f"--root {args.root}: no such directory")
    try:
        results = restore_leftovers(args.device, args.root)
    except (DeviceError, ValueError) as e:
        raise CliError(str(e)) from e
    if args.json:
        print(json.dumps(results, indent=2))
    elif not results:
        print(f"nothing left pinned (no left-over state files in {state_dir()})")
    for r in results if not args.json else []:
        print(f"{'ok    ' if r['ok'] else 'FAILED'} {r['result']} ({r['file']})")
    return 0 if all(r["ok"] for r in results) else 1
