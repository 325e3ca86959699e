"""The one place that touches llama-cpp-python's server internals.

Written for llama-cpp-python >=0.3.36,<0.4 (``llama_cpp.server.app``, ``.model``,
``.settings``, ``.cli``, ``.types``, ``.errors`` as in 0.3.36). Everything else in
``turboinfer_llama.server`` goes through the names exported here, so a new
llama-cpp-python release means re-checking this file only.

What it relies on:

* ``app.create_app(server_settings=, model_settings=)`` builds the FastAPI app with all
  of llama-cpp-python's routes and stores the ``LlamaProxy`` it makes in
  ``app._llama_proxy`` (the proxy class is looked up by name in ``app`` at that moment);
* ``LlamaProxy.load_llama_from_model_settings(settings)`` constructs the model as
  ``llama_cpp.Llama(...)``, looking ``llama_cpp`` up in ``model``'s globals at call time;
* ``LlamaProxy._current_model`` / ``_current_model_alias`` name the loaded model, and
  ``__call__(name)`` serves ``_default_model_alias`` for a name not in
  ``_model_settings_dict``;
* ``Llama._model.vocab`` is the model's ``llama_vocab`` pointer (grammar check);
* ``app.authenticate`` is the API-key dependency of every route;
* ``errors.RouteErrorHandler.error_message_wrapper`` formats OpenAI-style errors from
  its class attribute ``pattern_and_formatters``;
* the streaming routes call the module global ``app.get_event_publisher(request=,
  inner_send_chan=, body=, body_model=, llama_call=, kwargs=)`` (looked up at request
  time), which takes the model lock (``get_llama_proxy``), prepares the call
  (``prepare_request_resources``) and sends SSE ``data`` dicts; ``llama_outer_lock``
  is held by a request waiting for the model. ``build_llama_app`` installs
  ``stream_publisher`` in its place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import llama_cpp
import llama_cpp.server.app as _app
import llama_cpp.server.model as _model
from fastapi import FastAPI
from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
from llama_cpp.server.errors import RouteErrorHandler
from llama_cpp.server.model import LlamaProxy
from llama_cpp.server.settings import ModelSettings, ServerSettings
from llama_cpp.server.types import (
    CreateChatCompletionRequest,
    CreateCompletionRequest,
    CreateEmbeddingRequest,
    DetokenizeInputRequest,
    TokenizeInputRequest,
)
from pydantic import BaseModel
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

log = logging.getLogger(__name__)

SUPPORTED = ((0, 3, 36), (0, 4, 0))
SUPPORTED_TEXT = "llama-cpp-python>=0.3.36,<0.4"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if not SUPPORTED[0] <= _version_tuple(llama_cpp.__version__) < SUPPORTED[1]:
    log.warning(
        "llama-cpp-python %s: turboinfer's server adapter is written for %s; "
        "check turboinfer_llama/server/adapter.py",
        llama_cpp.__version__,
        SUPPORTED_TEXT,
    )

authenticate = _app.authenticate

# Body model of every POST route, so bad bodies are answered before the route runs
# (the routes' own error handler turns validation errors into 500s).
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/completions": CreateCompletionRequest,
    "/v1/engines/copilot-codex/completions": CreateCompletionRequest,
    "/v1/chat/completions": CreateChatCompletionRequest,
    "/v1/embeddings": CreateEmbeddingRequest,
    "/extras/tokenize": TokenizeInputRequest,
    "/extras/tokenize/count": TokenizeInputRequest,
    "/extras/detokenize": DetokenizeInputRequest,
}
# Routes that take a model name and fall back to the default model for unknown ones.
ROUTES_WITH_MODEL = frozenset(REQUEST_MODELS) - {"/v1/engines/copilot-codex/completions"}
GENERATION_ROUTES = frozenset(
    {"/v1/completions", "/v1/engines/copilot-codex/completions", "/v1/chat/completions"}
)

LlamaClassFor = Callable[[ModelSettings], type[llama_cpp.Llama]]

_SWAP_LOCK = threading.RLock()


@contextlib.contextmanager
def _swapped(module: Any, name: str, value: Any) -> Iterator[None]:
    with _SWAP_LOCK:
        original = getattr(module, name)
        setattr(module, name, value)
        try:
            yield
        finally:
            setattr(module, name, original)


class _LlamaCppWith:
    """``llama_cpp`` as ``llama_cpp.server.model`` sees it while loading: ``Llama`` is ours."""

    def __init__(self, llama_cls: type[llama_cpp.Llama]) -> None:
        self.Llama = llama_cls

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)


def _served_proxy(llama_class_for: LlamaClassFor) -> type[LlamaProxy]:
    class ServedLlamaProxy(LlamaProxy):
        """llama-cpp-python's proxy (aliases, switching) loading our ``Llama``."""

        @staticmethod
        def load_llama_from_model_settings(settings: ModelSettings) -> llama_cpp.Llama:
            view = _LlamaCppWith(llama_class_for(settings))
            with _swapped(_model, "llama_cpp", view):
                return LlamaProxy.load_llama_from_model_settings(settings)

    return ServedLlamaProxy


INTERRUPTED = {
    "message": "stream interrupted: another request arrived and the server runs with "
    "--interrupt-requests true (start it without that flag to queue requests instead)",
    "type": "server_error",
    "param": None,
    "code": "request_interrupted",
}


async def stream_publisher(
    request: Any,
    inner_send_chan: Any,
    body: CreateCompletionRequest | CreateChatCompletionRequest,
    body_model: str | None,
    llama_call: Callable[..., Any],
    kwargs: dict[str, Any],
) -> None:
    """llama-cpp-python's stream publisher, except that a stream never ends silently
    cut short: an interrupted stream (``--interrupt-requests true``) or a failure after
    the first event ends with an SSE ``{"error": {...}}`` event (OpenAI clients raise
    it) instead of ``[DONE]`` or a broken connection. A failure before the first event
    propagates, so the response gets a proper HTTP status."""
    settings = next(_app.get_server_settings())
    interrupt = bool(settings is not None and settings.interrupt_requests)
    async with contextlib.asynccontextmanager(_app.get_llama_proxy)() as llama_proxy:
        llama = _app.prepare_request_resources(body, llama_proxy, body_model, kwargs)
        async with inner_send_chan:
            iterator: Any = None
            sent = 0
            try:
                iterator = await run_in_threadpool(llama_call, llama, **kwargs)
                async for chunk in iterate_in_threadpool(iterator):
                    await inner_send_chan.send({"data": json.dumps(chunk)})
                    sent += 1
                    if await request.is_disconnected():
                        raise anyio.get_cancelled_exc_class()()
                    if interrupt and _app.llama_outer_lock.locked():
                        await inner_send_chan.send({"data": json.dumps({"error": INTERRUPTED})})
                        log.info("stream interrupted by a waiting request")
                        return
                await inner_send_chan.send({"data": "[DONE]"})
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as e:
                if sent == 0:
                    raise
                log.exception("stream failed after %d events", sent)
                _, err = format_route_error(e, body)
                await inner_send_chan.send({"data": json.dumps({"error": err})})
            finally:
                # End generation (and its engine request) before the model lock goes.
                close = getattr(iterator, "close", None)
                if close is not None:
                    with anyio.CancelScope(shield=True), contextlib.suppress(ValueError):
                        await run_in_threadpool(close)


def build_llama_app(
    server_settings: ServerSettings,
    model_settings: list[ModelSettings],
    llama_class_for: LlamaClassFor,
) -> FastAPI:
    """llama-cpp-python's app, every route unchanged, serving ``llama_class_for(settings)``.

    Loads the default model (as llama-cpp-python does) before returning.
    """
    with _swapped(_app, "LlamaProxy", _served_proxy(llama_class_for)):
        app: FastAPI = _app.create_app(
            server_settings=server_settings, model_settings=model_settings
        )
    _app.get_event_publisher = stream_publisher
    return app


def proxy() -> LlamaProxy | None:
    return _app._llama_proxy


def model_aliases() -> list[str]:
    p = proxy()
    return list(p) if p is not None else []


def loaded_model() -> tuple[str | None, llama_cpp.Llama | None]:
    """The alias and object of the model now loaded (read without the request lock)."""
    p = proxy()
    if p is None:
        return None, None
    return getattr(p, "_current_model_alias", None), getattr(p, "_current_model", None)


def model_for(name: Any, path: str) -> llama_cpp.Llama | None:
    """The loaded model if a request for ``name`` on ``path`` is served by it (as the
    proxy resolves names: unknown ones get the default model), else None."""
    p = proxy()
    if p is None:
        return None
    if path == "/v1/engines/copilot-codex/completions":
        name = "copilot-codex"
    known = getattr(p, "_model_settings_dict", {})
    alias = name if isinstance(name, str) and name in known else p._default_model_alias
    current = getattr(p, "_current_model", None)
    return current if alias == getattr(p, "_current_model_alias", None) else None


def grammar_compiles(llm: llama_cpp.Llama, grammar: str) -> bool:
    """Whether llama.cpp parses this GBNF grammar (llama-cpp-python would otherwise put
    a NULL sampler in its chain and crash)."""
    sampler = llama_cpp.llama_sampler_init_grammar(
        llm._model.vocab, grammar.encode("utf-8"), b"root"
    )
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True


def free_models() -> None:
    """Close the loaded model (restores the GPU through its power session). Idempotent."""
    p = proxy()
    if p is not None and getattr(p, "_current_model", None) is not None:
        p.free()
        p._current_model = None


def format_route_error(error: Exception, body: BaseModel | None) -> tuple[int, dict[str, Any]]:
    """(status, OpenAI-style error) exactly as llama-cpp-python's routes would answer."""
    status, err = RouteErrorHandler.error_message_wrapper(
        RouteErrorHandler,  # type: ignore[arg-type]
        error=error,
        body=body,  # type: ignore[arg-type]
    )
    return status, dict(err)


__all__ = [
    "GENERATION_ROUTES",
    "REQUEST_MODELS",
    "ROUTES_WITH_MODEL",
    "SUPPORTED_TEXT",
    "ModelSettings",
    "ServerSettings",
    "add_args_from_model",
    "authenticate",
    "build_llama_app",
    "format_route_error",
    "free_models",
    "grammar_compiles",
    "loaded_model",
    "model_aliases",
    "model_for",
    "parse_model_from_args",
    "proxy",
    "stream_publisher",
]
