"""The ``turboinfer`` console script: dispatches to ``turboinfer_llama.commands.*``."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .commands import SUBCOMMANDS, CliError, load


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turboinfer",
        description="Stall-aware GPU frequency control for llama.cpp (TurboInfer design).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = load(name)
        if module is not None:
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug = "--debug" in argv
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        if args.debug:
            raise
        print(f"turboinfer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"turboinfer {args.command}: interrupted", file=sys.stderr)
        return 130


def bench_main(argv: list[str] | None = None) -> int:
    """``turboinfer-bench``: the same as ``turboinfer bench``."""
    return main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
