"""Our server: llama-cpp-python's app and routes serving our ``Llama``, plus
``GET /v1/power``, ``GET /metrics``, request checks and per-request energy.

``/v1/power`` and ``/metrics`` read settled figures only (``PowerSession.stats(
settle=False)``): they never decode, replay or wait for the accounting worker, so they
answer at once, also right after a burst of requests. What is not settled yet shows
as ``accounting.settled: false`` and per request as ``energy_status: "pending"``.

With the simulated device they run inline on the event loop, API-key check included:
no thread-pool hop (each hop is a GIL hand-off that waits behind the engine, the
planner and the streams under load). With a real device they go to the thread pool,
since reading its current clock (sysfs, adb) can block. Inline is safe because the
read takes no lock that a worker holds for more than a few dict reads: the session's
figures are published snapshots (``stats(settle=False)``), and the ledger's lock only
guards O(1) bookkeeping and the reader's own copy of the recent requests.
``HeapFreezer`` keeps the cycle collector's full collections short (``heap.py``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ..live import RealDeviceControl
from . import adapter, telemetry
from .heap import HeapFreezer
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


_bearer = HTTPBearer(auto_error=False)


def _api_key_check(api_key: str | None) -> Any:
    """llama-cpp-python's API-key check (same answers), as an ``async`` dependency with
    no sub-dependency: theirs reads the settings through a generator dependency that
    FastAPI runs in the thread pool, two GIL hand-offs per request."""

    async def authenticate(
        authorization: HTTPAuthorizationCredentials | None = Depends(_bearer),
    ) -> None:
        if api_key is None or (authorization and authorization.credentials == api_key):
            return
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Invalid API key")

    return authenticate


def _power_router(ledger: RequestLedger, api_key: str | None) -> APIRouter:
    router = APIRouter(dependencies=[Depends(_api_key_check(api_key))], tags=["TurboInfer"])
    registry = registry_for(PowerCollector(lambda: power_report(ledger), ledger))

    # Inline on the event loop: neither takes a lock a worker holds for long (see the
    # module's docstring); tests/test_server_power_latency.py holds those locks.
    @router.get("/v1/power", summary="Power telemetry of the loaded model")
    async def get_power() -> dict[str, Any]:
        if _reads_hardware():
            return await run_in_threadpool(power_report, ledger)
        return power_report(ledger)

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def get_metrics() -> Response:
        if _reads_hardware():
            text = await run_in_threadpool(metrics_text, registry)
        else:
            text = metrics_text(registry)
        return Response(content=text, media_type=CONTENT_TYPE)

    return router


def _reads_hardware() -> bool:
    """Whether the loaded model's power figures read a real device (its current clock,
    from sysfs or over adb: a read that can block, so it goes to the thread pool, never
    onto the event loop). The simulated device's figures are published snapshots."""
    _, llm = adapter.loaded_model()
    live = getattr(getattr(llm, "power", None), "live", None)
    return isinstance(live, RealDeviceControl)


def _quiet(ledger: RequestLedger) -> bool:
    """No model request open and the loaded model's accounting settled."""
    if ledger.open:
        return False
    _, llm = adapter.loaded_model()
    st, _ = telemetry.stats_of(getattr(llm, "power", None))
    acc = telemetry._get(st, "energy.accounting")
    return not st.get("in_flight") and (not isinstance(acc, dict) or bool(acc.get("settled")))


def _lifespan(app: FastAPI, ledger: RequestLedger, heap_freeze_s: float) -> None:
    """Freeze the heap while serving (``heap.py``); free the models on shutdown."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            freezer = HeapFreezer(
                lambda: _quiet(ledger), heap_freeze_s if heap_freeze_s > 0 else None
            ).start()
            app.state.heap = freezer
            try:
                yield state
            finally:
                if freezer is not None:
                    freezer.close()
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
    app.include_router(_power_router(ledger, server_settings.api_key))
    app.add_middleware(
        RequestGuard,
        api_key=server_settings.api_key,
        max_body_bytes=server_settings.max_request_bytes,
        ledger=ledger,
        strict_model=server_settings.strict_model,
    )
    _lifespan(app, ledger, server_settings.heap_freeze_s)
    return app
