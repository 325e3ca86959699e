"""The open/close boilerplate every real backend shares.

``Closeable`` gives ``with`` support on top of ``close()``. ``GuardedBackend`` adds
the restore guard (``devices/guard.py``): ``close()`` runs the backend's own
close-and-restore function exactly once, and every steering call first checks that
the device is still open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .base import DeviceGone
from .guard import RestoreGuard

_T = TypeVar("_T", bound="Closeable")


class Closeable:
    """``with device: ...`` closes the device on the way out, exception or not."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GuardedBackend(Closeable):
    """A backend whose state is put back by one ``RestoreGuard`` (close, exceptions,
    atexit, SIGTERM/SIGINT). Subclasses call ``_install_guard(close_fn)`` at the end
    of ``__init__``; ``close_fn`` restores the state found at open and releases
    whatever the backend holds."""

    name: str
    _guard: RestoreGuard

    def _install_guard(self, close_fn: Callable[[], None]) -> None:
        self._guard = RestoreGuard(close_fn, self.name)

    @property
    def closed(self) -> bool:
        return self._guard.done

    def close(self) -> None:
        """Restore the state found at open and release the device. Idempotent."""
        self._guard.restore()

    def _closed_label(self) -> str:
        return self.name

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceGone(f"{self._closed_label()} is closed")
