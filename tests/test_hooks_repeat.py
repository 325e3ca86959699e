"""The engine thread's drain at a graph's end (``NativeHook.drain_graph``): a decode
graph whose records repeat the last full drain's in everything but t_ns and graph is
taken as t_ns only (``GraphRecords``). It must give exactly the records ``drain_raw``
gives, to the timeline's block decoder and to the planner's batch alike."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from test_hooks_decode import PROMPT, hooked_context, model  # noqa: F401 (the module's fixture)

from turboinfer_llama._clock import now_ns
from turboinfer_llama.control.governor import _Wakeup
from turboinfer_llama.control.graph_batch import NodeCosts, batch_from_records
from turboinfer_llama.engine import hooks

llama_cpp = pytest.importorskip("llama_cpp")

N_GEN = 5
_VARYING = ("t_ns", "graph")


def _run(
    mdl: ctypes.c_void_p,
    granularity: str,
    repeat: bool,
    misname: int = -1,
    compact: bool = False,
    probe: bool = False,
) -> list[tuple]:
    """Greedy decode; after each llama_decode the hook is drained with drain_graph
    (``repeat``) or drain_raw. (graph, t_before, t_after, drained) per step, then the
    hook. At step ``misname`` drain_graph is told another graph number. ``compact``:
    the C side tells the repeats (``NativeHook.set_compact``); ``probe``: with
    llama.cpp's graph reuse count (``NativeHook.set_reuse_probe``)."""
    if not hooks.NATIVE_AVAILABLE:
        pytest.skip(f"native hooks not built: {hooks._NATIVE_WHY}")
    hook = hooks.make_hook(granularity, 1 << 14)
    assert isinstance(hook, hooks.NativeHook)
    if compact:
        hook.set_compact(True)
    ctx = hooked_context(mdl, hook)
    if probe:
        assert hook.set_reuse_probe(ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(mdl))
    steps: list[tuple] = []
    tokens = PROMPT
    try:
        for _ in range(N_GEN):
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            seq = hook.begin_graph()
            t0 = now_ns()
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr))) == 0
            t1 = now_ns()
            told = seq + 100 if len(steps) == misname else seq
            raw = hook.drain_graph(told) if repeat else hook.drain_raw()
            steps.append((seq, t0, t1, raw))
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), (n_vocab,))
            tokens = [int(np.argmax(logits))]
    finally:
        llama_cpp.llama_free(ctx)
    steps.append((0, 0, 0, hook))
    return steps


def _masked(rec: np.ndarray) -> np.ndarray:
    out = rec.copy()
    for f in _VARYING:
        out[f] = 0
    return out


@pytest.mark.parametrize(
    ("granularity", "compact", "probe"),
    [(g, False, False) for g in hooks.GRANULARITIES]
    + [("graph", True, False), ("graph", True, True)],
)
def test_repeats_are_the_records_drain_raw_gives(
    model: ctypes.c_void_p,  # noqa: F811
    granularity: str,
    compact: bool,
    probe: bool,
) -> None:
    ref = _run(model, granularity, repeat=False)
    got = _run(model, granularity, repeat=True, compact=compact, probe=probe)
    hook = got.pop()[3]
    if compact:
        # with the probe, the decode graphs llama.cpp reused are told by address
        # alone (the first decode graph is built, the later ones reused); without
        # it, by key
        told = sum(len(raw) for *_, raw in got if isinstance(raw, hooks.GraphRecords))
        recorded = sum(len(raw) for *_, raw in got if isinstance(raw, np.ndarray))
        stats = hook.compact_stats()
        assert told > 0 and stats["recorded"] == recorded
        assert stats["by_address" if probe else "by_key"] == told
        assert stats["by_key" if probe else "by_address"] == 0
    ref.pop()
    kinds = [type(raw) for *_, raw in got]
    # the prompt's graph and the first decode graph are drained in full (the latter
    # becomes the template), every later decode graph as a repeat
    assert kinds[:2] == [np.ndarray, np.ndarray]
    assert set(kinds[2:]) == {hooks.GraphRecords}
    for (seq, t0, t1, raw), (_, _, _, want) in zip(got, ref, strict=True):
        rec = hooks.as_records(raw)
        assert rec.dtype == hooks.RECORD_DTYPE and not rec.flags.writeable
        # the same records but for when they were taken (two runs)
        assert np.array_equal(_masked(rec), _masked(want))
        assert (rec["graph"] == seq).all()
        assert t0 <= rec["t_ns"][0] and rec["t_ns"][-1] <= t1
        assert (np.diff(rec["t_ns"].astype(np.int64)) >= 0).all()
        if isinstance(raw, hooks.GraphRecords):
            assert np.array_equal(rec["t_ns"], raw.t_ns)
            assert not raw.t_ns.flags.writeable
            # the timeline's blocks: a repeat decodes as its records do
            a, b = hook.decode_block(raw), hook.decode_block(rec)
            for f in ("t_ns", "graph", "node", "done", "code"):
                assert np.array_equal(getattr(a, f), getattr(b, f)), f
            assert hook.decode_raw(raw) == hook.decode_raw(rec)
    hook.close()


@pytest.mark.parametrize("compact", [False, True])
def test_a_repeat_gives_the_planner_the_same_batch(model: ctypes.c_void_p, compact: bool) -> None:  # noqa: F811
    steps = _run(model, "graph", repeat=True, compact=compact)
    steps.pop()[3].close()
    direct, rebuilt = NodeCosts(), NodeCosts()
    repeats = 0
    for seq, t0, t1, raw in steps:
        kw = {"graph": seq, "n_tokens": 1, "granularity": "graph", "t_begin_ns": t0}
        a = batch_from_records(raw, t_end_ns=t1, costs=direct, **kw)
        b = batch_from_records(hooks.as_records(raw), t_end_ns=t1, costs=rebuilt, **kw)
        assert a is not None and b is not None
        repeats += isinstance(raw, hooks.GraphRecords)
        for f in ("ask_ns", "done_ns", "c_ns", "m_ns", "launch", "layer_out"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
        assert (a.t_first_ns, a.t_end_ns, a.graph) == (b.t_first_ns, b.t_end_ns, b.graph)
    assert repeats == N_GEN - 2
    assert direct.graph_hits == rebuilt.graph_hits > 0


@pytest.mark.parametrize("compact", [False, True])
def test_a_drain_that_does_not_repeat_is_taken_in_full(
    model: ctypes.c_void_p,  # noqa: F811
    compact: bool,
) -> None:
    """Records that are not the template's (here: of another graph than the one named)
    are no repeat: the check consumes nothing, the full drain returns every record, and
    it is the template from then on (compact: the C side's template, the same records)."""
    ref = _run(model, "graph", repeat=False)
    got = _run(model, "graph", repeat=True, misname=3, compact=compact)
    got.pop()[3].close()
    ref.pop()
    kinds = [type(raw) for *_, raw in got]
    assert kinds == [np.ndarray, np.ndarray, hooks.GraphRecords, np.ndarray, hooks.GraphRecords]
    full, want = got[3][3], ref[3][3]
    assert np.array_equal(_masked(full), _masked(want))
    if compact:
        assert np.array_equal(_masked(got[4][3].template), _masked(full))
    else:
        assert got[4][3].template is full


def test_the_planner_wakeup_keeps_one_pending_set() -> None:
    w = _Wakeup()
    w.set()
    w.set()  # already set: no error, still one wake-up
    w.wait()  # returns at once and clears
    woke = threading.Event()

    def waiter() -> None:
        w.wait()
        woke.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    assert not woke.wait(0.05)  # cleared: the waiter blocks
    w.set()
    assert woke.wait(5.0)
    t.join(5.0)


def test_a_rebuilt_graph_is_told_by_key_even_with_the_probe(
    model: ctypes.c_void_p,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama.cpp rebuilds every graph (``LLAMA_GRAPH_REUSE_DISABLE``, read when the
    context is made), in the same buffer: the reuse count does not move, so no node is
    taken by its address; the repeats are told by key and are still exact."""
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    ref = _run(model, "graph", repeat=False)
    got = _run(model, "graph", repeat=True, compact=True, probe=True)
    hook = got.pop()[3]
    ref.pop()
    told = sum(len(raw) for *_, raw in got if isinstance(raw, hooks.GraphRecords))
    stats = hook.compact_stats()
    assert told > 0 and stats["by_key"] == told and stats["by_address"] == 0
    for (*_, raw), (*_, want) in zip(got, ref, strict=True):
        assert np.array_equal(_masked(hooks.as_records(raw)), _masked(want))
    hook.close()
