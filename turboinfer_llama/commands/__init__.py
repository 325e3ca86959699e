"""CLI subcommands: one module each, each exposing ``register(subparsers)``.

A subcommand module sets ``func`` on its parser (``parser.set_defaults(func=...)``);
``func(args) -> int`` is the exit status. Raise ``CliError`` for a clean one-line
error (no traceback unless --debug).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

SUBCOMMANDS: tuple[str, ...] = ("bench", "sweep", "serve", "probe", "restore", "android", "trace")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an output path whose directory is missing or not writable, before any work."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise CliError(f"{flag} {path}: not writable")


def require_matplotlib(plot_path: str | None) -> None:
    """A --plot needs matplotlib (the ``plot`` extra): say so before any work."""
    if not plot_path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'turboinfer-llama[plot]'") from None


def load(name: str):  # type: ignore[no-untyped-def]
    """The module for subcommand ``name``, or None if it is not installed yet."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            return None
        raise
