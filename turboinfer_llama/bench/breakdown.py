"""Where each controller's saving comes from, request by request (simulated).

    python -m turboinfer_llama.bench.breakdown --replay REC [--device sim:generic]
        [--latency-slack 0.02] [--controllers default,tmpc,phase] [--granularity graph]
        [--param KEY=VALUE ...] [--hindsight-reference] [--json PATH]

``turboinfer bench`` reports a run's figures pooled over its requests. Two controllers
can end a run at the same saving for different reasons: one loses on the first
request (nothing learnt yet), another on a long prompt. This replays each controller
on the simulated device (``SimGpu(record_intervals=True)``) and splits its energy and
time by request and phase:

* each request's prompt (prefill) and decode: time and energy, and its TTFT and TPOT;
* the decode's busy time at each clock level;
* each figure's difference to the default's same request.

``--hindsight-reference`` adds a diagnostic row, ``tmpc@hindsight-reference``: tmpc
given the default's own time of each decode graph (from the default's replay) as its
decode reference, in place of what it keeps its promise against live (the top
level's time, or the default's bound). The hindsight baselines set their levels
against that one run of the default; tmpc does not know it, so it keeps its budget
against every run the default could have made (every timer phase, every busy share
its model cannot rule out). The gap between the two rows is what that costs; the gap
from this row to a baseline is what the plans leave. The prompts keep their own
references. Never a live mode.

A request begins at its prompt's first prefill interval; the idle time between
requests is in no request (the total's ``idle`` figure). Every figure is simulated
(the simulator's power model, no phone). The offline controllers (the hindsight
baselines and the oracles) are figured by their own accounting on the recording
device, as ``turboinfer bench`` figures them: replayed as event-driven controllers,
the oracle's step-anchored schedule would not be what it chose. A benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..control.factory import for_device, make_controller
from ..control.registry import info
from ..control.replay import replay
from ..devices.base import DeviceError
from ..engine.segments import Segment
from ..trace.record import load_trace
from . import sweep
from .runner import _open_sim, segments_of

DEFAULT_CONTROLLERS = ("default", "tmpc", "phase")


def _requests(intervals: Sequence[tuple]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each request's prefill and decode figures from the device's intervals
    ``(t_ns, dur_ns, hz, state, phase, energy_j)``, and the time and energy in none."""
    reqs: list[dict[str, Any]] = []
    outside = {"ms": 0.0, "j": 0.0}
    prev = None
    for _t, dur, hz, state, phase, e in intervals:
        if phase == "prefill" and prev != "prefill":
            reqs.append(
                {
                    "prefill_ms": 0.0,
                    "prefill_j": 0.0,
                    "decode_ms": 0.0,
                    "decode_j": 0.0,
                    "decode_busy_ms_by_mhz": collections.Counter(),
                }
            )
        prev = phase
        if not reqs or phase not in ("prefill", "decode"):
            outside["ms"] += dur / 1e6
            outside["j"] += e
            continue
        r = reqs[-1]
        r[f"{phase}_ms"] += dur / 1e6
        r[f"{phase}_j"] += e
        if phase == "decode" and state == "busy":
            r["decode_busy_ms_by_mhz"][round(hz / 1e6)] += dur / 1e6
    for r in reqs:
        r["decode_busy_ms_by_mhz"] = dict(sorted(r["decode_busy_ms_by_mhz"].items()))
    return reqs, outside


def _devices(
    segments: list[Segment], device: str, latency_slack: float, params: dict[str, Any] | None
) -> tuple[list[Segment], Callable[..., Any], dict[str, Any] | None]:
    """The phone trace, a factory of fresh simulated devices (built as ``turboinfer
    sweep`` builds its points': without ``params``, its nominal point, the device
    ``turboinfer bench`` replays on), and the sweep point's parameters in full (None
    without ``params``)."""
    if device != "sim" and not device.startswith("sim:"):
        raise ValueError(f"{device!r}: the breakdown replays on a simulated device (sim:...)")
    dev = _open_sim(device)  # an unknown profile: DeviceNotFound, before any replay
    profile = dev.profile
    dev.close()
    full = sweep.nominal(profile)
    unknown = sorted(set(params or ()) - set(full))
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; choose from {sorted(full)}")
    full.update(params or {})
    point = sweep.Point(device.partition(":")[2] or profile.name, latency_slack, "breakdown", full)
    phone, factory = sweep.point_device(point, segments)
    return phone, factory, full if params is not None else None


HINDSIGHT = "tmpc@hindsight-reference"  # the diagnostic row's name (--hindsight-reference)


def breakdown(
    segments: list[Segment],
    device: str,
    controllers: Sequence[str] = DEFAULT_CONTROLLERS,
    *,
    latency_slack: float = 0.02,
    granularity: str = "graph",
    params: dict[str, Any] | None = None,
    hindsight_reference: bool = False,
) -> dict[str, Any]:
    """Each controller's replay of the recorded ``segments`` on ``device`` (a
    simulated one: ``sim:<profile>`` or ``sim:/path/profile.json``), split by request
    and phase. Also each request's differences to ``default``'s, where it ran.
    ``params``: a ``turboinfer sweep`` point's parameters (``bench.sweep``; the
    profile's own for those not given), for the device the sweep builds there.
    ``hindsight_reference``: also tmpc with the default's own time of each decode graph
    as its reference (``TubeMPC.hindsight_reference_ns``, row ``HINDSIGHT``): a
    diagnostic of what keeping the budget without knowing the default's run costs
    (the gap between the two rows) and what the plans leave (the rest)."""
    phone, factory, full = _devices(segments, device, latency_slack, params)
    out: dict[str, Any] = {}
    graph_ns: dict[int, int] | None = None
    names = list(controllers)
    if hindsight_reference:
        names.append(HINDSIGHT)
        if "default" not in names:
            names.insert(0, "default")
    for name in names:
        dev = factory(record_intervals=True)
        ctl: Any = make_controller(
            "tmpc" if name == HINDSIGHT else name,
            **for_device(dev),
            latency_slack=latency_slack,
            trace=phone,
            device_factory=factory,
            seed=0,
        )
        if name == HINDSIGHT:
            assert graph_ns is not None  # the default ran first
            decode = {s.graph for s in phone if s.phase == "decode"}
            ctl.hindsight_reference_ns = {g: float(t) for g, t in graph_ns.items() if g in decode}
        got_info = info(name)
        res: Any
        if got_info is not None and got_info.offline:
            # its schedule as it chose it, on this device (as ``turboinfer bench``)
            res = ctl.account(dev)
        else:
            res = replay(phone, ctl, dev, seed=0, granularity=granularity)
            if name == "default":
                graph_ns = res.graph_compute_ns
        reqs, outside = _requests(dev.intervals)
        for r, q in zip(reqs, res.requests_latency, strict=False):
            r["ttft_ms"] = q.ttft_ns / 1e6
            r["tpot_ms"] = None if math.isnan(q.tpot_ns) else q.tpot_ns / 1e6
        out[name] = {
            "energy_j": res.energy_j,
            "ttft_ms": res.ttft_ms,
            "tpot_ms": res.tpot_ms,
            "idle_ms": outside["ms"],
            "idle_j": outside["j"],
            "requests": reqs,
        }
    base = out.get("default")
    if base is not None:
        for got in out.values():
            if len(got["requests"]) != len(base["requests"]):
                continue
            for r, b in zip(got["requests"], base["requests"], strict=True):
                r["prefill_j_vs_default"] = r["prefill_j"] - b["prefill_j"]
                r["decode_j_vs_default"] = r["decode_j"] - b["decode_j"]
    return {
        "simulated": True,
        "device": device,
        "sweep_params": full,
        "latency_slack": latency_slack,
        "granularity": granularity,
        "controllers": out,
    }


def _lines(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"device {doc['device']}, slack {doc['latency_slack']:.0%}, "
        f"{doc['granularity']} granularity (all figures simulated)"
    ]
    if doc.get("sweep_params"):
        lines.append("sweep point: " + json.dumps(doc["sweep_params"]))
    base = doc["controllers"].get("default")
    for name, got in doc["controllers"].items():
        saving = (
            f", saving {1 - got['energy_j'] / base['energy_j']:+.1%}"
            if base is not None and name != "default" and base["energy_j"]
            else ""
        )
        lines.append(
            f"{name}: {got['energy_j']:.3f} J (simulated){saving}, TTFT {got['ttft_ms']:.1f} ms, "
            f"TPOT {got['tpot_ms']:.2f} ms; between requests {got['idle_ms']:.0f} ms "
            f"{got['idle_j']:.3f} J"
        )
        for i, r in enumerate(got["requests"], 1):
            vs = ""
            if "decode_j_vs_default" in r and name != "default":
                vs = (
                    f"  vs default: prefill {r['prefill_j_vs_default']:+.3f} J, "
                    f"decode {r['decode_j_vs_default']:+.3f} J"
                )
            levels = " ".join(f"{mhz}:{ms:.0f}" for mhz, ms in r["decode_busy_ms_by_mhz"].items())
            tpot = "-" if r.get("tpot_ms") is None else f"{r['tpot_ms']:.2f}"
            lines.append(
                f"  request {i}: prefill {r['prefill_ms']:.1f} ms {r['prefill_j']:.3f} J, "
                f"decode {r['decode_ms']:.1f} ms {r['decode_j']:.3f} J, "
                f"TTFT {r.get('ttft_ms', float('nan')):.1f} ms, TPOT {tpot} ms{vs}"
            )
            lines.append(f"    decode busy ms by MHz: {levels}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", required=True, help="recorded trace (turboinfer bench --record)")
    ap.add_argument("--device", default="sim:adreno650", help="sim:<profile> or sim:/path.json")
    ap.add_argument("--latency-slack", type=float, default=0.02)
    ap.add_argument("--controllers", default=",".join(DEFAULT_CONTROLLERS))
    ap.add_argument("--granularity", default="graph", choices=("graph", "layer", "kernel"))
    ap.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a turboinfer sweep point's parameter (e.g. switch_latency_us=80000); repeatable",
    )
    ap.add_argument(
        "--hindsight-reference",
        action="store_true",
        help=f"also {HINDSIGHT}: tmpc with the default's own decode graph times as its "
        "reference, a diagnostic of what its promise costs (never a live mode)",
    )
    ap.add_argument("--json", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    params: dict[str, Any] = {}
    for kv in args.param:
        key, eq, value = kv.partition("=")
        if not eq:
            ap.error(f"--param {kv!r}: expected KEY=VALUE")
        flag = {"true": True, "false": False}.get(value.lower())
        try:
            params[key.strip()] = float(value) if flag is None else flag
        except ValueError:
            ap.error(f"--param {kv!r}: the value must be a number, true or false")
    names = [c.strip() for c in args.controllers.split(",") if c.strip()]
    if not names:
        ap.error("--controllers names none")
    try:
        events, _ = load_trace(args.replay)
        doc = breakdown(
            segments_of(events),
            args.device,
            names,
            latency_slack=args.latency_slack,
            granularity=args.granularity,
            params=params or None,
            hindsight_reference=args.hindsight_reference,
        )
    except (OSError, ValueError, DeviceError) as e:  # TraceFormatError is a ValueError
        ap.error(str(e))
    print("\n".join(_lines(doc)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
