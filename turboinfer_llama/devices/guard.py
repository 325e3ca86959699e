"""Restore guard: a GPU we touched is always put back (governor, min, max).

Every real backend registers one ``RestoreGuard`` when it opens. The state is restored
on ``close()``, when a ``with`` block exits by exception, at interpreter exit (atexit,
which also covers unhandled exceptions) and on SIGTERM/SIGINT. Signal handlers are
installed once, from the main thread, and chain whatever handler was there before.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = threading.RLock()
_active: dict[int, RestoreGuard] = {}
_previous_handlers: dict[int, Any] = {}
_atexit_installed = False
_signals_installed = False
_next_id = 0


class RestoreGuard:
    """Calls ``restore_fn`` exactly once: on ``restore()``, a ``with`` exit, atexit or
    SIGTERM/SIGINT, whichever comes first."""

    def __init__(self, restore_fn: Callable[[], None], name: str) -> None:
        global _next_id
        self._restore_fn = restore_fn
        self.name = name
        self._done = False
        with _lock:
            _install_handlers()
            self._id = _next_id
            _next_id += 1
            _active[self._id] = self

    @property
    def done(self) -> bool:
        return self._done

    def restore(self) -> None:
        """Put the device back. Idempotent; errors are logged and re-raised once."""
        with _lock:
            if self._done:
                return
            self._done = True
            _active.pop(self._id, None)
        self._restore_fn()
        log.debug("restored %s", self.name)

    def __enter__(self) -> RestoreGuard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def active_guards() -> list[str]:
    """Names of devices that will still be restored (for diagnostics and tests)."""
    with _lock:
        return [g.name for g in _active.values()]


def restore_all() -> None:
    """Restore every device still guarded, newest first (a later guard may depend on an
    earlier one: the native plan executor writing to a device is stopped before the
    device is restored); one failure does not stop the others."""
    with _lock:
        guards = list(_active.values())
    for g in reversed(guards):
        try:
            g.restore()
        except Exception:  # keep restoring the rest at exit
            log.exception("could not restore %s", g.name)


def _forget_in_child() -> None:
    """A forked child does not own its parent's devices: it must never put them back
    (at its exit or on its signals) while the parent still steers them."""
    _active.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    restore_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        # Die by the signal as the default action would, so the exit status says so.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """atexit once; signal handlers once, as soon as a guard is made on the main thread
    (Python only allows signal handlers to be set there)."""
    global _atexit_installed, _signals_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(restore_all)
    if _signals_installed:
        return
    if threading.current_thread() is not threading.main_thread():
        log.debug("restore guard: not on the main thread, signal handlers not installed yet")
        return
    _signals_installed = True
    for sig in _SIGNALS:
        _previous_handlers[sig] = signal.getsignal(sig)
        signal.signal(sig, _on_signal)
