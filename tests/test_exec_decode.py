"""The native executor inside real llama_decode calls (tiny GGUF, native hook).

A node-keyed plan is set before each decode; the executor is fed by the C eval
callback itself. Engine-side evidence: the hook's own ring says when each node was
asked and done, and every NODE switch must have fired between its node's ask and done
(inside the callback of that node, before its kernel ran), at the planned ordinal.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_hooks_decode import hooked_context

from turboinfer_llama.control.plan import Anchor, Plan, Switch
from turboinfer_llama.engine import executor as native_exec
from turboinfer_llama.engine import hooks

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.skipif(
    not (native_exec.EXECUTOR_AVAILABLE and hooks.NATIVE_AVAILABLE),
    reason="native hook/executor library not built",
)

PROMPT = [1] + [3 + b for b in b"Hello"]
LEVELS = [100_000_000, 200_000_000, 300_000_000, 400_000_000]
KEYS = ((2, 2), (7, 1), (15, 3))  # (node ordinal, level)


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[ctypes.c_void_p]:
    llama_cpp.llama_backend_init()
    m = llama_cpp.llama_model_load_from_file(
        str(tiny_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    assert m, "tiny GGUF did not load"
    yield m
    llama_cpp.llama_model_free(m)


def decode_with_executor(
    model: ctypes.c_void_p, granularity: str, plan: Plan, n_steps: int = 4
) -> list[tuple[int, np.ndarray, list]]:
    """(graph seq, that graph's hook records, executor log) per llama_decode."""
    hook = hooks.make_hook(granularity, 1 << 14, native=True)
    assert isinstance(hook, hooks.NativeHook)
    ex = native_exec.NativeExecutor(LEVELS, native_exec.RecordActuator())
    hook.attach_executor(ex)
    ctx = hooked_context(model, hook)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    out = []
    tokens = PROMPT
    try:
        for _ in range(n_steps):
            ex.set_plan(plan)
            seq = hook.begin_graph()  # also begins the executor's graph, natively
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr))) == 0
            ex.graph_end()
            out.append((seq, hook.drain_raw(), ex.drain_log()))
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), (n_vocab,))
            tokens = [int(np.argmax(logits))]
        assert ex.status()["failed_errno"] == 0
    finally:
        llama_cpp.llama_free(ctx)
        ex.close()  # detaches from the hook
        hook.close()
    return out


def test_node_switches_fire_inside_llama_decode_at_their_ordinals(
    model: ctypes.c_void_p,
) -> None:
    plan = Plan(
        first_level=0,
        end_level=0,
        switches=tuple(Switch(Anchor.NODE, k, lv) for k, lv in KEYS),
    )
    steps = decode_with_executor(model, "kernel", plan)
    for seq, rec, log in steps:
        asks = rec[rec["phase"] == 0]
        dones = rec[rec["phase"] == 1]
        assert len(asks) == len(dones) > max(k for k, _ in KEYS)
        assert set(rec["graph"].tolist()) == {seq}
        first = [(0, "first", -1, seq)] if seq == 1 else []  # later: level 0 already set
        assert [(a.level, a.source, a.node, a.graph) for a in log] == [
            *first,
            *((lv, "node", k, seq) for k, lv in KEYS),
            (0, "end", -1, seq),
        ]
        t_first_ask, t_last_done = int(asks["t_ns"].min()), int(dones["t_ns"].max())
        for a in log[:-1]:
            assert t_first_ask <= a.t_ns <= t_last_done
        deferred = 0
        for a in log[len(first) : -1]:
            # in node k's callback: after its ask, before its done -- or, when the
            # executor's lock was busy, handed to the lock holder, which applies it a
            # moment later (still inside llama_decode, checked above)
            ask_t = int(asks["t_ns"][asks["node"] == a.node][0])
            done_t = int(dones["t_ns"][dones["node"] == a.node][0])
            assert ask_t <= a.t_ns
            deferred += a.t_ns > done_t
        assert deferred < len(KEYS), deferred  # a hand-over is the exception, not the rule
        assert log[-1].t_ns > t_last_done  # end level: after llama_decode returned


def test_feedback_raises_inside_llama_decode_when_behind(model: ctypes.c_void_p) -> None:
    """A checkpoint at node 1 expecting 0 ns elapsed, no dead band: any real kernel is
    'late', so the next completion raises the clock above the planned level."""
    plan = Plan(
        first_level=0,
        end_level=0,
        predicted_ns=1_000,
        gain=1.0,
        switches=(Switch(Anchor.NODE, 1, -1, expect_ns=0),),
    )
    for seq, rec, log in decode_with_executor(model, "kernel", plan, n_steps=2):
        fb = [a for a in log if a.source == "feedback"]
        assert fb and fb[0].level > 0 and fb[0].node >= 1 and fb[0].graph == seq
        assert fb[0].node == 1 and fb[0].level == len(LEVELS) - 1  # far behind: top
        dones = rec[rec["phase"] == 1]
        done_t = int(dones["t_ns"][dones["node"] == 1][0])
        assert done_t <= fb[0].t_ns <= int(dones["t_ns"].max())
