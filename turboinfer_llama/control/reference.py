"""The default governor's rules, as a controller needs them: ``ShadowParams``.

tmpc once ran a shadow of the default governor, driven by its own model, as its
latency reference; near msm-adreno-tz's ramp-up threshold, and wherever the model had
to extrapolate to levels it had not run, the shadow misjudged the default by 3-34%
and tmpc overshot its budget (issue 13). Its reference is now the measured top-level
time (``tmpc.TubeMPC._reference_ns``). What stays here is the description of the
device's default governor (which one, its parameters, the clock it starts from), which
the controllers still read (ztt's state, tmpc's initial level).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShadowParams:
    """Governor rules. Defaults: governor_msm_adreno_tz.c / governor_simple_ondemand.c
    values from BRIEF.md; the tz ramp-up idle threshold and laziness are assumptions
    (TrustZone's step is closed source) shared with the simulator profile."""

    governor: str | None = "msm-adreno-tz"
    tz_call_interval_ns: int = 10_000_000
    tz_floor_ns: int = 5_000_000
    tz_min_busy_ns: int = 1_000_000
    tz_ceiling_ns: int = 50_000_000
    tz_ramp_up_idle_ns: int = 6_000_000
    tz_laziness: int = 5
    ondemand_up: int = 90
    ondemand_down: int = 5
    ondemand_polling_ns: int = 50_000_000
    initial_hz: int | None = None
    # the tunables above are the device's own (a profiled device), not defaults: only
    # then does tmpc bound the default's time by them (``control.default_bound``)
    rules_known: bool = False

    @classmethod
    def from_device(cls, device: object) -> ShadowParams:
        """Rules of ``device``'s default governor (its profile when it is simulated)."""
        gov = device.snapshot().governor  # type: ignore[attr-defined]
        p = getattr(device, "profile", None)
        if p is None:
            return cls(governor=gov, initial_hz=device.current_hz())  # type: ignore[attr-defined]
        return cls(
            governor=gov,
            tz_call_interval_ns=p.tz_call_interval_ns,
            tz_floor_ns=p.tz_floor_ns,
            tz_min_busy_ns=p.tz_min_busy_ns,
            tz_ceiling_ns=p.tz_ceiling_ns,
            tz_ramp_up_idle_ns=p.tz_ramp_up_idle_ns,
            tz_laziness=p.tz_laziness,
            ondemand_up=p.ondemand_up_threshold,
            ondemand_down=p.ondemand_down_differential,
            ondemand_polling_ns=p.ondemand_polling_ns,
            initial_hz=device.current_hz(),  # type: ignore[attr-defined]
            rules_known=True,
        )
