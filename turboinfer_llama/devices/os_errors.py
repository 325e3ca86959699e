"""One errno table for every backend: which ``DeviceError`` an ``OSError`` becomes.

Backends share the mapping (``ERRNO_CLASSES``) and keep their own wording: each passes
message templates per error class, and may override single errnos whose meaning is
specific to it (``/dev/turboinfer``'s EBADF and ENOTTY). Templates are ``str.format``
strings with ``{action}``, ``{path}`` and ``{strerror}``.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from .base import DeviceError, DeviceGone, DeviceNotFound, PermissionDenied

ERRNO_CLASSES: dict[int, type[DeviceError]] = {
    errno.EACCES: PermissionDenied,
    errno.EPERM: PermissionDenied,
    errno.EROFS: PermissionDenied,
    errno.ENOENT: DeviceNotFound,
    errno.ENOTDIR: DeviceNotFound,
    errno.ENODEV: DeviceGone,
    errno.ENXIO: DeviceGone,
    errno.EIO: DeviceGone,
}

DEFAULT_MESSAGES: dict[type[DeviceError], str] = {
    PermissionDenied: "cannot {action} {path}: permission denied",
    DeviceNotFound: "cannot {action} {path}: no such file",
    DeviceGone: "cannot {action} {path}: device gone ({strerror})",
    DeviceError: "cannot {action} {path}: {strerror}",
}


def translate(
    e: OSError,
    path: str,
    action: str,
    *,
    messages: Mapping[type[DeviceError], str] | None = None,
    overrides: Mapping[int, tuple[type[DeviceError], str]] | None = None,
) -> DeviceError:
    """The ``DeviceError`` for ``e`` (raise it ``from e``). ``messages`` replaces the
    default template of an error class; ``overrides`` maps an errno to its own class
    and template for this backend."""
    code = e.errno if e.errno is not None else -1
    if overrides and code in overrides:
        cls, template = overrides[code]
    else:
        cls = ERRNO_CLASSES.get(code, DeviceError)
        template = (messages or {}).get(cls) or DEFAULT_MESSAGES[cls]
    return cls(template.format(action=action, path=path, strerror=e.strerror or e))
