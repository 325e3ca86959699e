"""ASGI middleware in front of llama-cpp-python's routes: bad requests get 4xx JSON,
responses get a request id, and every model request is recorded in the ledger.

llama-cpp-python's route error handler answers malformed JSON and wrongly typed fields
with a 500; this checks the body against the same request models first. Like
llama-cpp-python, any model name is served by the loaded model; with ``strict_model``
an unknown name gets 404 ``model_not_found``. A streaming response's start is held
until its first event, so an error raised before any token (an over-long prompt) can
still be answered with a proper status instead of a broken stream.

Energy header: ``X-TurboInfer-Energy-J`` carries only energy already settled when the
response headers leave. Energy is settled after the request, off the request path, so
with the simulated GPU the header is never sent; read the request's ``energy_j`` in
``/v1/power`` by its ``X-TurboInfer-Request-Id``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._clock import now_ns
from . import adapter, validation
from .metering import CURRENT_REQUEST, RequestLedger, RequestRecord

log = logging.getLogger(__name__)

ENERGY_HEADER = "X-TurboInfer-Energy-J"
SIMULATED_HEADER = "X-TurboInfer-Energy-Simulated"
REQUEST_ID_HEADER = "X-TurboInfer-Request-Id"

_JSON_TYPE = re.compile(r"^application/([\w.+-]+\+)?json\s*(;.*)?$", re.IGNORECASE)


def _error(message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


async def _respond(
    send: Send, status: int, body: dict[str, Any], extra: list | None = None
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _validation_message(e: ValidationError) -> tuple[str, str | None]:
    errors = e.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors[:5]
    ]
    first = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more, first or None


class RequestGuard:
    """Validate model-route requests, meter them, and label their responses."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        max_body_bytes: int,
        ledger: RequestLedger,
        model_names: Callable[[], list[str]] = adapter.model_aliases,
        strict_model: bool = False,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.ledger = ledger
        self.model_names = model_names
        self.strict_model = strict_model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "") or "") or "/"
        model_cls = adapter.REQUEST_MODELS.get(path)
        if model_cls is None:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self._authorized(headers.get("authorization", "")):
            # Same answer as llama-cpp-python's own API-key check.
            await _respond(send, 401, {"detail": "Invalid API key"})
            return
        content_type = headers.get("content-type")
        if content_type and not _JSON_TYPE.match(content_type):
            await _respond(
                send,
                415,
                _error(
                    f"content-type must be application/json, not {content_type!r}",
                    "unsupported_media_type",
                ),
            )
            return
        try:
            raw = await _read_body(receive, self.max_body_bytes)
        except _Gone:
            return
        except _TooLarge:
            await _respond(
                send,
                413,
                _error(
                    f"request body larger than {self.max_body_bytes} bytes "
                    "(raise --max-request-bytes to allow it)",
                    "request_too_large",
                ),
                [(b"connection", b"close")],
            )
            return
        problem = self._check(raw, model_cls, path)
        if problem is not None:
            status, body = problem
            await _respond(send, status, body)
            return
        parsed = json.loads(raw)
        if validation.null_means_default(path, parsed):
            raw = json.dumps(parsed).encode()
        await self._forward(scope, receive, send, raw, model_cls, path, parsed)

    def _authorized(self, authorization: str) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.api_key)

    def _check(
        self, raw: bytes, model_cls: type[BaseModel], path: str
    ) -> tuple[int, dict[str, Any]] | None:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return 400, _error(f"request body is not valid JSON: {e}", "invalid_json")
        if not isinstance(data, dict):
            return 400, _error("request body must be a JSON object", "invalid_json")
        try:
            model_cls.model_validate(data)
        except ValidationError as e:
            message, param = _validation_message(e)
            return 400, _error(message, "invalid_value", param)
        found = validation.problem(path, data)
        if found is not None:
            param, message = found
            return 400, _error(f"invalid request: {param}: {message}", "invalid_value", param)
        model = data.get("model")
        if self.strict_model and path in adapter.ROUTES_WITH_MODEL and model is not None:
            names = self.model_names()
            if model not in names:
                return 404, _error(
                    f"The model `{model}` does not exist; this server has: "
                    f"{', '.join(names)} (--strict-model is on)",
                    "model_not_found",
                    "model",
                )
        return None

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        raw: bytes,
        model_cls: type[BaseModel],
        path: str,
        parsed: dict[str, Any],
    ) -> None:
        rec = RequestRecord(
            id=uuid.uuid4().hex[:16],
            endpoint=path,
            model=parsed.get("model"),
            stream=bool(parsed.get("stream", False)),
            started_ns=now_ns(),
        )
        self.ledger.add(rec)
        state = {"body_sent": False, "started": False, "complete": False, "disconnected": False}
        held: list[Message] = []
        status_code: list[int] = []

        async def replay() -> Message:
            if not state["body_sent"]:
                state["body_sent"] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect" and not state["complete"]:
                state["disconnected"] = True
            return message

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_code.append(message["status"])
                message = dict(message)
                extra = [(REQUEST_ID_HEADER.encode(), rec.id.encode())]
                ctype = dict(message.get("headers", [])).get(b"content-type", b"")
                if ctype.startswith(b"text/event-stream"):
                    message["headers"] = list(message.get("headers", [])) + extra
                    held.append(message)
                    return
                if rec.energy_status == "settled" and rec.energy_j is not None:
                    # Only what is settled already (never with the simulated GPU, which
                    # settles after the request); nothing waits for it.
                    extra.append((ENERGY_HEADER.encode(), f"{rec.energy_j:.6g}".encode()))
                    extra.append((SIMULATED_HEADER.encode(), str(rec.simulated).lower().encode()))
                message["headers"] = list(message.get("headers", [])) + extra
                state["started"] = True
                await forward(message)
                return
            if message["type"] == "http.response.body" and held:
                if not message.get("body") and not message.get("more_body", False):
                    # A stream that ends before its first event: an error may follow.
                    held.append(message)
                    return
                await flush()
            await forward(message)

        async def forward(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        async def flush() -> None:
            state["started"] = True
            while held:
                await forward(held.pop(0))

        token = CURRENT_REQUEST.set(rec)
        outcome = "error"
        _, llm = adapter.loaded_model()
        power = getattr(llm, "power", None)
        busy = power.busy() if power is not None else contextlib.nullcontext()
        try:
            with busy:  # the session's deferred work waits until this response is out
                await self.app(scope, replay, labelled)
                await flush()
            outcome = "ok" if state["complete"] else "cancelled"
        except Exception as e:  # answered below if nothing was sent yet
            if state["started"]:
                raise
            body = model_cls.model_validate(parsed)
            code, err = adapter.format_route_error(e, body)
            status_code.append(code)
            await _respond(
                send, code, {"error": err}, [(REQUEST_ID_HEADER.encode(), rec.id.encode())]
            )
            state["complete"] = True
        finally:
            CURRENT_REQUEST.reset(token)
            http_status = status_code[-1] if status_code else None
            if state["disconnected"]:
                outcome = "disconnected"
            elif outcome == "ok" and http_status is not None and http_status >= 400:
                outcome = "error"
            self.ledger.finish(rec, outcome, http_status)
