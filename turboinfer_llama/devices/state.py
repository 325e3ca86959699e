"""State files: the snapshot of every GPU we steer, on disk until it is put back.

When a backend takes a GPU it writes ``<state dir>/<key>.json`` holding the state it
found (governor, min, max) and who took it (pid, boot id, where the device is). The
file is removed once that state is restored. A file whose owner is dead is
*left over*: the guardian (``devices/guardian.py``), the next process that takes the
same GPU, or ``turboinfer restore`` puts its state back. A file from an earlier boot
is stale: a reboot already reset the GPU.

The state directory is ``$TURBOINFER_STATE_DIR``, else ``$XDG_STATE_HOME/turboinfer``,
else ``~/.local/state/turboinfer``. Phones keep theirs where ``AdbSettings.state_dir``
says (``<serial>.gpu-state.json``), in the same format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .base import DeviceError, DeviceState

log = logging.getLogger(__name__)

STATE_VERSION = 1

# State files this process holds now (its own open devices), by path.
HELD_HERE: set[str] = set()


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "turboinfer"


class CrashSafetySettings(BaseSettings):
    """Env vars: ``TURBOINFER_STATE_DIR``, ``TURBOINFER_GUARDIAN``."""

    model_config = SettingsConfigDict(env_prefix="TURBOINFER_", extra="ignore")

    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where GPU state files, per-GPU lock files and the guardian's log are "
        "kept. Default $XDG_STATE_HOME/turboinfer (~/.local/state/turboinfer).",
    )
    guardian: bool = Field(
        default=True,
        description="Start a guardian process per steered GPU that restores it if this "
        "process dies without closing it (SIGKILL, OOM kill, native crash).",
    )


def state_dir() -> Path:
    """The state directory (created on first use by the writers)."""
    return CrashSafetySettings().state_dir


def boot_id() -> str | None:
    """This boot's id (Linux), to tell a state file from before a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive (a zombie counts as dead)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def device_key(kind: str, node: str) -> str:
    """A file name for one GPU: ``kind`` and the node's real path, made safe."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", node).strip("_")
    key = f"{kind}-{safe}"
    if len(key) > 180:
        import hashlib

        key = key[:140] + "-" + hashlib.sha1(node.encode()).hexdigest()[:16]
    return key


@dataclass
class StateRecord:
    """One state file. ``where`` says how to reach the device again: ``root`` and
    ``path`` for local sysfs backends, ``path`` for kmod, ``serial`` for adb."""

    kind: str
    name: str
    state: DeviceState
    pid: int = field(default_factory=os.getpid)
    boot_id: str | None = field(default_factory=boot_id)
    where: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "name": self.name,
            "pid": self.pid,
            "boot_id": self.boot_id,
            "where": self.where,
            "state": dataclasses.asdict(self.state),
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], *, kind: str = "adb") -> StateRecord:
        """Also reads the older adb format (a bare ``DeviceState`` dict)."""
        if "version" not in doc:
            return cls(kind=kind, name=kind, state=DeviceState(**doc), pid=0, boot_id=None)
        return cls(
            kind=str(doc["kind"]),
            name=str(doc.get("name", doc["kind"])),
            state=DeviceState(**doc["state"]),
            pid=int(doc.get("pid", 0)),
            boot_id=doc.get("boot_id"),
            where=dict(doc.get("where", {})),
            notes=list(doc.get("notes", [])),
        )

    @property
    def stale(self) -> bool:
        """Written before the last reboot (which reset the GPU)."""
        now = boot_id()
        return self.boot_id is not None and now is not None and self.boot_id != now


def write_record(path: Path, record: StateRecord) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_json()))
    os.replace(tmp, path)


def read_record(path: Path) -> StateRecord:
    try:
        doc = json.loads(path.read_text())
        return StateRecord.from_json(doc)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise DeviceError(f"{path}: not a readable GPU state file ({e})") from e


def remove_record(path: Path, pid: int | None = None) -> bool:
    """Remove the file; with ``pid``, only if that process still owns it."""
    if pid is not None:
        try:
            if read_record(path).pid != pid:
                return False
        except (FileNotFoundError, DeviceError):
            return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False


def records(directory: Path | None = None) -> list[tuple[Path, StateRecord]]:
    """Every state file in ``directory`` (default: the state directory) and the adb
    state directory; unreadable ones are logged and skipped."""
    dirs = [directory or state_dir()]
    if directory is None:
        try:
            from .adb_settings import AdbSettings

            dirs.append(AdbSettings().state_dir)
        except ValueError as e:
            log.debug("adb settings unusable: %s", e)
    found: list[tuple[Path, StateRecord]] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for p in sorted([*d.glob("*.json")]):
            if p.name.startswith("."):
                continue
            if d != dirs[0] and not p.name.endswith(".gpu-state.json"):
                continue
            if p.name.endswith(".fuelgauge.json"):
                continue
            try:
                rec = read_record(p)
            except (FileNotFoundError, DeviceError) as e:
                log.warning("skipping %s: %s", p, e)
                continue
            if rec.kind == "adb" and "serial" not in rec.where:
                rec.where["serial"] = p.name.removesuffix(".gpu-state.json")
            found.append((p, rec))
    return found


def owner_alive(path: Path, rec: StateRecord) -> bool:
    """Does the process that wrote ``path`` still hold it?"""
    if rec.pid == os.getpid():
        return str(path) in HELD_HERE
    return pid_alive(rec.pid)


def leftovers(directory: Path | None = None) -> list[tuple[Path, StateRecord]]:
    """State files whose owner is gone: a GPU may still be pinned."""
    return [(p, r) for p, r in records(directory) if not owner_alive(p, r)]
