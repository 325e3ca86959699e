"""Read a model's power figures for ``/v1/power``, ``/metrics`` and the energy headers.

Everything comes from ``PowerSession.stats(settle=False)``: the figures the session's
worker has already derived and settled, read at once. Nothing here decodes, replays or
waits (the request path and these endpoints never pay for accounting). Keys that the
session does not report come back as None, never as an error. Keys read, first one
present wins:

* device:     ``energy.device`` | ``device.name`` | ``device`` (a string),
              ``energy.simulated`` | ``device.simulated`` | ``simulated``,
              ``energy.current_hz`` | ``device.freq_hz`` | ``freq_hz``,
              ``energy.avg_power_w`` | ``device.power_w`` | ``power_w``, ``energy.source``
* controller: ``energy.controller`` | ``controller.name`` | ``controller`` (a string),
              ``energy.health.ok`` | ``energy.health.healthy`` | ``controller.healthy``,
              ``energy.health.last_error`` | ``controller.last_error``,
              ``energy.switches`` | ``controller.switches`` | ``switches``
* energy:     ``energy.energy_j`` | ``energy`` (a number) | ``energy_j``,
              ``energy.default_energy_j`` | ``energy.baseline_j``, ``energy.saved_j``
              (else baseline - energy), ``energy.saving_fraction``,
              ``energy.energy_per_token_j``, ``energy.recent_requests`` (a list)
* counts:     ``requests``, ``tokens``, ``in_flight`` | ``events.request_begin`` -
              ``events.request_end``,
              ``stalls``, ``hook``
* settling:   ``energy.accounting`` (settled requests, unsettled segments, CPU ms per
              token), ``timeline`` (the retained window)
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _get(d: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _first(d: Any, *paths: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    """The first value at ``paths`` of type ``kind`` (a bool never counts as a number)."""
    for path in paths:
        v = _get(d, path)
        if isinstance(v, kind) and (kind is bool or not isinstance(v, bool)):
            return v
    return None


def stats_of(power: Any) -> tuple[dict[str, Any], str | None]:
    """``power.stats(settle=False)`` and None, or ({}, the error) if it could not be read."""
    if power is None:
        return {}, None
    try:
        st = power.stats(settle=False)
    except Exception as e:  # telemetry must never take the server down
        log.warning("power stats unavailable: %s", e)
        return {}, f"{type(e).__name__}: {e}"
    return (st if isinstance(st, dict) else {}), None


def energy_reading(
    power: Any, st: dict[str, Any] | None = None
) -> tuple[float | None, bool | None]:
    """(energy so far in J or None, simulated or None) for one session."""
    if power is None:
        return None, None
    if st is None:
        st, _ = stats_of(power)
    energy = _first(st, "energy.energy_j", "energy", "energy_j")
    simulated = _first(st, "energy.simulated", "device.simulated", "simulated", kind=bool)
    return (float(energy) if energy is not None else None), simulated


def _open_requests(st: dict[str, Any]) -> int | None:
    live = _first(st, "in_flight", kind=int)
    if live is not None:
        return live
    begun = _first(st, "events.request_begin", kind=int)
    if begun is None:
        return None
    return begun - (_first(st, "events.request_end", kind=int) or 0)


def power_report(power: Any) -> dict[str, Any]:
    """The device/controller/energy part of ``/v1/power`` for one session (or None)."""
    settings = getattr(power, "settings", None)
    st, error = stats_of(power)
    energy_j, simulated = energy_reading(power, st)
    baseline_j = _first(st, "energy.default_energy_j", "energy.baseline_j")
    saved_j = _first(st, "energy.saved_j")
    if saved_j is None and baseline_j is not None and energy_j is not None:
        saved_j = baseline_j - energy_j
    saved_fraction = _first(st, "energy.saving_fraction")
    if saved_fraction is None and saved_j is not None and baseline_j:
        saved_fraction = saved_j / baseline_j
    last_error = _first(st, "energy.health.last_error", "controller.last_error", kind=str)
    return {
        "simulated": simulated,
        "device": {
            "spec": getattr(settings, "device", None),
            "name": _first(st, "energy.device", "device.name", "device", kind=str),
            "simulated": simulated,
            "source": _first(st, "energy.source", kind=str),
            "freq_hz": _first(st, "energy.current_hz", "device.freq_hz", "freq_hz"),
            "avg_power_w": _first(st, "energy.avg_power_w", "device.power_w", "power_w"),
        },
        "controller": {
            "name": _first(st, "energy.controller", "controller.name", "controller", kind=str)
            or getattr(settings, "controller", None),
            "latency_slack": getattr(settings, "latency_slack", None),
            "healthy": _first(
                st, "energy.health.ok", "energy.health.healthy", "controller.healthy", kind=bool
            ),
            "last_error": last_error or error,
            "switches": _first(st, "energy.switches", "controller.switches", "switches", kind=int),
        },
        "energy": {
            "energy_j": energy_j,
            "baseline_j": baseline_j,
            "saved_j": saved_j,
            "saved_fraction": saved_fraction,
            "baseline": "default-governor estimate",
            "energy_per_token_j": _first(st, "energy.energy_per_token_j"),
            "recent_requests": _first(st, "energy.recent_requests", kind=list),
            "simulated": simulated,
        },
        "tokens": _first(st, "tokens", kind=int),
        "requests": _first(st, "requests", kind=int),
        "open_requests": _open_requests(st),
        "stalls": st.get("stalls"),
        "hook": st.get("hook"),
        "accounting": _get(st, "energy.accounting"),
        "timeline": st.get("timeline"),
        "stats_error": error,
    }
