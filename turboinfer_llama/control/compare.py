"""Replay one trace through several controllers and compare them with ``default``.

All figures are simulated. ``oracle_fraction`` is a controller's energy saving over
``default`` divided by the oracle's saving (same trace, same latency budget).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engine.segments import Segment
from .factory import for_device, make_controller
from .registry import all_set
from .replay import ReplayResult, replay

DEFAULT_SET: tuple[str, ...] = all_set()


def compare(
    segments: Sequence[Segment],
    device_factory: Callable[[], Any],
    *,
    names: Sequence[str] = DEFAULT_SET,
    latency_slack: float = 0.02,
    seed: int = 0,
    ztt_episodes: int = 3,
    host_model: bool = True,
) -> dict[str, dict[str, Any]]:
    """Figures per controller: energy per token, TTFT, TPOT, saving and latency change
    vs ``default``, fraction of the oracle's saving. ``ztt`` first trains for
    ``ztt_episodes - 1`` replays (its Q table carries over), then is measured. With
    ``host_model`` (and a simulated device), the recorded segments first go through
    the phone host model (``accounting.phone_segments``), as the benchmark does."""
    profile = getattr(device_factory(), "profile", None)
    if host_model and profile is not None:
        from ..accounting import phone_segments

        segments = phone_segments(segments, profile)
    results: dict[str, ReplayResult] = {}
    for name in ("default", *[n for n in names if n != "default"]):
        kw = for_device(device_factory())
        ctl = make_controller(
            name,
            latency_slack=latency_slack,
            trace=segments,
            device_factory=device_factory,
            seed=seed,
            **kw,
        )
        if name == "ztt":
            for episode in range(ztt_episodes - 1):
                replay(segments, ctl, device_factory(), seed=seed + 1000 + episode)
        results[name] = replay(segments, ctl, device_factory(), seed=seed)
    base = results["default"]
    oracle = results.get("oracle")
    oracle_saving = 1.0 - oracle.energy_j / base.energy_j if oracle else None
    out: dict[str, dict[str, Any]] = {}
    for name, r in results.items():
        saving = 1.0 - r.energy_j / base.energy_j
        row = r.summary()
        row.update(
            saving_pct=round(100 * saving, 2),
            tpot_change_pct=round(100 * (r.tpot_ms / base.tpot_ms - 1.0), 2),
            ttft_change_pct=round(100 * (r.ttft_ms / base.ttft_ms - 1.0), 2),
            duration_change_pct=round(100 * (r.duration_s / base.duration_s - 1.0), 2),
            oracle_fraction=(
                round(saving / oracle_saving, 3) if oracle_saving and oracle_saving > 0 else None
            ),
        )
        out[name] = row
    return out
