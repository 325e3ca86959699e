"""The benchmark figure, in the spirit of the paper's: one decode stretch with kernel
activity, stall gaps and the clock under `default` and `tmpc`, plus energy/TPOT bars.

Needs the ``plot`` extra (matplotlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STRETCH_NS = 60_000_000  # 60 ms of virtual time


class PlotUnavailable(RuntimeError):
    """matplotlib is missing."""


def _stretch(intervals: list[tuple[int, int, int, str, str, float]]) -> list[tuple]:
    """A steady-state stretch: it starts a third of the way into the decode intervals,
    past the default governor's ramp-up after prefill."""
    decode = [iv[0] for iv in intervals if iv[4] == "decode"]
    if not decode:
        return []
    start = decode[len(decode) // 3]
    return [iv for iv in intervals if start <= iv[0] < start + STRETCH_NS]


def write_plot(path: str | Path, report: dict[str, Any], intervals: dict[str, list]) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'turboinfer-llama[plot]'"
        ) from None
    label = "simulated" if report.get("simulated") else "measured"
    names = [n for n in ("default", "tmpc") if n in intervals]
    fig, axes = plt.subplots(
        len(names) + 1, 1, figsize=(11, 2.6 * (len(names) + 1)), constrained_layout=True
    )
    axes = list(axes) if len(names) else [axes]
    for ax, name in zip(axes, names, strict=False):  # the last axis holds the bars
        iv = _stretch(intervals[name])
        if not iv:
            continue
        t0 = iv[0][0]
        for t, dt, _hz, state, _phase, _e in iv:
            if state == "busy":
                ax.axvspan((t - t0) / 1e6, (t + dt - t0) / 1e6, color="tab:blue", alpha=0.35, lw=0)
        xs, ys = [], []
        for t, dt, hz, _s, _p, _e in iv:
            xs += [(t - t0) / 1e6, (t + dt - t0) / 1e6]
            ys += [hz / 1e6, hz / 1e6]
        ax.plot(xs, ys, color="tab:red", lw=1.2, label="GPU clock (MHz)")
        ax.set_ylabel("MHz")
        ax.set_title(f"{name}: kernels (blue) and stalls (white), clock in red — {label}")
        ax.set_xlabel("virtual time (ms)")
    bar = axes[-1]
    ctrls = report["controllers"]
    order = list(ctrls)
    e = [ctrls[n]["energy_per_token_j"] * 1e3 for n in order]
    tp = [ctrls[n]["tpot_ms"] for n in order]
    x = range(len(order))
    bar.bar([i - 0.2 for i in x], e, width=0.4, label=f"energy/token (mJ, {label})")
    ax2 = bar.twinx()
    ax2.bar([i + 0.2 for i in x], tp, width=0.4, color="tab:orange", label="TPOT (ms)")
    bar.set_xticks(list(x), order)
    bar.set_ylabel(f"mJ/token ({label})")
    ax2.set_ylabel("TPOT (ms)")
    bar.set_title(f"per controller on {report.get('device')} — {label}")
    h1, l1 = bar.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    bar.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8)
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
