"""HTTP fuzz: over 2,000 hypothesis-built requests to every POST route (well-formed,
wrongly typed, out of range, junk bodies) get no 5xx, every stream ends with ``[DONE]``
or an error event, and afterwards the server is alive and answers as before.

Bodies are built from the routes' request fields with a mix of valid values and junk,
so most reach the model (tiny GGUF, few tokens) and the rest exercise validation.
``derandomize`` keeps the run reproducible.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server_support import MODEL, ServerProcess

N_CTX = 256
COUNT = {"requests": 0}
STATUSES: dict[int, int] = {}

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.lists(st.integers(-5, 300), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)
TEXT = st.text(max_size=40)
TOKEN_IDS = st.lists(st.integers(-(2**33), 2**33) | st.integers(-2, 300), max_size=8)
SMALL_FLOAT = st.floats(-3, 3, allow_nan=False)


# Valid-typed values, edge values included; ``body`` mixes junk into half the bodies.
SAMPLING = {
    "max_tokens": st.integers(-2, 12) | st.none(),
    "min_tokens": st.integers(-1, 6),
    "temperature": SMALL_FLOAT,
    "top_p": SMALL_FLOAT,
    "min_p": SMALL_FLOAT,
    "top_k": st.integers(-3, 100),
    "stop": st.none() | TEXT | st.lists(TEXT, max_size=3),
    "stream": st.booleans(),
    "presence_penalty": SMALL_FLOAT,
    "frequency_penalty": SMALL_FLOAT,
    "repeat_penalty": SMALL_FLOAT,
    "seed": st.integers(-(2**40), 2**40),
    "logit_bias": st.dictionaries(
        st.integers(-(2**33), 2**33).map(str) | TEXT, SMALL_FLOAT, max_size=3
    ),
    "logit_bias_type": st.sampled_from(["input_ids", "tokens"]) | st.none(),
    "mirostat_mode": st.integers(-1, 3),
    "mirostat_tau": SMALL_FLOAT,
    "mirostat_eta": SMALL_FLOAT,
    "grammar": st.none() | st.sampled_from(['root ::= "yes" | "no"', "root ::= ", "{{"]),
    "n": st.integers(-1, 3),
    "model": st.sampled_from([MODEL, "gpt-3.5-turbo"]) | TEXT,
    "user": TEXT,
}
COMPLETION = {
    **SAMPLING,
    "prompt": TEXT | st.lists(TEXT, max_size=2),
    "suffix": st.none() | TEXT,
    "echo": st.booleans(),
    "logprobs": st.none() | st.integers(-2, 5),
    "best_of": st.integers(-1, 3),
}
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "function", "tool"]),
        "content": TEXT | st.none(),
    },
    optional={"name": TEXT},
)
CHAT = {
    **SAMPLING,
    "messages": st.lists(MESSAGE, max_size=3),
    "logprobs": st.booleans(),
    "top_logprobs": st.none() | st.integers(-1, 5),
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}]),
}


def body(fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...]):
    """Half the bodies valid-typed (most reach the model), half with junk mixed into
    any field."""

    def build(junk: bool) -> st.SearchStrategy[dict[str, Any]]:
        mix = (lambda v: st.one_of(v, JUNK)) if junk else (lambda v: v)
        req = {k: mix(fields[k]) for k in required}
        opt = {k: mix(v) for k, v in fields.items() if k not in required}
        return st.fixed_dictionaries(req, optional=opt)

    return st.one_of(build(False), build(True))


ROUTES = {
    "/v1/completions": body(COMPLETION, ("prompt",)),
    "/v1/chat/completions": body(CHAT, ("messages",)),
    "/v1/embeddings": body({"input": TEXT | st.lists(TEXT, max_size=3), "model": TEXT}, ()),
    "/extras/tokenize": body({"input": TEXT, "model": TEXT}, ()),
    "/extras/tokenize/count": body({"input": TEXT, "model": TEXT}, ()),
    "/extras/detokenize": body({"tokens": TOKEN_IDS, "model": TEXT}, ()),
}
RAW = st.one_of(
    st.binary(max_size=64),
    JUNK.map(lambda v: json.dumps(v).encode()),
    st.text(max_size=64).map(str.encode),
)

FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def server(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "--n-ctx", str(N_CTX), "--embedding")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as h:
        yield h


def _reference(http: httpx.Client) -> str:
    r = http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "the world", "max_tokens": 8, "temperature": 0.0},
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _send(http: httpx.Client, path: str, content: bytes) -> None:
    with http.stream(
        "POST", path, content=content, headers={"content-type": "application/json"}
    ) as r:
        text = r.read().decode("utf-8", "replace")
    COUNT["requests"] += 1
    STATUSES[r.status_code] = STATUSES.get(r.status_code, 0) + 1
    assert r.status_code < 500, (path, content[:300], r.status_code, text[:500])
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        assert data, (path, content[:300])
        assert data[-1] == "[DONE]" or "error" in json.loads(data[-1]), (path, data[-3:])


@pytest.fixture(scope="module")
def reference(http):
    return _reference(http)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_fuzz_route(path, http, reference):
    examples = 500 if path in ("/v1/completions", "/v1/chat/completions") else 200

    @settings(FUZZ, max_examples=examples)
    @given(ROUTES[path])
    def run(b: dict[str, Any]) -> None:
        _send(http, path, json.dumps(b).encode())

    run()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzz_raw_bodies(path, http):
    @settings(FUZZ, max_examples=100)
    @given(RAW)
    def run(raw: bytes) -> None:
        _send(http, path, raw)

    run()


def test_still_alive_and_answering_the_same(server, http, reference):
    tb = server.output.find("Traceback")
    assert tb < 0, server.output[max(tb - 2000, 0) : tb + 6000]
    assert COUNT["requests"] >= 2000, COUNT
    print(f"\nfuzz: {COUNT['requests']} requests, statuses {dict(sorted(STATUSES.items()))}")
    assert server.proc.poll() is None
    assert _reference(http) == reference
    doc = server.power()
    assert doc["requests"]["engine_open"] == 0
