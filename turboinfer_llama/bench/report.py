"""Benchmark output: the rich table, CSV, and the Perfetto trace of one run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from rich.table import Table

from ..engine.segments import Segment
from ..trace.perfetto import chrome_trace, write_chrome_trace

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("energy_per_token_j", "energy/token (mJ)", "mJ"),
    ("avg_power_w", "avg power (W)", "W"),
    ("ttft_ms", "TTFT (ms)", ""),
    ("tpot_ms", "TPOT (ms)", ""),
    ("tokens_per_s", "tok/s", ""),
    ("energy_saving_vs_default", "saving vs default", "%"),
    ("latency_change_vs_default", "TPOT vs default", "%"),
    ("ttft_change_vs_default", "TTFT vs default", "%"),
    ("oracle_fraction", "of oracle saving", "%"),
    ("oracle_request_fraction", "of oracle-request saving", "%"),
    ("switches_per_s", "switches/s", ""),
    ("decision_us_median", "decision (µs)", ""),
)


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "mJ":
        return f"{value * 1e3:.3f}"
    if unit == "%":
        return f"{value * 100:+.1f}%"
    if unit == "W":
        return f"{value:.3f}"
    return f"{value:.2f}"


def table(report: dict[str, Any]) -> Table:
    label = "simulated" if report["simulated"] else "measured"
    t = Table(
        title=f"turboinfer bench — {report['model']} on {report['device']} "
        f"(energy {label}; latency slack {report['latency_slack']:.0%})"
    )
    t.add_column("controller")
    for _key, head, unit in COLUMNS:
        if unit in ("mJ", "W"):
            head = f"{head} \\[{label}]"  # escaped: rich reads [..] as markup
        t.add_column(head, justify="right")
    for name, row in report["controllers"].items():
        t.add_row(name, *(_fmt(row.get(k), unit) for k, _h, unit in COLUMNS))
    return t


def live_line(report: dict[str, Any]) -> str | None:
    live = report.get("live")
    if not live:
        return None
    return (
        f"live engine A/B on this host (measured, not simulated): power saving on "
        f"{live['tokens_per_s_on']:.1f} tok/s vs off {live['tokens_per_s_off']:.1f} tok/s, "
        f"median ratio {live['ratio']:.3f} over {live['rounds']} interleaved rounds"
        + (
            f"; simulated-GPU accounting {live['accounting_ms_per_token']:.1f} ms CPU per "
            "token, after each request, off the decode path"
            if live.get("accounting_ms_per_token") is not None
            else ""
        )
    )


def accounting_line(report: dict[str, Any]) -> str | None:
    """The arrays-based accounting's cost and its agreement with the replays."""
    acc = report.get("accounting")
    if not acc or acc.get("accounting_ms_per_token") is None:
        return None
    err = max(acc["max_rel_error_vs_replay"].values())
    return (
        f"arrays-based accounting (applied energy + default shadow): "
        f"{acc['accounting_ms_per_token']:.2f} ms CPU per token on this host, within "
        f"{err:.2%} of the per-kernel replays (simulated figures)"
    )


def write_csv(path: str | Path, report: dict[str, Any]) -> Path:
    p = Path(path)
    keys = [k for k, _h, _u in COLUMNS]
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["controller", *keys, "simulated"])
        for name, row in report["controllers"].items():
            w.writerow([name, *(row.get(k) for k in keys), report["simulated"]])
    return p


def write_trace(
    path: str | Path,
    segments: list[Segment],
    intervals: dict[str, list[tuple[int, int, int, str, str, float]]],
    report: dict[str, Any],
) -> Path:
    """One run: the first recorded request (host clock) and, per controller, the replay's
    busy/idle slices with frequency and power counters (virtual clock, simulated)."""
    first = [s for s in segments if s.request == 0]
    events = chrome_trace(first, process_name="llama.cpp run (recorded)", pid=1)
    label = "simulated" if report["simulated"] else "measured"
    for pid, (name, ivs) in enumerate(intervals.items(), start=2):
        end = next((iv[0] for iv in ivs if iv[4] == "idle" and iv[0] > ivs[0][0]), None)
        ivs = [iv for iv in ivs if end is None or iv[0] < end]
        events.append(
            {
                "ph": "M",
                "pid": pid,
                "name": "process_name",
                "args": {"name": f"{name} on {report['device']} ({label}, virtual time)"},
            }
        )
        for t, dt, hz, state, phase, e in ivs:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": 1,
                    "name": state,
                    "ts": t / 1e3,
                    "dur": dt / 1e3,
                    "args": {"phase": phase, "freq_mhz": hz / 1e6, "energy_uj": e * 1e6},
                }
            )
            events.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "name": "freq_mhz",
                    "ts": t / 1e3,
                    "args": {"freq_mhz": hz / 1e6},
                }
            )
            power = e / (dt * 1e-9) if dt else 0.0
            events.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "name": f"power_w ({label})",
                    "ts": t / 1e3,
                    "args": {"power_w": power},
                }
            )
    return write_chrome_trace(path, events, {"simulated": report["simulated"]})
