"""A synthetic gemma-3-270m-like trace, as Segments, until a real recording exists.

Used by the control tests, ``bench/decision_time.py`` and ``control.compare``.

Model shape (gemma-3-270m, from its GGUF metadata): 18 layers, width 640, 4 query
heads and 1 KV head of size 256, FFN 2048, vocabulary 262144 with tied embeddings.
Weight types follow Q4_K_M (Q4_K mostly, Q6_K for attn_v/ffn_down and the tied
output). The decode graph has ~620 nodes, matching the node count measured on the
build machine (BRIEF.md). Stall durations are ASSUMPTIONS shaped like measurements:
inter-kernel host submission ~15 us, submit ~150 us, sampling a few ms (lognormal),
idle between requests ~0.3 s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..engine.events import NodeShape, StallKind
from ..engine.segments import Segment

F32, F16, Q4_K, Q6_K, I32 = 0, 1, 12, 14, 26

# (layers, width, query heads, KV heads, head size, FFN, vocabulary)
MODELS = {
    "gemma-3-270m": (18, 640, 4, 1, 256, 2048, 262144),
    # ASSUMPTION: the gemma-3 graph at Qwen2.5-1.5B's published dimensions, standing in
    # for the paper's 1.5B-3B models (a bigger, more GPU-bound decode step).
    "1.5b-like": (28, 1536, 12, 2, 128, 8960, 151936),
}


def _pad(ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    full = (*ne, 1, 1, 1, 1)
    return (full[0], full[1], full[2], full[3])


def _sh(ne, t=F32, s0=None, t0=-1, s1=None, t1=-1) -> NodeShape:
    return NodeShape(
        _pad(ne), t, None if s0 is None else _pad(s0), t0, None if s1 is None else _pad(s1), t1
    )


def graph_nodes(
    n_tokens: int, n_kv: int, model: str = "gemma-3-270m"
) -> list[tuple[str, str, int, NodeShape]]:
    """(op, name, layer, shape) of one gemma-3 graph for ``n_tokens`` new tokens and a
    KV cache holding ``n_kv`` positions."""
    N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB = MODELS[model]
    T, E, Q, KV = n_tokens, N_EMBD, N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    nodes: list[tuple[str, str, int, NodeShape]] = [
        ("GET_ROWS", "inp_embd", -1, _sh((E, T), F32, (E, N_VOCAB), Q6_K, (T,), I32)),
        ("SCALE", "inp_scaled", -1, _sh((E, T), F32, (E, T), F32)),
    ]
    for il in range(N_LAYER):
        act = (E, T)

        def mm(name, k, m, wt=Q4_K, il=il):
            return ("MUL_MAT", f"{name}-{il}", il, _sh((m, T), F32, (k, m), wt, (k, T), F32))

        def ew(op, name, ne, il=il, two=False):
            return (op, f"{name}-{il}", il, _sh(ne, F32, ne, F32, ne if two else None, F32))

        def nop(op, name, ne, il=il):
            return (op, f"{name}-{il}", il, _sh(ne, F32, ne, F32))

        v_type = Q6_K if il % 2 == 0 else Q4_K
        nodes += [
            ew("RMS_NORM", "norm", act),
            ew("MUL", "attn_norm", act, two=True),
            mm("Qcur", E, Q),
            nop("RESHAPE", "Qcur", (HEAD_DIM, N_HEAD, T)),
            ew("RMS_NORM", "Qcur_normed", (HEAD_DIM, N_HEAD, T)),
            ew("MUL", "Qcur_normed", (HEAD_DIM, N_HEAD, T), two=True),
            ew("ROPE", "Qcur", (HEAD_DIM, N_HEAD, T)),
            mm("Kcur", E, KV),
            nop("RESHAPE", "Kcur", (HEAD_DIM, N_HEAD_KV, T)),
            ew("RMS_NORM", "Kcur_normed", (HEAD_DIM, N_HEAD_KV, T)),
            ew("MUL", "Kcur_normed", (HEAD_DIM, N_HEAD_KV, T), two=True),
            ew("ROPE", "Kcur", (HEAD_DIM, N_HEAD_KV, T)),
            mm("Vcur", E, KV, v_type),
            ("SET_ROWS", f"k_cache_set-{il}", il, _sh((KV, n_kv), F16, (KV, T), F32, (T,), I32)),
            ("SET_ROWS", f"v_cache_set-{il}", il, _sh((KV, n_kv), F16, (KV, T), F32, (T,), I32)),
            nop("VIEW", "k_view", (HEAD_DIM, n_kv, N_HEAD_KV)),
            (
                "MUL_MAT",
                f"kq-{il}",
                il,
                _sh(
                    (n_kv, T, N_HEAD), F32, (HEAD_DIM, n_kv, N_HEAD_KV), F16, (HEAD_DIM, T, N_HEAD)
                ),
            ),
            ew("SOFT_MAX", "kq_soft_max", (n_kv, T, N_HEAD)),
            (
                "MUL_MAT",
                f"kqv-{il}",
                il,
                _sh(
                    (HEAD_DIM, T, N_HEAD), F32, (n_kv, HEAD_DIM, N_HEAD_KV), F16, (n_kv, T, N_HEAD)
                ),
            ),
            nop("PERMUTE", "kqv_merged", (HEAD_DIM, N_HEAD, T)),
            ew("CONT", "kqv_merged_cont", (Q, T)),
            mm("attn_out", Q, E),
            ew("RMS_NORM", "attn_post_norm", act),
            ew("MUL", "attn_post_norm", act, two=True),
            ew("ADD", "ffn_inp", act, two=True),
            ew("RMS_NORM", "norm", act),
            ew("MUL", "ffn_norm", act, two=True),
            mm("ffn_gate", E, N_FF),
            mm("ffn_up", E, N_FF),
            ew("GEGLU", "ffn_geglu", (N_FF, T), two=True),
            mm("ffn_down", N_FF, E, v_type),
            ew("RMS_NORM", "ffn_post_norm", act),
            ew("MUL", "ffn_post_norm", act, two=True),
            ew("ADD", "l_out", act, two=True),
        ]
    nodes += [
        ("RMS_NORM", "norm", -1, _sh((E, T), F32, (E, T), F32)),
        ("MUL", "result_norm", -1, _sh((E, T), F32, (E, T), F32, (E, 1), F32)),
        ("GET_ROWS", "inp_out_ids", -1, _sh((E, 1), F32, (E, T), F32, (1,), I32)),
        ("MUL_MAT", "result_output", -1, _sh((N_VOCAB, 1), F32, (E, N_VOCAB), Q6_K, (E, 1), F32)),
    ]
    return nodes


def make_trace(
    *,
    seed: int = 0,
    requests: int = 2,
    prompt_tokens: int | Sequence[int] = 24,
    decode_tokens: int = 16,
    sample_ms: float = 3.0,
    sample_sigma: float = 0.25,
    submit_us: float = 150.0,
    inter_kernel_us: float = 15.0,
    idle_ms: float = 300.0,
    kernel_timing: bool = True,
    sample_ms_after_shift: float | None = None,
    after_prefill_ms: float | None = None,
    model: str = "gemma-3-270m",
    ubatch_tokens: int = 512,
) -> list[Segment]:
    """Segments of ``requests`` requests, each a prefill then ``decode_tokens`` decode
    steps. ``kernel_timing=False`` gives a graph-granularity recording (no inter-kernel
    stalls, ``timed=False``). ``sample_ms_after_shift`` switches the sampling gap's
    median half way through the decode steps (a regime shift). ``after_prefill_ms``:
    the median of the stall after each prompt, where it differs from the decode's (a
    server's first token out, a client's first chunk handling). ``prompt_tokens``: one
    length for every request, or one per request (cycled). A prompt longer than
    ``ubatch_tokens`` is one graph of several micro-batches, each its own nodes in
    turn, as llama.cpp splits a batch."""
    rng = np.random.default_rng(seed)
    segs: list[Segment] = []
    t = 0
    graph = 0

    def add(kind, dur, phase, **kw):
        nonlocal t
        dur = max(1, int(dur))
        segs.append(Segment(kind, t, dur, phase, **kw))
        t += dur

    for req in range(requests):
        if req > 0:
            add(
                "stall",
                idle_ms * 1e6 * rng.lognormal(0, 0.2),
                "idle",
                stall=StallKind.IDLE,
                request=req - 1,
            )
        n_kv = 0
        prompt = (
            prompt_tokens
            if isinstance(prompt_tokens, int)
            else prompt_tokens[req % len(prompt_tokens)]
        )
        steps = [int(prompt)] + [1] * decode_tokens
        for tok, n_tokens in enumerate(steps):
            phase = "prefill" if tok == 0 else "decode"
            add(
                "stall",
                submit_us * 1e3 * rng.lognormal(0, 0.2),
                phase,
                stall=StallKind.SUBMIT,
                request=req,
                token=tok,
                graph=graph,
            )
            nodes = []
            left = n_tokens
            while left > 0:  # micro-batches
                n_ub = min(left, ubatch_tokens)
                n_kv += n_ub
                left -= n_ub
                nodes += graph_nodes(n_ub, max(256, n_kv), model)
            for i, (op, name, layer, shape) in enumerate(nodes):
                if kernel_timing and i > 0:
                    add(
                        "stall",
                        inter_kernel_us * 1e3 * rng.lognormal(0, 0.3),
                        phase,
                        stall=StallKind.INTER_KERNEL,
                        request=req,
                        token=tok,
                        graph=graph,
                    )
                add(
                    "kernel",
                    20_000,
                    phase,
                    request=req,
                    token=tok,
                    graph=graph,
                    node=i,
                    layer=layer,
                    op=op,
                    name=name,
                    shape=shape,
                    timed=kernel_timing,
                )
            med = sample_ms
            if tok == 0 and after_prefill_ms is not None:
                med = after_prefill_ms
            elif sample_ms_after_shift is not None and tok > len(steps) // 2:
                med = sample_ms_after_shift
            add(
                "stall",
                med * 1e6 * rng.lognormal(0, sample_sigma),
                phase,
                stall=StallKind.SAMPLE,
                request=req,
                token=tok,
                graph=graph,
            )
            graph += 1
    return segs
