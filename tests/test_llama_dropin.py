"""The drop-in Llama: identical output, events at token boundaries, clean teardown."""

from __future__ import annotations

import contextlib
import gc
import json
import weakref
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from turboinfer_llama import Llama, PowerSettings
from turboinfer_llama.engine.events import EventKind

PROMPT = "hello world, the"
GREEDY = {"max_tokens": 16, "temperature": 0.0, "seed": 1}


def _plain(path, **kw):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, seed=1, **kw)
    return contextlib.closing(llm)


def _ours(path, power=None, **kw):
    return Llama(model_path=str(path), n_ctx=256, verbose=False, seed=1, power=power, **kw)


@pytest.fixture(params=["graph", "layer", "kernel"])
def granularity(request):
    return request.param


def test_greedy_completion_identical(tiny_gguf, granularity):
    with _plain(tiny_gguf) as a:
        want = a.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
    with _ours(tiny_gguf, {"granularity": granularity}) as b:
        got = b.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
        assert b.power is not None
        assert b.power.stats()["tokens"] > 0
    assert got == want
    assert len(want) > 0


def test_chat_stream_tokenize_identical(tiny_gguf):
    msgs = [{"role": "user", "content": "hello the world"}]
    with _plain(tiny_gguf) as a:
        chat_a = a.create_chat_completion(msgs, **GREEDY)["choices"][0]["message"]["content"]
        stream_a = [
            c["choices"][0]["text"] for c in a.create_completion(PROMPT, stream=True, **GREEDY)
        ]
        toks_a = a.tokenize(b"the world is a hello")
        detok_a = a.detokenize(toks_a)
    with _ours(tiny_gguf, {"granularity": "kernel"}) as b:
        chat_b = b.create_chat_completion(msgs, **GREEDY)["choices"][0]["message"]["content"]
        stream_b = [
            c["choices"][0]["text"] for c in b.create_completion(PROMPT, stream=True, **GREEDY)
        ]
        toks_b = b.tokenize(b"the world is a hello")
        detok_b = b.detokenize(toks_b)
    assert chat_b == chat_a
    assert stream_b == stream_a and len(stream_a) > 1
    assert toks_b == toks_a and detok_b == detok_a == b"the world is a hello"


def test_embeddings_still_work(tiny_gguf):
    with _plain(tiny_gguf, embedding=True) as a:
        want = a.embed("hello world")
    with _ours(tiny_gguf, embedding=True) as b:
        got = b.embed("hello world")
    assert np.asarray(got).shape == np.asarray(want).shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_power_saving_off_is_inert(tiny_gguf):
    with _ours(tiny_gguf, power_saving=False) as llm:
        assert llm.power is None
        assert not llm.context_params.cb_eval
        llm.create_completion(PROMPT, **GREEDY)


def test_callback_is_in_context_params(tiny_gguf):
    with _ours(tiny_gguf) as llm:
        assert llm.context_params.cb_eval
        assert llm.power is not None and llm.power.hook is not None


def test_token_events_and_stalls(tiny_gguf):
    with _ours(tiny_gguf, {"granularity": "kernel"}) as llm:
        out = llm.create_completion(PROMPT, **GREEDY)
        n = out["usage"]["completion_tokens"]
        llm.create_completion(PROMPT + " a", **GREEDY)
        st = llm.power.stats()
        kinds = [e.kind for e in llm.power.timeline.events()]
    assert st["requests"] == 2
    assert kinds[0] is EventKind.REQUEST_BEGIN
    assert kinds.count(EventKind.PREFILL_BEGIN) == 2
    assert st["events"]["token"] == st["tokens"] >= n
    assert st["events"]["sample_begin"] == st["events"]["sample_end"]
    assert st["stalls"]["sample"]["count"] > 0
    assert st["stalls"]["submit"]["count"] > 0
    assert st["stalls"]["inter_kernel"]["count"] > 0
    assert st["stalls"]["idle"]["count"] == 1
    assert st["kernels"]["count"] > 0
    assert st["events"].get("kv_edit", 0) >= 1


def test_kernel_mode_decode_steps_yield_whole_graph_in_order(tiny_gguf):
    with _ours(tiny_gguf, {"granularity": "kernel"}) as llm:
        llm.create_completion(PROMPT, **GREEDY)
        events = llm.power.timeline.events()
    graphs: dict[int, list] = {}
    decode_graphs = []
    in_prefill = False
    for e in events:
        if e.kind is EventKind.PREFILL_BEGIN:
            in_prefill = True
        elif e.kind is EventKind.PREFILL_END:
            in_prefill = False
        elif e.kind is EventKind.DECODE_BEGIN and not in_prefill:
            decode_graphs.append(e.graph)
        elif e.kind in (EventKind.NODE_ASK, EventKind.NODE_DONE):
            graphs.setdefault(e.graph, []).append(e)
    assert len(decode_graphs) >= 5
    op_sequences = set()
    for g in decode_graphs:
        recs = graphs[g]
        asks = [r for r in recs if r.kind is EventKind.NODE_ASK]
        dones = [r for r in recs if r.kind is EventKind.NODE_DONE]
        assert [r.node for r in asks] == list(range(len(asks)))
        assert [r.node for r in dones] == [r.node for r in asks]
        # each node is asked, then done, before the next is asked
        assert [(r.kind, r.node) for r in recs] == [
            (k, i) for i in range(len(asks)) for k in (EventKind.NODE_ASK, EventKind.NODE_DONE)
        ]
        ts = [r.t_ns for r in recs]
        assert ts == sorted(ts)
        op_sequences.add(tuple(r.op for r in asks))
    # every single-token decode step runs the same graph
    assert len(op_sequences) == 1
    assert "MUL_MAT" in next(iter(op_sequences))


def test_tiny_ring_overflows_safely(tiny_gguf):
    with _plain(tiny_gguf) as a:
        want = a.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
    with _ours(tiny_gguf, {"granularity": "kernel", "ring_capacity": 4}) as b:
        got = b.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
        assert b.power.stats()["hook"]["overflow"] > 0
    assert got == want


def test_close_mid_stream_and_double_close(tiny_gguf):
    llm = _ours(tiny_gguf, {"granularity": "kernel"})
    hook_ref = weakref.ref(llm.power.hook)
    stream = llm.create_completion(PROMPT, stream=True, **GREEDY)
    next(stream)
    next(stream)
    stream.close()
    llm.close()
    llm.close()
    assert llm.power.hook is None
    assert llm.power.stats()["hook"]["attached"] is False
    del stream
    gc.collect()
    assert hook_ref() is None


def test_exception_from_stopping_criterion(tiny_gguf):
    class Boom(RuntimeError):
        pass

    def stop(_ids, _logits):
        raise Boom("stop here")

    with _ours(tiny_gguf, {"granularity": "layer"}) as llm:
        with pytest.raises(Boom):
            llm.create_completion(
                PROMPT, stopping_criteria=llama_cpp.StoppingCriteriaList([stop]), **GREEDY
            )
        st = llm.power.stats()
        assert st["events"]["request_end"] == st["events"]["request_begin"] == 1
        # the model still works afterwards
        assert llm.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]


def test_garbage_collection_detaches(tiny_gguf):
    llm = _ours(tiny_gguf)
    hook_ref = weakref.ref(llm.power.hook)
    llm.create_completion(PROMPT, max_tokens=2, temperature=0.0)
    del llm
    gc.collect()
    assert hook_ref() is None


@pytest.mark.parametrize(
    ("power", "needle"),
    [
        ({"granularity": "bogus"}, "'graph', 'layer' or 'kernel'"),
        ({"ring_capacity": -5}, "greater than 0"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_power_settings(tiny_gguf, power, needle):
    with pytest.raises(ValueError, match="invalid power settings") as ei:
        _ours(tiny_gguf, power)
    assert needle in str(ei.value)


def test_bad_model_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ValueError, match="does not exist"):
        Llama(model_path=str(missing), verbose=False)


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("TURBOINFER_GRANULARITY", "kernel")
    monkeypatch.setenv("TURBOINFER_RING_CAPACITY", "123")
    s = PowerSettings()
    assert s.granularity == "kernel" and s.ring_capacity == 123


def test_export_trace(tiny_gguf, tmp_path):
    with _ours(tiny_gguf, {"granularity": "kernel"}) as llm:
        llm.create_completion(PROMPT, **GREEDY)
        path = llm.power.export_trace(tmp_path / "t.json")
    doc = json.loads(Path(path).read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "MUL_MAT" in names and "sample" in names and "submit" in names
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in slices)


def test_worker_yields_to_a_decoding_request_and_loses_nothing(tiny_gguf):
    with _ours(tiny_gguf, {"granularity": "kernel", "controller": "none"}) as llm:
        power = llm.power
        power.materialize()
        power._in_flight += 1  # as if another request were decoding all along
        try:
            llm.create_completion(PROMPT, **GREEDY)
            power.materialize(yield_to_requests=True)
            assert power._pending, "the worker derived while a request was decoding"
        finally:
            power._in_flight -= 1
        power.materialize(yield_to_requests=True)
        assert not power._pending
        st = power.stats()
    assert st["events"]["request_end"] == 1 and st["events"]["node_done"] > 0
    assert st["events"]["node_ask"] == st["events"]["node_done"]
