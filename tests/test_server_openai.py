"""The server through the official ``openai`` client: llama-cpp-python's endpoints
unchanged, serving our Llama, plus /v1/power, /metrics and the energy headers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_server_support import MODEL, ServerProcess, record

GREEDY = {"temperature": 0.0, "seed": 1, "max_tokens": 12}
CHAT = [{"role": "user", "content": "hello the world"}]


@pytest.fixture(scope="module")
def server(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", "512", "--embedding")
    yield srv
    srv.stop()


def test_defaults_loopback_power_saving_and_auto_device(server):
    assert server.url.startswith("http://127.0.0.1:")
    doc = server.power()
    assert doc["power_saving"] is True
    assert doc["device"]["spec"] == "auto"
    assert "power saving on, simulated GPU" in server.output
    assert "falling back to the simulated GPU" in server.output


def test_models_lists_the_alias(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_energy_is_settled_afterwards_by_request_id(server):
    raw = server.client().completions.with_raw_response.create(
        model=MODEL, prompt="hello world, the", **GREEDY
    )
    out = raw.parse()
    assert out.usage.completion_tokens > 0
    assert out.choices[0].text
    rid = raw.headers["x-turboinfer-request-id"]
    # Nothing waited for accounting: with the simulated GPU the energy is settled after
    # the response, so the energy header is never sent.
    assert "x-turboinfer-energy-j" not in raw.headers
    doc = server.wait_for(lambda d: record(d, rid)["energy_status"] == "settled")
    rec = record(doc, rid)
    assert rec["endpoint"] == "/v1/completions" and rec["status"] == "ok"
    assert rec["http_status"] == 200
    assert rec["prompt_tokens"] == out.usage.prompt_tokens
    # generate() also yields the token that ends the completion (EOS or the last one)
    assert rec["tokens_generated"] >= out.usage.completion_tokens
    assert rec["energy_j"] > 0 and rec["default_energy_j"] > 0
    assert rec["simulated"] is True
    (window,) = rec["generation_windows_ns"]
    assert window[0] < window[1]
    assert doc["accounting"]["settled"] is True


def test_chat_and_streaming_chat_agree(server):
    client = server.client()
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, **GREEDY)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, stream=True, **GREEDY))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len(chunks) > 2
    assert "".join(pieces) == text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_streaming_response_carries_request_id(server):
    with server.client().chat.completions.with_streaming_response.create(
        model=MODEL, messages=CHAT, stream=True, **GREEDY
    ) as resp:
        rid = resp.headers["x-turboinfer-request-id"]
        assert resp.headers["content-type"].startswith("text/event-stream")
        n = sum(1 for _ in resp.iter_lines())
    assert n > 2
    rec = server.wait_for(lambda d: record(d, rid)["status"] != "running")
    assert record(rec, rid)["status"] == "ok" and record(rec, rid)["stream"] is True


def test_eight_concurrent_requests(server):
    client = server.client()
    before = server.power()["requests"]

    def ask(i: int):
        return client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"hello {i} of the world"}],
            **GREEDY,
        )

    with ThreadPoolExecutor(8) as pool:
        raws = list(pool.map(ask, range(8)))
    ids = {r.headers["x-turboinfer-request-id"] for r in raws}
    assert len(ids) == 8
    assert all(r.parse().choices[0].message.content is not None for r in raws)
    after = server.power()
    assert after["requests"]["served"] == before["served"] + 8
    assert after["requests"]["engine_requests"] == before["engine_requests"] + 8
    assert after["requests"]["engine_open"] == 0
    assert all(record(after, i)["status"] == "ok" for i in ids)


def test_embeddings(server):
    with server.http() as h:
        r = h.post("/v1/embeddings", json={"model": MODEL, "input": "hello world"})
    assert r.status_code == 200
    data = r.json()["data"]
    assert len(data) == 1 and len(data[0]["embedding"]) > 0


def test_power_document(server):
    server.client().completions.create(model=MODEL, prompt="the world", **GREEDY)
    doc = server.power()
    assert doc["object"] == "power" and doc["model"] == MODEL
    for key in ("simulated", "device", "controller", "energy", "stalls", "hook", "requests"):
        assert key in doc
    assert set(doc["device"]) >= {"spec", "name", "simulated", "freq_hz", "avg_power_w"}
    assert set(doc["controller"]) >= {"name", "healthy", "last_error", "switches"}
    assert set(doc["energy"]) >= {"energy_j", "saved_j", "baseline_j", "simulated"}
    assert doc["controller"]["name"]
    assert doc["energy"]["baseline"] == "default-governor estimate"
    assert doc["stalls"]["submit"]["count"] > 0
    assert doc["stalls"]["sample"]["count"] > 0
    assert doc["requests"]["tokens"] > 0
    assert doc["hook"]["attached"] is True
    assert doc["stats_error"] is None
    recent = doc["requests"]["recent"]
    assert recent and all(
        {"id", "energy_j", "tokens_generated", "status"} <= set(r) for r in recent
    )
    if doc["energy"]["energy_j"] is not None:
        # Energy is only ever labelled: the simulated flag is always known with it.
        assert doc["energy"]["simulated"] in (True, False)


def test_metrics(server):
    server.client().completions.create(model=MODEL, prompt="a world", **GREEDY)
    # the worker derives the finished request's stalls after it returns: compare a
    # /metrics read with /v1/power reads on either side of it that agree
    for _ in range(50):
        before = server.power()
        with server.http() as h:
            r = h.get("/metrics")
        doc = server.power()  # the figures the /metrics read must match
        if doc["stalls"] == before["stalls"] and doc["requests"] == before["requests"]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the stall totals never held still across a /metrics read")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    types = {name: f.type for name, f in families.items()}
    assert types["turboinfer_gpu_frequency_hz"] == "gauge"
    assert types["turboinfer_gpu_power_watts"] == "gauge"
    assert types["turboinfer_energy_joules"] == "counter"
    assert types["turboinfer_tokens"] == "counter"
    assert types["turboinfer_frequency_switches"] == "counter"
    (tokens,) = families["turboinfer_tokens"].samples
    assert tokens.value == pytest.approx(doc["requests"]["tokens"], abs=0)
    assert tokens.labels["model"] == MODEL
    stalls = {s.labels["kind"]: s.value for s in families["turboinfer_stall_seconds"].samples}
    assert stalls["sample"] == pytest.approx(doc["stalls"]["sample"]["total_ms"] / 1e3, rel=1e-6)
    ok = [s for s in families["turboinfer_http_requests"].samples if s.labels["status"] == "ok"]
    assert ok and ok[0].value >= 1
    energy = families["turboinfer_energy_joules"].samples
    if doc["energy"]["energy_j"] is not None:
        assert energy[0].labels["simulated"] == str(doc["energy"]["simulated"]).lower()
