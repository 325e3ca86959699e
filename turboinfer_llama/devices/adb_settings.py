"""AdbSettings: where the adb server is, timeouts, and where per-phone state is kept."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "turboinfer" / "android"


class AdbSettings(BaseSettings):
    """Env vars: ``TURBOINFER_ADB_<FIELD>`` (e.g. TURBOINFER_ADB_SERVER=127.0.0.1:5037)."""

    model_config = SettingsConfigDict(env_prefix="TURBOINFER_ADB_", extra="forbid")

    server: str = Field(
        default="",
        description="host:port of the adb server. Empty: ANDROID_ADB_SERVER_HOST and "
        "ANDROID_ADB_SERVER_PORT (as adb itself reads them), else 127.0.0.1:5037.",
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest wait for any one answer from the phone; past it the phone "
        "counts as gone (DeviceGone), so an unplugged cable never hangs a run.",
    )
    rtt_samples: int = Field(
        default=9,
        ge=1,
        description="Actuation round-trips timed at open; the median is reported as the "
        "device's switch latency.",
    )
    sample_period_s: float = Field(
        default=0.1,
        gt=0,
        description="Fuel-gauge sampling period of the loop that runs on the phone.",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where per-phone state is kept: fuel-gauge calibrations and the GPU "
        "state to restore after a lost connection (one JSON file per serial).",
    )

    def server_address(self) -> tuple[str, int]:
        """(host, port) of the adb server."""
        if self.server:
            host, sep, port = self.server.rpartition(":")
            if not sep or not port.isdigit():
                raise ValueError(
                    f"TURBOINFER_ADB_SERVER={self.server!r}: expected host:port, "
                    "e.g. 127.0.0.1:5037"
                )
            return host or "127.0.0.1", int(port)
        host = os.environ.get("ANDROID_ADB_SERVER_HOST") or "127.0.0.1"
        port = os.environ.get("ANDROID_ADB_SERVER_PORT") or "5037"
        if not port.isdigit():
            raise ValueError(f"ANDROID_ADB_SERVER_PORT={port!r} is not a port number")
        return host, int(port)
