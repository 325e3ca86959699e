"""Our server: llama-cpp-python's app and routes serving our ``Llama``, plus
``GET /v1/power``, ``GET /metrics``, request checks and per-request energy.

``/v1/power`` and ``/metrics`` read settled figures only (``PowerSession.stats(
settle=False)``): they never decode, replay or wait for the accounting worker, so they
answer at once, also right after a burst of requests. What is not settled yet shows
as ``accounting.settled: false`` and per request as ``energy_status: "pending"``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Response
from starlette.concurrency import run_in_threadpool

from . import adapter, telemetry
from .metering import RequestLedger, served_llama_class
from .metrics import CONTENT_TYPE, PowerCollector, metrics_text, registry_for
from .middleware import RequestGuard
from .settings import TurboModelSettings, TurboServerSettings

log = logging.getLogger(__name__)


def _llama_class_for(ledger: RequestLedger) -> adapter.LlamaClassFor:
    def llama_class_for(settings: adapter.ModelSettings) -> type:
        if not isinstance(settings, TurboModelSettings):
            raise TypeError(f"expected TurboModelSettings, got {type(settings).__name__}")
        return served_llama_class(
            settings.power_saving,
            settings.power_settings(),
            ledger,
            gpu_layers_set="n_gpu_layers" in settings.model_fields_set,
        )

    return llama_class_for


def power_report(ledger: RequestLedger) -> dict[str, Any]:
    """The ``/v1/power`` document for the model loaded now."""
    alias, llm = adapter.loaded_model()
    power = getattr(llm, "power", None)
    r = telemetry.power_report(power)
    return {
        "object": "power",
        "model": alias,
        "power_saving": power is not None,
        **{k: v for k, v in r.items() if k not in ("tokens", "requests", "open_requests")},
        "requests": {
            "served": ledger.total,
            "engine_requests": r["requests"],
            "engine_open": r["open_requests"],
            "tokens": r["tokens"],
            "energy_settled": ledger.settled_requests,
            "energy_pending": ledger.pending(),
            "recent": ledger.recent(),
        },
    }


def _power_router(ledger: RequestLedger) -> APIRouter:
    router = APIRouter(dependencies=[Depends(adapter.authenticate)], tags=["TurboInfer"])
    registry = registry_for(PowerCollector(lambda: power_report(ledger), ledger))

    @router.get("/v1/power", summary="Power telemetry of the loaded model")
    async def get_power() -> dict[str, Any]:
        return await run_in_threadpool(power_report, ledger)

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def get_metrics() -> Response:
        text = await run_in_threadpool(metrics_text, registry)
        return Response(content=text, media_type=CONTENT_TYPE)

    return router


def _free_models_on_shutdown(app: FastAPI) -> None:
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            try:
                yield state
            finally:
                log.info("shutting down: closing the model and restoring the GPU")
                adapter.free_models()

    app.router.lifespan_context = lifespan


def create_app(
    server_settings: TurboServerSettings, model_settings: list[TurboModelSettings]
) -> FastAPI:
    """Build the app and load the default model (its power session opens the device)."""
    ledger = RequestLedger()
    app = adapter.build_llama_app(server_settings, list(model_settings), _llama_class_for(ledger))
    app.title = "turboinfer-llama (llama.cpp Python API with power saving)"
    app.include_router(_power_router(ledger))
    app.add_middleware(
        RequestGuard,
        api_key=server_settings.api_key,
        max_body_bytes=server_settings.max_request_bytes,
        ledger=ledger,
        strict_model=server_settings.strict_model,
    )
    _free_models_on_shutdown(app)
    return app
