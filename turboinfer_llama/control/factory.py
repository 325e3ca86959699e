"""``make_controller``: every policy and baseline by name, behind one interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..devices.base import InvalidFrequency, snap_hz
from ..engine.segments import Segment
from .base import Controller
from .model import PowerTable
from .reference import ShadowParams
from .registry import is_offline, replayable

# every name make_controller builds (from the registry; ``none`` opens no controller)
CONTROLLER_NAMES: tuple[str, ...] = replayable()


def make_controller(
    name: str,
    *,
    device_levels_hz: list[int],
    latency_slack: float = 0.02,
    switch_latency_ns: int = 500_000,
    power: PowerTable | None = None,
    shadow: ShadowParams | None = None,
    trace: Sequence[Segment] | None = None,
    device_factory: Any = None,
    horizon: int = 5,
    seed: int = 0,
    oracle_refine: int = 8,
    clock_coupled: bool = True,
    submit_batch_nodes: int | None = None,
) -> Controller:
    """Build a controller. ``power``/``shadow`` describe the device (power per level,
    its default governor's rules; see ``for_device``). The offline ones (``oracle``,
    ``static-best``, ``phase``) need ``trace`` (the whole run, as replay will run it)
    and ``device_factory`` (a fresh simulator per call). ``clock_coupled`` False: the
    graph times the controller will measure do not follow the clock it sets (the
    simulated device, live; ``TubeMPC.clock_coupled``). ``submit_batch_nodes``: the
    engine backend's kernels per submission, where the device knows
    (``Capabilities.submit_batch_nodes``; tmpc places a graph's host time there)."""
    levels = sorted(int(h) for h in device_levels_hz)
    if not levels:
        raise ValueError("device_levels_hz is empty")
    power = power or PowerTable.assumed(levels)
    if name == "default":
        from .baselines.simple import DefaultGovernor

        return DefaultGovernor()
    if name == "max":
        from .baselines.simple import Static

        return Static(levels[-1], name="max")
    if name.startswith("static:"):
        from .baselines.simple import Static

        raw = name.partition(":")[2]
        try:
            hz = int(float(raw))
        except ValueError:
            raise ValueError(f"static:<hz> needs a number of Hz, got {raw!r}") from None
        if hz not in levels:
            table = ", ".join(str(h) for h in levels)
            raise InvalidFrequency(
                f"{hz} Hz is not a level of this device (nearest {snap_hz(levels, hz)}); "
                f"levels: {table}"
            )
        return Static(hz)
    if name == "reactive":
        from .baselines.reactive import Reactive

        return Reactive(levels)
    if name == "tmpc":
        from .tmpc import TubeMPC

        return TubeMPC(
            levels,
            latency_slack=latency_slack,
            switch_latency_ns=switch_latency_ns,
            power=power,
            shadow=shadow,
            horizon=horizon,
            clock_coupled=clock_coupled,
            submit_batch_nodes=submit_batch_nodes,
        )
    if name == "ztt":
        from .baselines.ztt import ZttQLearning

        return ZttQLearning(
            levels, power=power, shadow=shadow, latency_slack=latency_slack, seed=seed
        )
    if is_offline(name):
        if trace is None or device_factory is None:
            raise ValueError(
                f"{name} is offline: it needs trace= (the whole recorded run) "
                "and device_factory= (a fresh simulator)"
            )
        if name in ("oracle", "oracle-request"):
            from .baselines.oracle import Oracle

            return Oracle(
                trace,
                device_factory,
                latency_slack=latency_slack,
                refine=oracle_refine,
                per_request_ttft=name == "oracle-request",
            )
        from .baselines.hindsight import PhaseSplit, StaticBest

        if name == "static-best":
            return StaticBest(trace, device_factory, latency_slack=latency_slack)
        return PhaseSplit(
            trace,
            device_factory,
            latency_slack=latency_slack,
            per_request_ttft=name == "phase-request",
            prefix=name == "phase-prefix",
        )
    raise ValueError(f"unknown controller {name!r}; valid names: {', '.join(CONTROLLER_NAMES)}")


def for_device(device: Any) -> dict[str, Any]:
    """Keyword arguments describing ``device`` for ``make_controller``: its levels,
    switch latency, power table and default governor's rules."""
    return {
        "device_levels_hz": device.frequencies_hz(),
        "switch_latency_ns": device.capabilities.switch_latency_ns,
        "power": PowerTable.from_device(device),
        "shadow": ShadowParams.from_device(device),
        "submit_batch_nodes": device.capabilities.submit_batch_nodes,
    }
