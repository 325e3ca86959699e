"""CLI subcommands: one module each, each exposing ``register(subparsers)``.

A subcommand module sets ``func`` on its parser (``parser.set_defaults(func=...)``);
``func(args) -> int`` is the exit status. Raise ``CliError`` for a clean one-line
error (no traceback unless --debug).
"""

from __future__ import annotations

import importlib

SUBCOMMANDS: tuple[str, ...] = ("bench", "sweep", "serve", "probe", "restore", "android", "trace")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def load(name: str):  # type: ignore[no-untyped-def]
    """The module for subcommand ``name``, or None if it is not installed yet."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            return None
        raise
