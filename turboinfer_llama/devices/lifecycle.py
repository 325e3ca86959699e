"""The open/close boilerplate every real backend shares.

``Closeable`` gives ``with`` support on top of ``close()``. ``GuardedBackend`` adds
the restore guard (``devices/guard.py``): ``close()`` runs the backend's own
close-and-restore function exactly once, and every steering call first checks that
the device is still open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .base import DeviceGone
from .guard import RestoreGuard

if TYPE_CHECKING:
    from .owner import Ownership

_T = TypeVar("_T", bound="Closeable")

log = logging.getLogger(__name__)


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
    _ownership: Ownership | None = None

    def _install_guard(
        self, close_fn: Callable[[], None], ownership: Ownership | None = None
    ) -> None:
        """``ownership`` (lock, state file, guardian) is released after ``close_fn``;
        its state file stays when ``close_fn`` failed, for ``turboinfer restore``."""
        self._ownership = ownership

        def close_and_release() -> None:
            restored = False
            try:
                close_fn()
                restored = True
            finally:
                if ownership is not None:
                    ownership.release(restored=restored)

        self._guard = RestoreGuard(close_and_release, self.name)

    foreign_writes = 0
    last_foreign_write: str | None = None

    def _note_foreign_write(self, what: str) -> None:
        """Someone else (vendor perfd, thermal-engine) wrote the clock limits, or the
        kernel did not take ours: log and count it; we do not fight back."""
        self.foreign_writes += 1
        self.last_foreign_write = what
        log.warning("%s: foreign write #%d: %s", self.name, self.foreign_writes, what)

    def foreign_write_health(self) -> dict[str, Any]:
        return {
            "foreign_writes": self.foreign_writes,
            "last_foreign_write": self.last_foreign_write,
        }

    def ownership_health(self) -> dict[str, Any]:
        """Lock, state file and guardian of this device (empty when not owned)."""
        return self._ownership.health() if self._ownership is not None else {}

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
