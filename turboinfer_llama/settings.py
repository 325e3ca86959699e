"""PowerSettings: every power-saving option, as a pydantic-settings class.

Each field has a description, so the server and CLI get flags and ``TURBOINFER_*``
environment variables for free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .control.registry import info, names

Granularity = Literal["graph", "layer", "kernel"]
GRANULARITIES: tuple[str, ...] = ("graph", "layer", "kernel")
# Live controllers (from the registry); "none" observes only. The offline ones
# (oracle, static-best, phase) are benchmark baselines.
LIVE_CONTROLLERS: tuple[str, ...] = names(live=True)


class PowerSettings(BaseSettings):
    """Power-saving settings. Env vars: ``TURBOINFER_<FIELD>`` (e.g. TURBOINFER_DEVICE)."""

    model_config = SettingsConfigDict(env_prefix="TURBOINFER_", extra="forbid")

    granularity: Granularity = Field(
        default="graph",
        description=(
            "How closely the eval hook watches llama.cpp: 'graph' scans node order only "
            "and never forces a sync (lowest overhead); 'layer' syncs at each layer's "
            "output node; 'kernel' syncs at every node, giving per-kernel completion times."
        ),
    )
    ring_capacity: int = Field(
        default=8192,
        gt=0,
        description="Slots in the hook's lock-free ring buffer; when full, records are "
        "counted as overflow and dropped, never blocking the engine.",
    )
    device: str = Field(
        default="sim:adreno650",
        description="GPU to act on: sim[:profile], devfreq[:name-or-path], kgsl, "
        "kmod[:/dev/turboinfer], adb[:serial] or auto.",
    )
    controller: str = Field(
        default="tmpc",
        description="Frequency policy: "
        + ", ".join(LIVE_CONTROLLERS)
        + " (none: observe only, no device is opened).",
    )
    latency_slack: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Allowed latency increase over the default governor, as a fraction "
        "(0.02 = 2%).",
    )
    allow_cpu: bool = Field(
        default=False,
        description="Run even when the model is on the CPU while a real local GPU "
        "(kgsl, devfreq, kmod) is steered: a warning instead of an error. On such "
        "devices every layer is offloaded unless n_gpu_layers says otherwise.",
    )
    timeline_max_events: int = Field(
        default=2_000_000,
        gt=0,
        description="Events (and segments) the timeline keeps in memory: a bounded window, "
        "oldest dropped first, while totals keep counting. Segments not yet accounted for "
        "are never dropped. record() and export_trace() cover this retained window.",
    )
    timeline_window_s: float = Field(
        default=0.0,
        ge=0.0,
        description="If > 0, the timeline also drops events older than this many seconds "
        "before the newest one (0: bounded by timeline_max_events only).",
    )
    native_hooks: bool = Field(
        default=True,
        description="Use the compiled C hook library when available; False forces the "
        "pure-Python callback.",
    )
    replay_check: bool = Field(
        default=False,
        description="Simulated device only: also replay each finished request through a "
        "fresh controller (per-kernel, tens of ms of CPU per token while settling) and "
        "report its energy per token next to the live loop's applied energy "
        "(replay_energy_per_token_j, applied_energy_per_token_j; null when off).",
    )

    clock_standin: bool = Field(
        default=False,
        description="TESTS AND BENCHMARKS ONLY, never for real hardware: when the model "
        "runs on the host's CPU while a fake GPU (a devfreq/KGSL tree outside /sys, an "
        "adb fake) is steered, stretch each graph to the time it would take at the "
        "levels applied (its host time taken as the work at the top level). Refused "
        "for the simulated device, kmod, real sysfs files, and when a layer runs on a "
        "GPU.",
    )
    clock_standin_memory_share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="With clock_standin: the share of graph time that does not scale "
        "with the clock (memory-bound); 0 = compute-bound.",
    )

    @field_validator("controller")
    @classmethod
    def _known_controller(cls, v: str) -> str:
        c = info(v)
        if c is not None and c.live:
            return v
        raise ValueError(f"unknown controller {v!r}; valid: {', '.join(LIVE_CONTROLLERS)}")
