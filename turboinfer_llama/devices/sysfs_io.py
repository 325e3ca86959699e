"""Where sysfs files are read and written: locally under an injectable root, or over adb.

The devfreq and KGSL backends speak only to a ``SysfsIO``, so the same backend code
drives a local tree (``LocalSysfs``; tests point its root at a fake tree under a tmp
dir) and a phone over one adb shell session (``devices/adb.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from .base import DeviceError, PermissionDenied
from .os_errors import translate


class SysfsIO(Protocol):
    """Paths are absolute device paths such as ``/sys/class/kgsl/kgsl-3d0/gpuclk``."""

    def read(self, path: str) -> str:
        """File contents, stripped."""
        ...

    def write(self, path: str, value: str) -> None: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def writable(self, path: str) -> bool: ...

    def describe(self) -> str:
        """Where we are, for messages: a root dir or an adb serial."""
        ...


_HOW_TO_GET_PERMISSION = (
    "run as root (sudo), or grant write access with "
    "`sudo chmod a+w {path}` (or a udev rule), or load the turboinfer kernel module "
    "(`sudo insmod turboinfer.ko`) and use --device kmod"
)


def translate_os_error(e: OSError, path: str, action: str) -> DeviceError:
    """Map an OSError at the backend boundary onto our hierarchy (``os_errors``)."""
    return translate(
        e,
        path,
        action,
        messages={
            PermissionDenied: "cannot {action} {path}: permission denied; " + _HOW_TO_GET_PERMISSION
        },
    )


class LocalSysfs:
    """Sysfs on this machine, rooted at ``root`` (``/`` on a real device)."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def real_path(self, path: str) -> str:
        """The file's real path on this machine (symlinks resolved): names its lock."""
        return os.path.realpath(self._p(path))

    def read(self, path: str) -> str:
        try:
            return self._p(path).read_text().strip()
        except OSError as e:
            raise translate_os_error(e, path, "read") from e

    def write(self, path: str, value: str) -> None:
        try:
            with open(self._p(path), "w") as f:
                f.write(value)
        except OSError as e:
            raise translate_os_error(e, path, "write") from e

    def exists(self, path: str) -> bool:
        return self._p(path).exists()

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(path)))
        except OSError as e:
            raise translate_os_error(e, path, "list") from e

    def writable(self, path: str) -> bool:
        return os.access(self._p(path), os.W_OK)

    def describe(self) -> str:
        return f"local sysfs at {self.root}"
