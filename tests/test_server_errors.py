"""Bad requests get 4xx JSON errors (never a 500, never a dead server), the API key is
enforced, and a client leaving mid-stream stops generation cleanly."""

from __future__ import annotations

import json

import openai
import pytest
from test_server_support import MODEL, ServerProcess, record

N_CTX = 2048
MAX_BODY = 64 * 1024
CHAT = [{"role": "user", "content": "hello the world"}]
# Whole-word pieces of the tiny vocabulary (ids 259..267): every token is a text chunk and
# the end-of-sequence token never wins, so generation runs until max_tokens.
WORDS_ONLY = {str(i): 50.0 for i in range(259, 268)}


@pytest.fixture(scope="module")
def server(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", str(N_CTX), "--max-request-bytes", str(MAX_BODY))
    yield srv
    srv.stop()


def _post(server, path: str, content: bytes | str, ctype: str = "application/json"):
    with server.http() as h:
        return h.post(path, content=content, headers={"content-type": ctype})


def _assert_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    return err


def _still_serving(server) -> None:
    out = server.client().completions.create(model=MODEL, prompt="the", max_tokens=4)
    assert out.usage.completion_tokens > 0


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b'{"prompt": "a", ', b"\xff\xfe{}", b"[1, 2]", b'"just a string"'],
)
def test_malformed_json_is_400(server, body):
    _assert_error(_post(server, "/v1/completions", body), 400, "invalid_json")
    _still_serving(server)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a", "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "temperature": [1]}, "temperature"),
        ("/v1/chat/completions", {"messages": "hello"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ("/v1/chat/completions", {"messages": [], "stream": "sometimes"}, "stream"),
        ("/v1/embeddings", {"input": {"a": 1}}, "input"),
    ],
)
def test_wrong_types_are_400(server, path, body, param):
    err = _assert_error(_post(server, path, json.dumps(body)), 400, "invalid_value")
    assert err["param"].startswith(param)
    _still_serving(server)


def test_any_model_name_is_served_by_the_loaded_model(server):
    out = server.client().chat.completions.create(
        model="gpt-3.5-turbo", messages=CHAT, max_tokens=4
    )
    assert out.usage.completion_tokens > 0
    assert out.choices[0].message.role == "assistant"


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_context_is_400(server, stream):
    prompt = "hello world " * N_CTX
    with pytest.raises(openai.BadRequestError) as e:
        out = server.client().completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, stream=stream
        )
        list(out) if stream else None
    assert e.value.status_code == 400
    assert e.value.code == "context_length_exceeded"
    _still_serving(server)


def test_oversize_body_is_413(server):
    body = json.dumps({"model": MODEL, "prompt": "x" * (2 * MAX_BODY)})
    _assert_error(_post(server, "/v1/completions", body), 413, "request_too_large")
    _still_serving(server)


def test_non_json_content_type_is_415(server):
    r = _post(server, "/v1/completions", "prompt=hello", "application/x-www-form-urlencoded")
    _assert_error(r, 415, "unsupported_media_type")


def test_no_bad_request_ever_became_500(server):
    doc = server.power()
    statuses = [r["http_status"] for r in doc["requests"]["recent"]]
    assert 500 not in statuses
    assert "Traceback" not in server.output


def test_disconnect_mid_stream_stops_generation(server):
    max_tokens = N_CTX - 128  # room for the chat template's prompt
    stream = server.client().chat.completions.create(
        model=MODEL,
        messages=CHAT,
        stream=True,
        max_tokens=max_tokens,
        logit_bias=WORDS_ONLY,
        temperature=0.0,
    )
    rid = stream.response.headers["x-turboinfer-request-id"]
    first = [next(stream) for _ in range(3)]
    assert first[0].choices
    stream.close()  # the client goes away mid-stream
    doc = server.wait_for(lambda d: record(d, rid)["status"] != "running")
    rec = record(doc, rid)
    assert rec["status"] == "disconnected"
    # EOS never wins and the budget fits the context: only the disconnect stops it.
    assert 3 <= rec["tokens_generated"] < max_tokens // 2
    assert doc["requests"]["engine_open"] == 0
    assert doc["hook"]["attached"] is True
    assert doc["controller"]["last_error"] is None
    _still_serving(server)
    assert server.power()["requests"]["engine_open"] == 0


@pytest.fixture(scope="module")
def keyed(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", str(N_CTX), "--api-key", "s3cret", "--strict-model")
    yield srv
    srv.stop()


def test_strict_model_gives_404(keyed):
    auth = keyed.client("s3cret")
    with pytest.raises(openai.NotFoundError) as e:
        auth.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=4)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    assert "gpt-4o" in str(e.value) and MODEL in str(e.value)
    out = auth.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    assert out.usage.completion_tokens > 0


def test_api_key_enforced(keyed):
    for key in ("none", "wrong"):
        with pytest.raises(openai.AuthenticationError):
            keyed.client(key).completions.create(model=MODEL, prompt="the", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            keyed.client(key).models.list()
    out = keyed.client("s3cret").completions.create(model=MODEL, prompt="the", max_tokens=2)
    assert out.usage.completion_tokens > 0


def test_api_key_guards_power_metrics_and_bad_bodies(keyed):
    with keyed.http() as h:
        assert h.get("/v1/power").status_code == 401
        assert h.get("/metrics").status_code == 401
        r = h.post(
            "/v1/completions", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert r.status_code == 401
    auth = {"headers": {"authorization": "Bearer s3cret"}}
    assert keyed.power(**auth)["power_saving"] is True
    with keyed.http(**auth) as h:
        assert h.get("/metrics").status_code == 200


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_null_penalty_means_default(server, field):
    # Found by the fuzz test: llama-cpp-python passes the null on to ctypes (a 500).
    body = {"model": MODEL, "prompt": "the", "max_tokens": 4, "temperature": 0.0, field: None}
    r = _post(server, "/v1/completions", json.dumps(body))
    assert r.status_code == 200, r.text
    body.pop(field)
    assert (
        r.json()["choices"][0]["text"]
        == _post(server, "/v1/completions", json.dumps(body)).json()["choices"][0]["text"]
    )
