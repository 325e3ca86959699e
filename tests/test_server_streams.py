"""Concurrent requests: queued by default (every stream runs to its end), interrupted
only with ``--interrupt-requests true`` and then with an explicit error event, a
failure mid-stream ends with an error event, and on a real device (a fake devfreq
tree) the requests take the one governor in turn: their generation windows never
overlap, the clock stays where the controller put it, and it is restored at the end.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import anyio
import openai
import pytest
from fakesysfs import make_jetson_orin
from llama_cpp.server.types import CreateCompletionRequest
from test_server_support import MODEL, ServerProcess, record

from turboinfer_llama.server import adapter

# Whole-word pieces of the tiny vocabulary: EOS never wins, generation runs to max_tokens.
WORDS_ONLY = {str(i): 50.0 for i in range(259, 268)}
CHAT = [{"role": "user", "content": "hello the world"}]
PIN_HZ = 714000000
FILES = ("governor", "min_freq", "max_freq")


def _sse(server: ServerProcess, body: dict) -> list[str]:
    """The ``data:`` payloads of one streamed response, in order."""
    with server.http() as h, h.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]


@pytest.fixture(scope="module")
def queued(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", "1024")
    yield srv
    srv.stop()


def test_concurrent_streams_all_run_to_their_end(queued):
    body = {
        "model": MODEL,
        "messages": CHAT,
        "stream": True,
        "max_tokens": 24,
        "temperature": 0.0,
        "logit_bias": WORDS_ONLY,
    }
    with ThreadPoolExecutor(6) as pool:
        streams = list(pool.map(lambda _: _sse(queued, body), range(6)))
    texts = set()
    for data in streams:
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        pieces = [c["choices"][0]["delta"].get("content") for c in chunks]
        assert sum(1 for p in pieces if p) == 24
        texts.add("".join(p or "" for p in pieces))
    assert len(texts) == 1  # greedy: the same text each time, none cut short
    assert queued.power()["requests"]["engine_open"] == 0


@pytest.fixture(scope="module")
def interrupting(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", "2048", "--interrupt-requests", "true")
    yield srv
    srv.stop()


def test_interrupted_stream_ends_with_an_error_event(interrupting):
    client = interrupting.client()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        stream=True,
        max_tokens=1800,
        logit_bias=WORDS_ONLY,
        temperature=0.0,
    )
    rid = stream.response.headers["x-turboinfer-request-id"]
    first = [next(stream) for _ in range(3)]
    assert all(c.choices for c in first)
    result: dict = {}

    def newcomer() -> None:
        result["out"] = client.completions.create(model=MODEL, prompt="the", max_tokens=4)

    t = threading.Thread(target=newcomer)
    t.start()
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    t.join(60)
    assert e.value.code == "request_interrupted"
    assert "--interrupt-requests" in e.value.message
    assert result["out"].usage.completion_tokens > 0
    rec = record(interrupting.wait_for(lambda d: record(d, rid)["status"] != "running"), rid)
    assert 3 <= rec["tokens_generated"] < 1800
    assert interrupting.power()["requests"]["engine_open"] == 0


def test_failure_mid_stream_is_an_error_event(monkeypatch):
    """The publisher itself, with a generator that fails after two chunks."""
    monkeypatch.setattr(adapter._app, "prepare_request_resources", lambda *a: object())
    monkeypatch.setattr(adapter._app, "get_server_settings", lambda: iter([None]))

    def llama_call(llama, **kwargs):
        def chunks():
            yield {"choices": [{"text": "a"}]}
            yield {"choices": [{"text": "b"}]}
            raise RuntimeError("the engine fell over")

        return chunks()

    async def disconnected() -> bool:
        return False

    async def run() -> list[str]:
        send, recv = anyio.create_memory_object_stream(100)
        body = CreateCompletionRequest(prompt="x", stream=True)
        await adapter.stream_publisher(
            SimpleNamespace(is_disconnected=disconnected), send, body, None, llama_call, {}
        )
        return [m["data"] async for m in recv]

    data = anyio.run(run)
    assert len(data) == 3 and "[DONE]" not in data
    err = json.loads(data[-1])["error"]
    assert "the engine fell over" in err["message"]


def _read(node) -> dict[str, str]:
    return {f: (node / f).read_text().strip() for f in FILES}


def test_real_device_requests_take_the_governor_in_turn(tiny_gguf, tmp_path):
    node = make_jetson_orin(tmp_path)["devfreq"]
    before = _read(node)
    srv = ServerProcess(
        tiny_gguf,
        "--n-ctx",
        "1024",
        "--device",
        f"devfreq:{node}",
        "--controller",
        f"static:{PIN_HZ}",
        "--allow-cpu",  # this host's CPU build stands in for the Jetson's GPU
    )
    try:
        client = srv.client()
        during: list[dict[str, str]] = []

        def ask(i: int) -> str:
            kw = {"max_tokens": 32, "logit_bias": WORDS_ONLY, "temperature": 0.0}
            if i % 2:
                with client.chat.completions.with_streaming_response.create(
                    model=MODEL, messages=CHAT, stream=True, **kw
                ) as r:
                    during.append(_read(node))
                    for _ in r.iter_lines():
                        pass
                    return r.headers["x-turboinfer-request-id"]
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=f"{i}", **kw)
            assert "x-turboinfer-energy-j" not in raw.headers  # nothing settles it
            during.append(_read(node))
            return raw.headers["x-turboinfer-request-id"]

        with ThreadPoolExecutor(6) as pool:
            ids = list(pool.map(ask, range(6)))
        doc = srv.power()
        recs = [record(doc, i) for i in ids]
        assert doc["simulated"] is False and doc["controller"]["healthy"] is True
        assert doc["requests"]["engine_open"] == 0
        assert all(r["energy_status"] == "unavailable" for r in recs)
        windows = sorted(w for r in recs for w in r["generation_windows_ns"])
        assert len(windows) == 6
        for (b0, e0), (b1, e1) in itertools.pairwise(windows):
            assert b0 < e0 <= b1 < e1, "two requests generated at the same time"
        assert all(d["min_freq"] == d["max_freq"] == str(PIN_HZ) for d in during)
    finally:
        code = srv.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), srv.output
    assert _read(node) == before
