"""``turboinfer serve`` / ``python -m turboinfer_llama.server``: flags, settings, uvicorn.

The flags are llama-cpp-python's (made from its settings classes by its own helper)
plus the power settings, each spelled with hyphens or underscores (``--n-ctx`` and
``--n_ctx``). Boolean flags need no value: ``--power-saving`` means true,
``--power-saving false`` turns power saving off.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from ..commands import CliError
from ..devices import DeviceError, parse_spec
from . import adapter, telemetry
from .settings import (
    TurboConfigFileSettings,
    TurboModelSettings,
    TurboServerSettings,
    TurboSettings,
)

log = logging.getLogger("turboinfer_llama.server")

S = TypeVar("S", bound=BaseModel)


class _BothSpellings:
    """Passed to llama-cpp-python's ``add_args_from_model`` in place of the parser."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser

    def add_argument(self, flag: str, **kwargs: Any) -> argparse.Action:
        if getattr(kwargs.get("type"), "__name__", "") == "_parse_bool_arg":
            kwargs.update(nargs="?", const=True, metavar="BOOL")
        if kwargs.get("help"):
            kwargs["help"] = kwargs["help"].replace("%", "%%")
        flags = dict.fromkeys((flag.replace("_", "-"), flag))
        return self._parser.add_argument(*flags, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    adapter.add_args_from_model(_BothSpellings(parser), TurboSettings)  # type: ignore[arg-type]
    parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        help="JSON or YAML file with server settings and a list of models (each may carry "
        "the power settings). Also read from the CONFIG_FILE environment variable.",
    )
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")


def _one_line(e: ValidationError) -> str:
    return "; ".join(
        f"--{'.'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}"
        for err in e.errors(include_url=False)
    )


def _parse(cls: type[S], args: argparse.Namespace) -> S:
    # llama-cpp-python annotates its helper as returning the class; it returns an instance.
    return cast(S, adapter.parse_model_from_args(cls, args))  # type: ignore[type-var]


def _from_config_file(path: str) -> tuple[TurboServerSettings, list[TurboModelSettings]]:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"config file not found: {path}")
    text = p.read_text(encoding="utf-8")
    if p.suffix in (".yaml", ".yml"):
        import yaml

        text = json.dumps(yaml.safe_load(text))
    cfg = TurboConfigFileSettings.model_validate_json(text)
    if not cfg.models:
        raise CliError(f"config file {path} lists no models")
    return TurboServerSettings.model_validate(cfg.model_dump(exclude={"models"})), cfg.models


def settings_from_args(
    args: argparse.Namespace,
) -> tuple[TurboServerSettings, list[TurboModelSettings]]:
    """Server and model settings from flags, environment and an optional config file."""
    # llama-cpp-python's create_app would re-read CONFIG_FILE with its own classes
    # (which reject the power fields), so it is consumed here.
    config_file = os.environ.pop("CONFIG_FILE", None) or getattr(args, "config_file", None)
    try:
        if config_file:
            server, models = _from_config_file(config_file)
        else:
            server = _parse(TurboServerSettings, args)
            models = [_parse(TurboModelSettings, args)]
    except ValidationError as e:
        raise CliError(f"invalid settings: {_one_line(e)}") from e
    for m in models:
        if m.hf_model_repo_id is None and not Path(m.model).is_file():
            raise CliError(f"model file not found: {m.model} (pass --model PATH to a .gguf file)")
        try:
            parse_spec(m.device)
        except DeviceError as e:
            raise CliError(str(e)) from e
    return server, models


def _log_power(default: TurboModelSettings) -> None:
    alias, llm = adapter.loaded_model()
    power = getattr(llm, "power", None)
    if power is None:
        log.info("model %s: power saving off (plain llama-cpp-python)", alias)
        return
    r = telemetry.power_report(power)
    dev, ctl = r["device"], r["controller"]
    where = "simulated GPU" if r["simulated"] else "real GPU" if r["simulated"] is False else "GPU"
    log.info(
        "model %s: power saving on, %s %s (--device %s), controller %s",
        alias,
        where,
        dev["name"] or "(none opened)",
        default.device,
        ctl["name"],
    )


def serve(args: argparse.Namespace) -> int:
    """Load the model(s) and serve until SIGTERM/SIGINT; the GPU is restored on the way out."""
    import uvicorn

    from .app import create_app

    # A server reports its start, its model and its requests; the CLI's default is quieter.
    log.setLevel(logging.DEBUG if getattr(args, "debug", False) else logging.INFO)
    server_settings, models = settings_from_args(args)
    try:
        app = create_app(server_settings, models)
    except DeviceError as e:
        raise CliError(f"GPU device: {e}") from e
    except ValueError as e:
        raise CliError(f"could not load the model: {e}") from e
    _log_power(models[0])
    if (
        server_settings.host not in ("127.0.0.1", "localhost", "::1")
        and not server_settings.api_key
    ):
        log.warning(
            "listening on %s without --api-key: anyone who can reach it can use it",
            server_settings.host,
        )
    config = uvicorn.Config(
        app,
        host=server_settings.host,
        port=server_settings.port,
        ssl_keyfile=server_settings.ssl_keyfile,
        ssl_certfile=server_settings.ssl_certfile,
        log_level="debug" if getattr(args, "debug", False) else "info",
    )
    try:
        uvicorn.Server(config).run()
    finally:
        adapter.free_models()
    return 0
