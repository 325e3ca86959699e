"""What each token costs the engine's own thread: issue 14's per-token accounting.

    python -m turboinfer_llama.bench.engine_thread [--model PATH] [--rounds 12]
        [--tokens 64] [--requests 9] [--max-tokens 32] [--json PATH]

The server parity figures (``bench.server_parity``) are end to end and noisy at the
1-2% level; this splits the same cost where it is paid, in one process, measured on
this host (wall clock, ``perf_counter_ns``):

1. **Between decodes** (interleaved rounds of ``--tokens`` greedy tokens): the time
   inside ``llama_decode`` and between two ``llama_decode`` calls, per token (median
   of each round's median), for plain ``llama_cpp.Llama``, ours with the hooks only
   (``controller="none"``) and ours with the live loop (tmpc, simulated device,
   native executor); and each side's difference to plain, paired by round (median).
   Inside ``llama_decode`` that is the eval callback's cost (it runs at every node,
   ~600 per gemma token); between two decodes, everything we add on the engine
   thread there.
2. **Per call, per request** (the live-loop side, ``--requests`` non-streaming
   requests of ``--max-tokens``, the server parity script's prompts in turn): each
   engine-thread entry point of ``PowerSession`` (``session.py``), median us per call
   and total per request, split into the request's prompt graph, its first decode,
   and its later decodes. Each call is timed by a wrapper around it (its own cost,
   under 1 us, is in the figures).

``llama_decode`` (llama-cpp-python's ctypes binding) and ``PowerSession``'s methods are
wrapped on their classes for the run: this is a benchmark for a process of its own,
not a library call. A benchmark, not a test: no figure here is asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import llama_cpp
import llama_cpp._internals as llama_internals

from ..llama import Llama
from ..session import PowerSession
from .overhead import PROMPT, default_model
from .server_parity import PROMPTS
from .timing import decode_tokens_per_s

# PowerSession's entry points on the engine thread (llama.py calls them around each
# llama_decode, each sampled token and each request)
CALLS = (
    "on_request_begin",
    "on_decode_begin",
    "entering_decode",
    "on_decode_end",
    "emit",
    "on_token",
    "on_request_end",
)
STAGES = ("prompt", "first decode", "later decodes")


@contextmanager
def _timed_decode(log: list[tuple[int, int]]) -> Iterator[None]:
    """Every ``llama_decode`` call's (start, end) in ns, appended to ``log``."""
    inner = llama_internals.llama_cpp.llama_decode

    def decode(ctx: Any, batch: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return inner(ctx, batch)
        finally:
            log.append((t0, time.perf_counter_ns()))

    llama_internals.llama_cpp.llama_decode = decode
    try:
        yield
    finally:
        llama_internals.llama_cpp.llama_decode = inner


def _native_hook(llm: Any) -> Any:
    """Our side's native hook (its callback can time itself), else None."""
    power = getattr(llm, "power", None)
    hook = getattr(power, "hook", None) if power is not None else None
    return hook if hasattr(hook, "self_time") else None


def between_decodes(sides: dict[str, Any], rounds: int, tokens: int) -> dict[str, dict[str, float]]:
    """Per side: median us inside ``llama_decode`` and between two calls, per token
    (median over rounds of each round's median; rounds alternate the sides' order);
    for ours, the eval callback's own time per decode (timed in C, in the decodes of the
    rounds, the prompt's included: total over rounds / decodes), and its share of the
    time inside those same decodes (the callback runs inside ``llama_decode``, so the
    share is below 1; the per-decode mean, the prompt's decode in it, is not comparable
    with the later decodes' median)."""
    log: list[tuple[int, int]] = []
    inside: dict[str, list[float]] = {k: [] for k in sides}
    between: dict[str, list[float]] = {k: [] for k in sides}
    # the callback's own ns, the decodes it ran in, and the ns inside those decodes
    cb_ns = dict.fromkeys(sides, 0)
    cb_decodes = dict.fromkeys(sides, 0)
    cb_inside_ns = dict.fromkeys(sides, 0)
    hooks = {k: _native_hook(llm) for k, llm in sides.items()}
    with _timed_decode(log):
        for llm in sides.values():  # warm-up
            decode_tokens_per_s(llm, PROMPT, 8)
            _settle(llm)
        for r in range(rounds):
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for name, llm in order:
                log.clear()
                hook = hooks[name]
                if hook is not None:
                    hook.set_self_timing(True)
                    before = hook.self_time()[0]
                decode_tokens_per_s(llm, PROMPT, tokens)
                if hook is not None:
                    hook.set_self_timing(False)
                    cb_ns[name] += hook.self_time()[0] - before
                    cb_decodes[name] += len(log)
                    cb_inside_ns[name] += sum(b - a for a, b in log)
                calls = log[2:]  # the prompt's and the first token's decode excluded
                if len(calls) < 3:
                    raise RuntimeError("too few tokens generated to time decoding")
                inside[name].append(statistics.median(b - a for a, b in calls) / 1e3)
                gaps = [calls[i + 1][0] - calls[i][1] for i in range(len(calls) - 1)]
                between[name].append(statistics.median(gaps) / 1e3)
                _settle(llm)  # the backlog, outside the next side's run
    out: dict[str, dict[str, float]] = {}
    for k in sides:
        fig = {
            "inside_decode_us": statistics.median(inside[k]),
            "between_decodes_us": statistics.median(between[k]),
        }
        if cb_decodes[k]:
            fig["eval_callback_us"] = cb_ns[k] / cb_decodes[k] / 1e3
            fig["eval_callback_share_of_decode"] = cb_ns[k] / max(cb_inside_ns[k], 1)
        if hooks[k] is not None:
            # asks told a repeat by address (a graph llama.cpp reused), by key, recorded
            fig["compact_asks"] = hooks[k].compact_stats()
        if k != "plain" and "plain" in sides:
            # paired by round (the host's drift between rounds cancels): a 1% cost
            # inside a 13 ms decode hides in the spread of the sides' own medians
            for col, got in (("inside_decode", inside), ("between_decodes", between)):
                fig[f"{col}_vs_plain_us"] = statistics.median(
                    a - b for a, b in zip(got[k], got["plain"], strict=True)
                )
        out[k] = fig
    return out


def _settle(llm: Any) -> None:
    power = getattr(llm, "power", None)
    if power is not None:
        power.stats()


@contextmanager
def _timed_calls(record: Callable[[str, int], None]) -> Iterator[None]:
    """Wrap :data:`CALLS` on ``PowerSession``; each call's ns go to ``record`` under
    ``"<call>:<stage>"`` (:data:`STAGES`: a request's prompt graph, its first decode,
    its later decodes, told by the ``on_decode_end`` calls since its
    ``on_request_begin``), or ``"<call> (inside another):<stage>"`` for a call made by
    another of them (``emit``). ``llama.py`` binds ``entering_decode`` when a model is
    made, so the models to time are made inside."""
    saved = {name: PowerSession.__dict__[name] for name in CALLS}
    depth = [0]
    decodes_ended = [0]  # in the current request

    def wrapped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: PowerSession, *args: Any, **kw: Any) -> Any:
            top = depth[0] == 0
            if top and name == "on_request_begin":
                decodes_ended[0] = 0
            stage = STAGES[min(decodes_ended[0], len(STAGES) - 1)]
            key = name if top else f"{name} (inside another)"
            depth[0] += 1
            t0 = time.perf_counter_ns()
            try:
                return fn(self, *args, **kw)
            finally:
                ns = time.perf_counter_ns() - t0
                depth[0] -= 1
                record(f"{key}:{stage}", ns)
                if top and name == "on_decode_end":
                    decodes_ended[0] += 1

        return call

    for name, fn in saved.items():
        setattr(PowerSession, name, wrapped(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(PowerSession, name, fn)


def per_request_calls(
    common: dict[str, Any], power: dict[str, Any], requests: int, max_tokens: int
) -> dict[str, Any]:
    """Median us per call and total us per request of each engine-thread entry point,
    by stage of the request (the first request is a warm-up, not counted)."""
    times: dict[str, list[int]] = collections.defaultdict(list)
    counting = [False]

    def record(key: str, ns: int) -> None:
        if counting[0]:
            times[key].append(ns)

    latency_ms: list[float] = []
    with _timed_calls(record):
        llm = Llama(**common, power=power)
        try:
            for i in range(requests + 1):
                counting[0] = i > 0
                t0 = time.perf_counter()
                llm.create_completion(
                    PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, temperature=0.0
                )
                if i > 0:
                    latency_ms.append((time.perf_counter() - t0) * 1e3)
                _settle(llm)
        finally:
            llm.close()
    rows = []
    for name in (*CALLS, "emit (inside another)"):
        row: dict[str, Any] = {"call": name, "top_level": name in CALLS}
        total = 0.0
        for st in STAGES:
            got = times.get(f"{name}:{st}", [])
            row[st] = statistics.median(got) / 1e3 if got else None
            row[f"{st} calls per request"] = len(got) / requests
            total += sum(got) / 1e3 / requests
        row["us per request"] = total
        rows.append(row)
    return {
        "rows": rows,
        # the top-level calls only: the inner emits are inside their totals
        "us_per_request": sum(r["us per request"] for r in rows if r["top_level"]),
        "request_ms_median": statistics.median(latency_ms),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    ap.add_argument("--rounds", type=int, default=12, help="between-decodes rounds")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per round")
    ap.add_argument("--requests", type=int, default=9, help="requests timed per call")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    ap.add_argument("--threads", type=int, default=1, help="n_threads (a server's default)")
    ap.add_argument("--json", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    if min(args.rounds, args.requests) < 1 or min(args.tokens, args.max_tokens) < 4:
        ap.error("--rounds and --requests must be >= 1, --tokens and --max-tokens >= 4")
    model = args.model or default_model()
    common = {
        "model_path": model,
        "n_ctx": 2048,
        "verbose": False,
        "n_threads": args.threads,
    }
    live = {"controller": "tmpc", "device": "sim"}
    sides: dict[str, Any] = {
        "plain": llama_cpp.Llama(**common),
        "hooks only": Llama(**common, power={"controller": "none", "device": "sim"}),
        "live loop": Llama(**common, power=live),
    }
    try:
        split = between_decodes(sides, args.rounds, args.tokens)
    finally:
        for llm in sides.values():
            llm.close()
    calls = per_request_calls(common, live, args.requests, args.max_tokens)

    print(f"model: {model}, n_threads={args.threads} (measured on this host, wall clock)")
    print(f"\nper token, {args.rounds} interleaved rounds of {args.tokens} tokens (median us)")
    print(
        f"  {'side':<12}{'inside llama_decode':>22}{'between decodes':>18}"
        f"   vs plain, paired by round: inside / between    eval callback (C-timed)"
    )
    for name, fig in split.items():
        extra = ""
        if name != "plain":
            extra = (
                f"{fig['inside_decode_vs_plain_us']:+30.1f} / "
                f"{fig['between_decodes_vs_plain_us']:+.1f}"
            )
            if "eval_callback_us" in fig:
                share = fig["eval_callback_share_of_decode"]
                extra += f"{fig['eval_callback_us']:>12.1f} ({share:.1%} of decode)"
        print(
            f"  {name:<12}{fig['inside_decode_us']:>22.1f}{fig['between_decodes_us']:>18.1f}{extra}"
        )
    print(
        f"\nlive loop, engine-thread calls, {args.requests} requests of {args.max_tokens} "
        f"tokens (median us per call; calls per request in brackets)"
    )
    print(f"  {'call':<22}" + "".join(f"{s:>20}" for s in STAGES) + f"{'us per request':>16}")
    for row in calls["rows"]:
        cells = []
        for st in STAGES:
            med = row[st]
            n = row[f"{st} calls per request"]
            cells.append(f"{'-':>20}" if med is None else f"{med:>12.1f} ({n:>5.1f})")
        print(f"  {row['call']:<22}" + "".join(cells) + f"{row['us per request']:>16.1f}")
    total = calls["us_per_request"]
    req_ms = calls["request_ms_median"]
    print(
        f"  all of them: {total:.0f} us per request, {100 * total / 1e3 / req_ms:.2f}% of its "
        f"median latency ({req_ms:.1f} ms), the calls made inside others counted once"
    )
    if args.json:
        doc = {"model": model, "threads": args.threads, "per_token": split, "per_request": calls}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
