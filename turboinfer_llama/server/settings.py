"""Server settings: llama-cpp-python's settings classes plus every ``PowerSettings`` field.

The power fields are generated from ``PowerSettings``, so a new power option becomes a
server flag (``--latency-slack``) and config-file key automatically. Their environment
variables keep our ``TURBOINFER_`` prefix (``TURBOINFER_DEVICE``), while llama-cpp-python's
own fields keep theirs (``MODEL``, ``N_CTX``, ``HOST``, ``API_KEY``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from ..settings import PowerSettings
from .adapter import ModelSettings, ServerSettings

POWER_ENV_PREFIX = "TURBOINFER_"
# About 10 gemma-3-270m tokens at graph granularity (~800 node events per token).
SERVER_TIMELINE_MAX_EVENTS = 8_192

_POWER_SAVING = Field(
    default=True,
    description="Power saving: watch the engine and control the GPU clock. False serves "
    "plain llama-cpp-python (no hooks installed).",
)

PowerFields: type[BaseSettings] = create_model(  # type: ignore[call-overload]
    "PowerFields",
    __base__=BaseSettings,
    power_saving=(bool, _POWER_SAVING),
    **{name: (info.annotation, info) for name, info in PowerSettings.model_fields.items()},
)

POWER_FIELD_NAMES: frozenset[str] = frozenset(PowerFields.model_fields)


class _EnvSubset(EnvSettingsSource):
    """Environment variables for only some fields (the power fields, or all the others)."""

    def __init__(self, settings_cls: type[BaseSettings], prefix: str, power: bool) -> None:
        super().__init__(settings_cls, env_prefix=prefix)
        self._power = power

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if (field_name in POWER_FIELD_NAMES) != self._power:
            return None, field_name, False
        return super().get_field_value(field, field_name)


class TurboModelSettings(ModelSettings, PowerFields):  # type: ignore[misc, valid-type]
    """One served model: llama-cpp-python's model settings plus the power settings."""

    timeline_max_events: int = Field(
        default=SERVER_TIMELINE_MAX_EVENTS,
        gt=0,
        description=str(PowerSettings.model_fields["timeline_max_events"].description)
        + " A server keeps a small window by default, so its memory stays flat.",
    )

    device: str = Field(
        default="auto",
        description=str(PowerSettings.model_fields["device"].description)
        + " 'auto' uses a real GPU when one is controllable and otherwise the "
        "simulator (logged, and every figure is labelled simulated).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            _EnvSubset(settings_cls, POWER_ENV_PREFIX, power=True),
            _EnvSubset(settings_cls, "", power=False),
            dotenv_settings,
            file_secret_settings,
        )

    def power_settings(self) -> PowerSettings:
        """The ``PowerSettings`` for this model's ``Llama``."""
        return PowerSettings.model_validate(
            {name: getattr(self, name) for name in PowerSettings.model_fields}
        )


class TurboServerSettings(ServerSettings):
    """llama-cpp-python's server settings, bound to loopback unless told otherwise."""

    host: str = Field(
        default="127.0.0.1",
        description="Listen address. Loopback by default; use 0.0.0.0 only together "
        "with --api-key on a trusted network.",
    )
    max_request_bytes: int = Field(
        default=8 << 20,
        gt=0,
        description="Largest request body accepted; bigger ones get 413.",
    )
    interrupt_requests: bool = Field(
        default=False,
        description="False (default): concurrent requests queue for the model and every "
        "stream runs to its end. True (llama-cpp-python's default): a new request "
        "interrupts the running stream, which then ends with an explicit error event "
        "(code request_interrupted), never a silently truncated body.",
    )
    strict_model: bool = Field(
        default=False,
        description="False (default, as llama-cpp-python): any model name is served by "
        "the loaded model. True: an unknown model name gets 404 model_not_found.",
    )
    heap_freeze_s: float = Field(
        default=0.0,
        ge=0.0,
        description="0 (default): once the model is loaded, move the startup heap "
        "(modules, models, ~110k objects) into Python's permanent GC generation, so a "
        "full garbage collection (which holds the GIL) never walks it. > 0: also every "
        "this many seconds, everything that survived; garbage cycles among them are then "
        "reclaimed only once the server is quiet, so memory grows under sustained load.",
    )


class TurboSettings(TurboServerSettings, TurboModelSettings):
    """Everything a one-model server takes: the CLI flags and environment variables."""


class TurboConfigFileSettings(TurboServerSettings):
    """The ``--config-file`` format: server settings plus a list of models."""

    models: list[TurboModelSettings] = Field(default=[], description="Model configs")
