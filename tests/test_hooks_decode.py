"""Eval hooks inside real llama_decode calls on the tiny GGUF.

The context is built with llama_cpp's low-level API so that the hook is in the context
parameters at creation, exactly as the Llama subclass injects it, and each decode step
is one graph we can check node by node. The pure-Python hook is the oracle for the C one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tiny_gguf import N_LAYER

from turboinfer_llama._clock import now_ns
from turboinfer_llama.engine import ggml_mirror, hooks
from turboinfer_llama.engine.events import Event, EventKind

llama_cpp = pytest.importorskip("llama_cpp")

PROMPT = [1] + [3 + b for b in b"Hello"]  # BOS, then byte tokens (<0xNN> = 3 + NN)
N_GEN = 4


@dataclass
class Run:
    tokens: list[int]
    steps: list[tuple[int, int, int, list[Event]]] = field(default_factory=list)
    """(graph seq, t_before_decode, t_after_decode, events drained after it) per step."""


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[ctypes.c_void_p]:
    llama_cpp.llama_backend_init()
    m = llama_cpp.llama_model_load_from_file(
        str(tiny_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    assert m, "tiny GGUF did not load"
    yield m
    llama_cpp.llama_model_free(m)


def hooked_context(model: ctypes.c_void_p, hook: hooks.EvalHook | None) -> ctypes.c_void_p:
    """A small one-thread llama context on ``model`` with ``hook``'s eval callback."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 64
    params.n_threads = params.n_threads_batch = 1
    if hook is not None:
        params.cb_eval = hook.cb_eval
        params.cb_eval_user_data = hook.user_data
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx
    return ctx


def generate(model: ctypes.c_void_p, hook: hooks.EvalHook | None, n_gen: int = N_GEN) -> Run:
    """Greedy decode, draining the hook after each llama_decode."""
    ctx = hooked_context(model, hook)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    run = Run(tokens=[])
    batch_tokens = PROMPT
    try:
        for _ in range(n_gen):
            arr = (llama_cpp.llama_token * len(batch_tokens))(*batch_tokens)
            seq = hook.begin_graph() if hook is not None else 0
            t0 = now_ns()
            rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr)))
            t1 = now_ns()
            assert rc == 0, f"llama_decode returned {rc}"
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), (n_vocab,))
            token = int(np.argmax(logits))
            run.tokens.append(token)
            run.steps.append((seq, t0, t1, hook.drain() if hook is not None else []))
            batch_tokens = [token]
    finally:
        llama_cpp.llama_free(ctx)
    return run


def make(granularity: str, native: bool, capacity: int = 1 << 14) -> hooks.EvalHook:
    if native and not hooks.NATIVE_AVAILABLE:
        pytest.skip(f"native hooks not built: {hooks._NATIVE_WHY}")
    hook = hooks.make_hook(granularity, capacity, native=native)
    assert hook.native is native
    return hook


def observe(model: ctypes.c_void_p, granularity: str, native: bool, **kw: int) -> Run:
    hook = make(granularity, native, **kw)
    try:
        return generate(model, hook)
    finally:
        hook.close()  # the context is already freed by generate


def node_key(e: Event) -> tuple:
    return (e.kind, e.graph, e.node, e.op, e.name, e.layer, e.shape)


@pytest.fixture(scope="module")
def plain(model: ctypes.c_void_p) -> Run:
    return generate(model, None)


@pytest.mark.parametrize("native", [True, False])
def test_kernel_mode_gives_every_node_asked_then_done(
    model: ctypes.c_void_p, plain: Run, native: bool
) -> None:
    run = observe(model, "kernel", native)
    assert run.tokens == plain.tokens
    decode_sizes = set()
    for step, (seq, t0, t1, events) in enumerate(run.steps):
        assert seq == step + 1
        asks = events[0::2]
        dones = events[1::2]
        assert len(asks) == len(dones) > 0
        assert [e.node for e in asks] == list(range(len(asks)))
        for ask, done in zip(asks, dones, strict=True):
            assert ask.kind is EventKind.NODE_ASK and done.kind is EventKind.NODE_DONE
            assert (ask.graph, ask.node, ask.op, ask.name, ask.shape) == (
                done.graph,
                done.node,
                done.op,
                done.name,
                done.shape,
            )
            assert ask.op and ask.shape is not None and ask.shape.nbytes > 0
        stamps = [e.t_ns for e in events]
        assert stamps == sorted(stamps)
        assert t0 <= stamps[0] and stamps[-1] <= t1
        assert {e.graph for e in events} == {seq}
        if step > 0:
            decode_sizes.add(len(asks))
    # Every single-token decode step runs the same graph.
    assert len(decode_sizes) == 1
    names = [e.name for e in run.steps[1][3]]
    assert {f"l_out-{i}" for i in range(N_LAYER)} <= set(names)


@pytest.mark.parametrize("granularity", hooks.GRANULARITIES)
def test_native_and_python_hooks_agree(model: ctypes.c_void_p, granularity: str) -> None:
    native = observe(model, granularity, True)
    oracle = observe(model, granularity, False)
    assert native.tokens == oracle.tokens
    for (_, _, _, got), (_, _, _, want) in zip(native.steps, oracle.steps, strict=True):
        assert [node_key(e) for e in got] == [node_key(e) for e in want]


@pytest.mark.parametrize("native", [True, False])
def test_layer_mode_syncs_only_at_layer_outputs(model: ctypes.c_void_p, native: bool) -> None:
    kernel = observe(model, "kernel", native)
    layer = observe(model, "layer", native)
    for (_, _, _, k_events), (_, _, _, l_events) in zip(kernel.steps, layer.steps, strict=True):
        k_asks = [(e.node, e.op, e.name) for e in k_events if e.kind is EventKind.NODE_ASK]
        l_asks = [(e.node, e.op, e.name) for e in l_events if e.kind is EventKind.NODE_ASK]
        assert l_asks == k_asks
        dones = [e for e in l_events if e.kind is EventKind.NODE_DONE]
        assert [e.name for e in dones] == [f"l_out-{i}" for i in range(N_LAYER)]
        assert [e.layer for e in dones] == list(range(N_LAYER))
        # Each done follows its own ask directly: the sync happens at that node.
        for d in dones:
            i = l_events.index(d)
            assert l_events[i - 1].kind is EventKind.NODE_ASK
            assert l_events[i - 1].node == d.node


@pytest.mark.parametrize("native", [True, False])
def test_graph_mode_records_asks_only(model: ctypes.c_void_p, plain: Run, native: bool) -> None:
    run = observe(model, "graph", native)
    assert run.tokens == plain.tokens
    for _, _, _, events in run.steps:
        assert events and all(e.kind is EventKind.NODE_ASK for e in events)
        assert [e.node for e in events] == list(range(len(events)))


@pytest.mark.parametrize("native", [True, False])
def test_tiny_ring_overflows_without_harm(model: ctypes.c_void_p, plain: Run, native: bool) -> None:
    capacity = 8
    full = observe(model, "kernel", native)
    hook = make("kernel", native, capacity=capacity)
    try:
        tiny = generate(model, hook)
        overflow = hook.overflow
    finally:
        hook.close()
    assert hook.overflow == overflow  # still readable after close
    assert tiny.tokens == plain.tokens
    produced = [len(events) for _, _, _, events in full.steps]
    kept = [len(events) for _, _, _, events in tiny.steps]
    assert kept == [min(n, capacity) for n in produced]
    assert overflow == sum(produced) - sum(kept) > 0
    # What was kept is the start of each step's stream.
    for (_, _, _, f), (_, _, _, t) in zip(full.steps, tiny.steps, strict=True):
        assert [(e.kind, e.node, e.name) for e in t] == [
            (e.kind, e.node, e.name) for e in f[:capacity]
        ]


@pytest.mark.parametrize("native", [True, False])
def test_disable_mid_run_makes_the_hook_inert(
    model: ctypes.c_void_p, plain: Run, native: bool
) -> None:
    hook = make("kernel", native)

    class DisableAfterFirstDrain:
        """Forwards to the hook and disables it after the first step's drain."""

        def __init__(self) -> None:
            self.cb_eval, self.user_data, self.drains = hook.cb_eval, hook.user_data, 0

        def begin_graph(self) -> int:
            return hook.begin_graph()

        def drain(self) -> list[Event]:
            events = hook.drain()
            self.drains += 1
            if self.drains == 1:
                hook.disable()
            return events

    try:
        run = generate(model, DisableAfterFirstDrain())  # type: ignore[arg-type]
    finally:
        hook.close()
    assert run.tokens == plain.tokens
    assert run.steps[0][3]
    assert all(events == [] for _, _, _, events in run.steps[1:])
    assert hook.overflow == 0


@pytest.mark.parametrize("native", [True, False])
def test_unverified_layout_gives_records_without_shapes(
    model: ctypes.c_void_p, plain: Run, native: bool
) -> None:
    if native and not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    cls = hooks.NativeHook if native else hooks.PythonHook
    hook = cls("kernel", 1 << 14, ggml_mirror.load_ggml(), ggml_mirror.TensorLayout(False, "test"))
    try:
        run = generate(model, hook)
    finally:
        hook.close()
    assert run.tokens == plain.tokens
    events = [e for _, _, _, evs in run.steps for e in evs]
    assert events and all(e.shape is None and e.op and e.name for e in events)
