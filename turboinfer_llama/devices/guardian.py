"""The guardian: a tiny process that puts a GPU back if its owner dies without closing.

The owner (the process steering the GPU) starts it with ``start_guardian`` when it
takes the device. It is spawned with exec, ``close_fds`` and its own session, so it
holds none of the owner's fds (an inherited ``/dev/turboinfer`` would keep the
module's PM QoS requests alive) and no terminal signal reaches it. It gets the
snapshot on stdin and then waits, at no cost to the owner, on two things:

* the owner's pidfd (``os.pidfd_open``), readable when the owner dies, however it
  dies (SIGKILL, OOM kill, a crash in native code); ``PR_SET_PDEATHSIG`` would fire
  when the creating *thread* exits, so it is not used;
* its stdin pipe: ``bye`` means a normal close (exit quietly), end-of-file without
  ``bye`` means the owner is gone (also the fallback where pidfds are missing).

When the owner is gone it takes the GPU's lock (free once the owner is dead; the
guardian holds no lock while the owner lives), and if the owner's state file is still
there, restores governor, min and max from it, removes the file and exits. If a new
owner took the GPU first, that one has already put the state back (``owner.py``).
What it did goes to ``<state dir>/guardian.log``.

Run as ``python -m turboinfer_llama.devices.guardian`` (by ``start_guardian`` only).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .base import DeviceError, DeviceState

log = logging.getLogger("turboinfer.guardian")

READY = b"ready\n"
BYE = b"bye\n"
START_TIMEOUT_S = 20.0
LOCK_WAIT_S = 5.0
POLL_S = 0.5


class GuardianError(Exception):
    """The guardian could not be started."""


class GuardianHandle:
    """The owner's end: ``stop()`` on a normal close."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Tell the guardian we closed normally and reap it."""
        stdin = self.proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                stdin.write(BYE)
                stdin.flush()
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_guardian(spec: dict[str, Any]) -> GuardianHandle:
    """Spawn the guardian for ``spec`` and wait until it watches us."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turboinfer_llama.devices.guardian"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    except OSError as e:
        raise GuardianError(f"cannot spawn it: {e.strerror or e}") from e
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(spec).encode() + b"\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
    except OSError as e:
        line = b""
        why = str(e)
    else:
        why = "it did not answer" if not ready else "it exited at start"
    finally:
        proc.stdout.close()
    if line != READY:
        proc.kill()
        proc.wait()
        raise GuardianError(why)
    return GuardianHandle(proc)


# ---- the guardian process ------------------------------------------------------------


def _read_line(fd: int, buf: bytearray) -> bytes | None:
    """One line from ``fd`` (blocking); None at end of file."""
    while b"\n" not in buf:
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line + b"\n"


def _wait_for_owner(owner_pid: int, stdin_fd: int, buf: bytearray) -> bool:
    """Block until the owner closes normally (False) or dies (True)."""
    try:
        pidfd: int | None = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        pidfd = None  # old kernel or Python: watch the pipe, and poll the pid
    poller = select.poll()
    poller.register(stdin_fd, select.POLLIN | select.POLLHUP)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while True:
        events = poller.poll(None if pidfd is not None else POLL_S * 1000)
        for fd, _ in events:
            if fd == pidfd:
                return True
            line = _read_line(stdin_fd, buf)
            if line is None:
                return True  # the pipe closed without a goodbye
            if line == BYE:
                return False
        if pidfd is None and not events:
            from .state import pid_alive

            if not pid_alive(owner_pid):
                return True


def _lock(path: str, owner_pid: int) -> int | None:
    """The GPU lock's fd once we hold it; None if a new owner holds it (it restores)."""
    from .owner import lock_holder

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if lock_holder(Path(path)) == owner_pid:
                # A child forked by the dead owner inherited its lock: the owner is
                # still the one on record, so we restore without the lock.
                return fd
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.02)


def restore_after_death(spec: dict[str, Any]) -> str:
    """Put the GPU back for a dead owner; returns what was done."""
    from .restore import restore_record
    from .state import StateRecord, read_record

    owner = int(spec["owner_pid"])
    name = spec["name"]
    lock_fd = _lock(spec["lock"], owner)
    if lock_fd is None:
        return f"{name}: another process took the GPU; it put the state back"
    try:
        record_path = Path(spec["record"])
        try:
            rec = read_record(record_path)
        except FileNotFoundError:
            if spec.get("record_written"):
                return f"{name}: state already put back"
            rec = StateRecord(
                spec["kind"], name, DeviceState(**spec["state"]), pid=owner, where=spec["where"]
            )
        if rec.pid != owner:
            return f"{name}: now owned by pid {rec.pid}; nothing to do"
        done = restore_record(rec)
        record_path.unlink(missing_ok=True)
        return f"owner pid {owner} died without closing; {done}"
    finally:
        os.close(lock_fd)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)
    buf = bytearray()
    line = _read_line(0, buf)
    if line is None:
        return 2
    spec = json.loads(line)
    with contextlib.suppress(OSError):
        logging.basicConfig(
            filename=spec["log"],
            level=logging.INFO,
            format=f"%(asctime)s guardian[{os.getpid()}] %(levelname)s %(message)s",
        )
    os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    # Import the restore path now, so that after the owner's death only the writes
    # remain (the 1 s budget is not spent importing).
    from . import devfreq, kgsl, kmod, restore  # noqa: F401

    if not _wait_for_owner(int(spec["owner_pid"]), 0, buf):
        return 0
    try:
        log.info("%s", restore_after_death(spec))
    except (DeviceError, OSError) as e:
        log.error(
            "%s: could not restore after pid %s died: %s; its state stays in %s for "
            "`turboinfer restore`",
            spec["name"],
            spec["owner_pid"],
            e,
            spec["record"],
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
