"""Checks that need the model: values the request models accept but llama-cpp-python's
routes answer with a 500 or, worse, a crash of the whole server.

Found by the HTTP fuzz test (tests/test_server_fuzz.py) on llama-cpp-python 0.3.36:

* a token id outside the vocabulary in ``/extras/detokenize`` aborts the process
  (``std::out_of_range`` in llama.cpp), and tokens that end inside a UTF-8 sequence
  are a 500 (strict decoding);
* an invalid GBNF ``grammar`` makes the sampler chain use a NULL sampler (crash);
* a ``logit_bias`` key that is not a token id (``"abc"``) or is out of range is a 500,
  and a negative one silently biases another token (numpy indexing from the end);
* a ``prompt`` list of more than one string trips an ``assert`` (500);
* ``logprobs`` on an empty prompt index past the scores (a 500, or a failure in the
  middle of a stream);
* an empty ``input`` list to ``/v1/embeddings`` makes ``llama_decode`` fail (500).

Each becomes a 400 with the parameter named. A null ``presence_penalty`` or
``frequency_penalty`` (allowed by the request models, a ctypes ``TypeError`` and a 500
in llama-cpp-python) is taken as unset. The checks use the model now loaded; a
request for another model of a multi-model config is passed through unchecked (its
vocabulary is not known before it loads).
"""

from __future__ import annotations

from typing import Any

from . import adapter

Problem = tuple[str, str]  # (param, message)


def _detokenize_problem(llm: Any, tokens: Any) -> Problem | None:
    if not isinstance(tokens, list):
        return None
    n_vocab = llm.n_vocab()
    ids = [int(t) for t in tokens]  # the request model accepted them as ints
    for i, t in enumerate(ids):
        if not 0 <= t < n_vocab:
            return f"tokens.{i}", f"token id {t} is outside the vocabulary (0..{n_vocab - 1})"
    try:
        llm.detokenize(ids).decode("utf-8")
    except UnicodeDecodeError as e:
        return "tokens", f"the tokens do not form valid UTF-8 text ({e.reason})"
    return None


def _logit_bias_problem(data: dict[str, Any], n_vocab: int) -> Problem | None:
    bias = data.get("logit_bias")
    if not isinstance(bias, dict) or data.get("logit_bias_type") == "tokens":
        return None
    for key in bias:
        try:
            token = int(key)
        except ValueError:
            return "logit_bias", f"logit_bias key {key!r} is not a token id"
        if not 0 <= token < n_vocab:
            return "logit_bias", f"logit_bias token id {token} is outside 0..{n_vocab - 1}"
    return None


# Optional in the request models, but a null reaches llama.cpp's sampler as a ctypes
# argument ("argument 5: TypeError: wrong type", a 500): null means the default.
NULL_MEANS_DEFAULT = ("presence_penalty", "frequency_penalty")


def null_means_default(path: str, data: dict[str, Any]) -> bool:
    """Drop the fields of ``NULL_MEANS_DEFAULT`` that are null (the route then uses its
    default). True if ``data`` changed."""
    if path not in adapter.GENERATION_ROUTES:
        return False
    nulls = [k for k in NULL_MEANS_DEFAULT if k in data and data[k] is None]
    for k in nulls:
        del data[k]
    return bool(nulls)


def problem(path: str, data: dict[str, Any]) -> Problem | None:
    """(param, message) if the model-dependent checks reject ``data``, else None.
    ``data`` has passed the route's request model already."""
    if path == "/v1/embeddings":
        if data.get("input") == []:
            return "input", "input must not be an empty list"
        return None
    if path in ("/v1/completions", "/v1/engines/copilot-codex/completions"):
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) > 1:
            return "prompt", "only one prompt per request is supported"
        text = prompt[0] if isinstance(prompt, list) and prompt else prompt
        if data.get("logprobs") is not None and not text:
            return "prompt", "logprobs need a non-empty prompt"
    llm = adapter.model_for(data.get("model"), path)
    if llm is None:
        return None
    if path == "/extras/detokenize":
        return _detokenize_problem(llm, data.get("tokens"))
    if path in adapter.GENERATION_ROUTES:
        found = _logit_bias_problem(data, llm.n_vocab())
        if found is not None:
            return found
        grammar = data.get("grammar")
        if isinstance(grammar, str) and not adapter.grammar_compiles(llm, grammar):
            return "grammar", "grammar does not parse (GBNF with a 'root' rule expected)"
    return None
