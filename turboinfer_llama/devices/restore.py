"""Put back a GPU state saved in a state file (``devices/state.py``).

Used by the guardian when its owner died, and by ``turboinfer restore``. Local
backends are reopened on their sysfs tree without taking ownership; a phone is
reached over adb; for the kernel module there is nothing to write (the kernel drops
an fd's PM QoS requests when it closes) and we only check that none is left.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .base import DeviceError, DeviceState, Unsupported
from .state import StateRecord


def _describe(state: DeviceState) -> str:
    return f"governor {state.governor}, {state.min_hz / 1e6:g}-{state.max_hz / 1e6:g} MHz"


def restore_record(rec: StateRecord, *, root: str | None = None) -> str:
    """Restore ``rec``'s state on its device; returns a one-line account. ``root``
    overrides the sysfs root recorded in the file."""
    if rec.kind in ("devfreq", "kgsl"):
        from .devfreq import DevfreqGpu
        from .kgsl import KgslGpu
        from .sysfs_io import LocalSysfs

        io = LocalSysfs(root or rec.where.get("root", "/"))
        path = str(rec.where["path"])
        gpu: DevfreqGpu | KgslGpu = (
            DevfreqGpu(io, path, own=False)
            if rec.kind == "devfreq"
            else KgslGpu(io, path, own=False)
        )
        gpu.close()  # drops its own guard first: it would put back today's (pinned) state
        gpu.restore(rec.state)
        return f"{rec.name}: restored {_describe(rec.state)}"
    if rec.kind == "kmod":
        return check_kmod_released(str(rec.where.get("path", "/dev/turboinfer")), rec.name)
    if rec.kind == "adb":
        from .adb import restore_phone

        return restore_phone(str(rec.where["serial"]), rec.state)
    raise Unsupported(f"{rec.name}: no way to restore a {rec.kind!r} device")


def check_kmod_released(path: str, name: str) -> str:
    """After its owner died: is any max-frequency request still held on the module's
    GPU? (A child forked without exec keeps the fd, and with it the requests.)"""
    from .kmod import TI_GET_INFO, TiInfo

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return f"{name}: {path} is gone (module unloaded): no request can remain"
        raise DeviceError(f"cannot open {path} to check {name}: {e.strerror}") from e
    try:
        info = TiInfo()
        fcntl.ioctl(fd, TI_GET_INFO, info, True)
    except OSError as e:
        return (
            f"{name}: the kernel dropped the owner's requests with its fd "
            f"(could not read {path}: {e.strerror})"
        )
    finally:
        os.close(fd)
    top = max(int(f) for f in info.freqs_hz[: info.num_freqs]) if info.num_freqs else 0
    if info.qos_max_hz and info.qos_max_hz < top:
        raise DeviceError(
            f"{name}: a max-frequency request of {info.qos_max_hz / 1e6:g} MHz is still held "
            f"on {path}, by another open fd (a child of the dead owner?); it ends when that "
            "fd closes"
        )
    return f"{name}: no request left on {path} (the kernel dropped them with the fd)"
