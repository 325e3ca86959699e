"""What the default governors do with the phone's host gaps (the issue-27191 question).

``python -m turboinfer_llama.bench.hostgaps REC [--profiles ..] [--cpu-scales ..]``
replays a recording (``turboinfer bench --record``) on each simulated profile under its
default governor and at the top level pinned, with the phone host model at several CPU
speeds, and prints the default governor's TPOT and TTFT against the top clock's, its
time-weighted mean clock during decode, and its switches. All figures are simulated.

In llama.cpp issue 27191 (Adreno 830, Vulkan) KGSL lowered the clock in the gaps
between submissions and holding it up gave 15-50% more tokens/s; a positive "TPOT vs
top" here is that effect in the simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..accounting import PhoneTrace, Switches, applied_energy, default_shadow
from ..devices.sim import SimGpu, list_profiles, load_profile


def rows(segments: list[Any], profiles: list[str], scales: list[float]) -> list[dict[str, Any]]:
    out = []
    for name in profiles:
        base = load_profile(name)
        for scale in scales:
            p = dataclasses.replace(base, host_cpu_factor=base.host_cpu_factor * scale)
            trace = PhoneTrace.build(segments, p)
            dev = SimGpu(p, record_intervals=True)
            d = default_shadow(trace, dev)
            top = applied_energy(trace, p, Switches.at_times([0], [p.levels_hz[-1]]))
            dec = [iv for iv in dev.intervals if iv[4] == "decode"]
            t = sum(iv[1] for iv in dec)
            mean_mhz = sum(iv[1] * iv[2] for iv in dec) / t / 1e6 if t else float("nan")
            out.append(
                {
                    "profile": name,
                    "host_cpu_factor": p.host_cpu_factor,
                    "governor": base.default_governor,
                    "tpot_vs_top": d.tpot_ms / top.tpot_ms - 1,
                    "ttft_vs_top": d.ttft_ms / top.ttft_ms - 1,
                    "decode_mean_mhz": mean_mhz,
                    "top_mhz": p.levels_hz[-1] / 1e6,
                    "switches": d.switches,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..trace.record import load_trace
    from .runner import segments_of

    ap = argparse.ArgumentParser(prog="python -m turboinfer_llama.bench.hostgaps")
    ap.add_argument("recording")
    ap.add_argument("--profiles", default=",".join(list_profiles()))
    ap.add_argument("--cpu-scales", default="0.5,1,2", help="times each profile's CPU factor")
    a = ap.parse_args(argv)
    events, _ = load_trace(a.recording)
    segs = segments_of(events)
    table = Table(title="default governor vs the top clock on the phone host model (simulated)")
    for col in ("profile", "governor", "CPU factor", "TPOT vs top", "TTFT vs top"):
        table.add_column(col)
    table.add_column("decode mean clock")
    table.add_column("switches")
    for r in rows(segs, a.profiles.split(","), [float(x) for x in a.cpu_scales.split(",")]):
        table.add_row(
            r["profile"],
            str(r["governor"]),
            f"{r['host_cpu_factor']:.2g}x",
            f"{r['tpot_vs_top']:+.1%}",
            f"{r['ttft_vs_top']:+.1%}",
            f"{r['decode_mean_mhz']:.0f} / {r['top_mhz']:.0f} MHz",
            str(r["switches"]),
        )
    Console(width=140).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
