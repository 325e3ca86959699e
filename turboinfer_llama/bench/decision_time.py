"""Median decision time of the tmpc controller, in Python on this machine.

Replays a synthetic gemma-3-270m-like trace (kernel granularity, ~620 nodes per
decode graph) through tmpc on the simulated adreno650 and prints, in microseconds:
every controller call (the figure the 20 us budget is about), the full horizon
solves alone, and the governor's fast path (``Governor.on_event`` run inline, in the
producer's context, on the same recorded events). A benchmark, not a test: run
``python -m turboinfer_llama.bench.decision_time``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from ..control.base import Decision
from ..control.factory import for_device, make_controller
from ..control.governor import Governor
from ..control.replay import replay
from ..control.synthetic import make_trace
from ..control.tmpc import TubeMPC
from ..devices.sim import SimGpu
from ..engine.events import Event


class _TimedTmpc(TubeMPC):
    """tmpc that also times its horizon solves and records the events it sees."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.solve_ns: list[int] = []
        self.events: list[Event] = []

    def _solve(self, t_ns: int, *, in_compute: bool) -> tuple[int, list[Decision]]:
        t0 = time.perf_counter_ns()
        out = super()._solve(t_ns, in_compute=in_compute)
        self.solve_ns.append(time.perf_counter_ns() - t0)
        return out

    def on_event(self, ev: Event) -> Decision | None:
        self.events.append(ev)
        return super().on_event(ev)


def _tmpc_args(dev: SimGpu) -> dict[str, Any]:
    kw = for_device(dev)
    return {
        "levels_hz": kw["device_levels_hz"],
        "switch_latency_ns": kw["switch_latency_ns"],
        "power": kw["power"],
        "shadow": kw["shadow"],
    }


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per request")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--model", default="gemma-3-270m")
    args = ap.parse_args(argv)
    trace = make_trace(requests=args.requests, decode_tokens=args.tokens, model=args.model)

    dev = SimGpu()
    ctl = _TimedTmpc(**_tmpc_args(dev))
    res = replay(trace, ctl, dev, seed=0)
    calls = list(res.decision_us)
    solves = [n / 1e3 for n in ctl.solve_ns]

    dev2 = SimGpu()
    now = [0]
    gov = Governor(
        make_controller("tmpc", **for_device(dev2)), dev2, timer=False, clock=lambda: now[0]
    ).start()
    fast = []
    for ev in ctl.events:
        now[0] = ev.t_ns
        t0 = time.perf_counter_ns()
        gov.on_event(ev)
        fast.append((time.perf_counter_ns() - t0) / 1e3)
    gov.close()

    print(f"tmpc decision time (simulated trace, {res.tokens} tokens, {len(calls)} calls)")
    for label, xs in (
        ("every controller call", calls),
        ("horizon solves", solves),
        ("governor fast path", fast),
    ):
        print(
            f"  {label:22s} median {statistics.median(xs):7.2f} us   p90 {_pct(xs, 0.9):7.2f} us"
            f"   p99 {_pct(xs, 0.99):7.2f} us   n={len(xs)}"
        )
    print("budget: median <= 20 us per decision")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
