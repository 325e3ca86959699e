"""``turboinfer serve``: the OpenAI-compatible server with power saving on.

The server's flags come from llama-cpp-python's settings classes, which take seconds to
import; they are built only when ``serve`` runs (``turboinfer serve --help`` lists them),
so other subcommands stay fast and work without the ``server`` extra.
"""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "llama-cpp-python's OpenAI-compatible server serving turboinfer's Llama: every "
    "llama-cpp-python server flag plus the power settings. Adds GET /v1/power and "
    "GET /metrics. Binds 127.0.0.1 unless --host says otherwise."
)


def register(subparsers: Any) -> None:
    # prefix_chars="\0": no option of this stub parser can match, so every word after
    # `serve` (flags included) lands in `server_args` for the real parser below.
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible server with power saving (see `turboinfer serve --help`)",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("server_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=_run)


def build_parser() -> argparse.ArgumentParser:
    from ..server.cli import add_arguments

    parser = argparse.ArgumentParser(
        prog="turboinfer serve",
        description=DESCRIPTION,
        epilog="Environment: the power settings read TURBOINFER_<NAME> (TURBOINFER_DEVICE=kgsl, "
        "TURBOINFER_POWER_SAVING=false); llama-cpp-python's settings read theirs (MODEL, "
        "N_CTX, HOST, PORT, API_KEY, CONFIG_FILE).",
    )
    add_arguments(parser)
    return parser


def _run(args: argparse.Namespace) -> int:
    from . import CliError

    try:
        parser = build_parser()
    except ModuleNotFoundError as e:
        raise CliError(f"the server needs {e.name}: pip install 'turboinfer-llama[server]'") from e
    from ..server.cli import serve

    return serve(parser.parse_args(args.server_args))
