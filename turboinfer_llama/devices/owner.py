"""One owner per GPU: a lock, a state file and a guardian for the process steering it.

``Ownership.acquire`` takes ``flock`` on ``<state dir>/<key>.lock`` (a second process
gets ``DeviceBusy`` naming the holder's pid). Holding the lock, it looks for a state
file left by an owner that died: that GPU may still be pinned, so its saved state is
put back *before* the new owner takes its own snapshot (we never snapshot a GPU
someone else pinned). ``hold`` writes our state file and starts the guardian;
``release`` stops the guardian, removes the state file once the state is back and
drops the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import DeviceError, DeviceState
from .state import (
    HELD_HERE,
    CrashSafetySettings,
    StateRecord,
    device_key,
    pid_alive,
    read_record,
    write_record,
)

log = logging.getLogger(__name__)

HANDOVER_WAIT_S = 3.0
_warned_guardian = False


class StateDirUnusable(DeviceError):
    """The lock or state file cannot be created (state directory not writable)."""


class DeviceBusy(DeviceError):
    """Another process steers this GPU; ``holder_pid`` says which (None if unknown)."""

    def __init__(self, message: str, holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


def _describe_pid(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


def lock_holder(path: Path) -> int | None:
    """The pid written in a lock file by its holder, if any."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class DeviceLock:
    """``flock`` on one file per GPU, held while this process steers it. The fd is
    close-on-exec, and the kernel drops the lock when the process dies."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StateDirUnusable(f"cannot create the lock file {self.path}: {e.strerror}") from e
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = lock_holder(self.path)
                # The holder on record is dead: a guardian is putting its GPU back
                # (tens of ms); wait for it rather than refuse.
                if holder is not None and not pid_alive(holder) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                os.close(fd)
                who = _describe_pid(holder) if holder else "another process"
                raise DeviceBusy(
                    f"{self.name} is being steered by {who} (lock {self.path}); stop "
                    "that process first: two controllers on one GPU would fight",
                    holder,
                ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # drops the flock


class Ownership:
    """The lock, state file and guardian of one steered GPU (see module docstring).

    ``kind`` is the backend (devfreq, kgsl, kmod), ``node`` the GPU's real path (it
    names the lock and state files), ``where`` what the guardian and ``turboinfer
    restore`` need to reach the device again."""

    def __init__(
        self,
        kind: str,
        name: str,
        node: str,
        where: dict[str, Any],
        *,
        settings: CrashSafetySettings | None = None,
        record_path: Path | None = None,
        guardian: bool | None = None,
    ) -> None:
        s = settings or CrashSafetySettings()
        self.kind, self.name, self.where = kind, name, where
        self.directory = s.state_dir
        # KGSL and its devfreq node are one GPU: one key (the node's real path).
        self.key = device_key("gpu" if kind in ("devfreq", "kgsl") else kind, node)
        self.lock = DeviceLock(self.directory / f"{self.key}.lock", name)
        self.record_path = record_path or self.directory / f"{self.key}.json"
        self.use_guardian = s.guardian if guardian is None else guardian
        self.guardian: Any = None
        self.recorded = False
        self.adopted: str | None = None
        self.warnings: list[str] = []

    def acquire(self, restore_fn: Callable[[DeviceState], None]) -> None:
        """Lock the GPU; put back a state left by a dead owner with ``restore_fn``."""
        self.lock.acquire()
        try:
            self._adopt_leftover(restore_fn)
        except BaseException:
            self.lock.release()
            raise

    def _adopt_leftover(self, restore_fn: Callable[[DeviceState], None]) -> None:
        try:
            rec = read_record(self.record_path)
        except FileNotFoundError:
            return
        except DeviceError as e:
            log.warning("%s; removing it", e)
            self.record_path.unlink(missing_ok=True)
            return
        # We hold the lock, so whoever wrote this file no longer steers the GPU.
        if rec.stale:
            log.info("%s: state file from an earlier boot removed", self.name)
        else:
            restore_fn(rec.state)
            self.adopted = (
                f"took over from pid {rec.pid}, which left a state file without closing; "
                f"its saved state (governor {rec.state.governor}, "
                f"{rec.state.min_hz}-{rec.state.max_hz} Hz) was put back first"
            )
            log.warning("%s: %s", self.name, self.adopted)
        self.record_path.unlink(missing_ok=True)

    def hold(self, state: DeviceState) -> None:
        """Persist ``state`` and start the guardian. Never raises: without them the
        device still works (with one warning)."""
        record = StateRecord(self.kind, self.name, state, where=self.where)
        try:
            write_record(self.record_path, record)
            self.recorded = True
            HELD_HERE.add(str(self.record_path))
        except OSError as e:
            self._warn(f"cannot keep the GPU state of {self.name} in {self.record_path}: {e}")
        if not self.use_guardian:
            return
        from .guardian import GuardianError, start_guardian

        try:
            self.guardian = start_guardian(
                {
                    "owner_pid": os.getpid(),
                    "kind": self.kind,
                    "name": self.name,
                    "where": self.where,
                    "state": record.to_json()["state"],
                    "record": str(self.record_path),
                    "record_written": self.recorded,
                    "lock": str(self.lock.path),
                    "log": str(self.directory / "guardian.log"),
                }
            )
        except (GuardianError, OSError) as e:
            self._warn(
                f"no guardian for {self.name} ({e}): if this process is killed (SIGKILL, "
                "OOM), run `turboinfer restore` to put the GPU back"
            )

    def _warn(self, message: str) -> None:
        global _warned_guardian
        self.warnings.append(message)
        if not _warned_guardian:
            _warned_guardian = True
            log.warning("%s", message)
        else:
            log.debug("%s", message)

    def release(self, *, restored: bool) -> None:
        """Stop the guardian; remove the state file if the state is back; unlock."""
        HELD_HERE.discard(str(self.record_path))
        try:
            if self.guardian is not None:
                self.guardian.stop()
                self.guardian = None
            if restored:
                self.record_path.unlink(missing_ok=True)
            elif self.recorded:
                log.error(
                    "%s was not restored; its state stays in %s: run `turboinfer restore`",
                    self.name,
                    self.record_path,
                )
        finally:
            self.lock.release()

    def health(self) -> dict[str, Any]:
        return {
            "lock": str(self.lock.path) if self.lock.held else None,
            "state_file": str(self.record_path) if self.recorded else None,
            "guardian_pid": self.guardian.pid if self.guardian is not None else None,
            "adopted": self.adopted,
            "warnings": list(self.warnings),
        }


def take(ownership: Ownership, restore_fn: Callable[[DeviceState], None]) -> Ownership | None:
    """``ownership.acquire``; None (with one warning) when the state directory is
    unusable, so the device still opens. ``DeviceBusy`` goes through."""
    try:
        ownership.acquire(restore_fn)
    except StateDirUnusable as e:
        ownership._warn(
            f"{e}: {ownership.name} opens without a lock, state file or guardian "
            "(set TURBOINFER_STATE_DIR to a writable directory)"
        )
        return None
    return ownership


def local_ownership(kind: str, name: str, root: str, path: str, node: str) -> Ownership:
    """Ownership of a local sysfs GPU: ``path`` under ``root``; ``node`` its real path."""
    return Ownership(kind, name, node, {"root": root, "path": path})
