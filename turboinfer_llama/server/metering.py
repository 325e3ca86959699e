"""Per-request energy: a ledger of recent requests and the ``Llama`` that fills it in.

The HTTP layer puts a ``RequestRecord`` in the ``CURRENT_REQUEST`` context variable;
the context follows the request into the worker thread that runs llama.cpp. The served
``Llama`` reads the session's energy counter when generation starts and ends, inside
the request lock, so concurrent requests never see each other's joules.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .._clock import now_ns
from ..llama import Llama
from ..settings import PowerSettings
from .telemetry import energy_reading


@dataclass
class RequestRecord:
    """One HTTP request to a model route, as shown in ``/v1/power``."""

    id: str
    endpoint: str
    model: str | None
    stream: bool
    started_ns: int
    ended_ns: int | None = None
    prompt_tokens: int = 0
    tokens_generated: int = 0
    energy_j: float | None = None
    simulated: bool | None = None
    status: str = "running"
    http_status: int | None = None

    def add_energy(self, joules: float | None, simulated: bool | None) -> None:
        if joules is not None:
            self.energy_j = (self.energy_j or 0.0) + joules
        if simulated is not None:
            self.simulated = simulated

    def to_json(self) -> dict[str, Any]:
        end = self.ended_ns if self.ended_ns is not None else now_ns()
        return {
            "id": self.id,
            "endpoint": self.endpoint,
            "model": self.model,
            "stream": self.stream,
            "status": self.status,
            "http_status": self.http_status,
            "prompt_tokens": self.prompt_tokens,
            "tokens_generated": self.tokens_generated,
            "duration_s": (end - self.started_ns) / 1e9,
            "energy_j": self.energy_j,
            "simulated": self.simulated,
        }


CURRENT_REQUEST: ContextVar[RequestRecord | None] = ContextVar("turboinfer_request", default=None)


class RequestLedger:
    """The most recent requests (bounded) and running totals."""

    def __init__(self, keep: int = 64) -> None:
        self._lock = threading.Lock()
        self._recent: deque[RequestRecord] = deque(maxlen=keep)
        self.total = 0
        self.by_status: dict[str, int] = {}

    def add(self, rec: RequestRecord) -> None:
        with self._lock:
            self._recent.append(rec)
            self.total += 1

    def finish(self, rec: RequestRecord, status: str, http_status: int | None) -> None:
        with self._lock:
            rec.status = status
            rec.http_status = http_status
            rec.ended_ns = now_ns()
            self.by_status[status] = self.by_status.get(status, 0) + 1

    def recent(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self._recent]


class MeteredLlama(Llama):
    """Our ``Llama`` counting each request's tokens and, for a non-streaming request,
    charging it the energy the session accounts between its start and end.

    Streaming requests skip the energy reads: with a simulated device a read replays the
    finished requests on the simulator (``PowerSession.energy()``), which would sit
    between tokens; their energy is in ``/v1/power`` (``energy.recent_requests``).
    """

    def generate(
        self, tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Sequence[int] | None, None]:
        rec = CURRENT_REQUEST.get()
        inner = super().generate(tokens, *args, **kwargs)
        if rec is None:
            return (yield from inner)
        rec.prompt_tokens += len(tokens)
        metered = not rec.stream and self.power is not None
        e0 = energy_reading(self.power)[0] if metered else None
        try:
            token = next(inner)
            while True:
                rec.tokens_generated += 1
                sent = yield token
                token = inner.send(sent)
        except StopIteration:
            pass
        finally:
            inner.close()
            if metered:
                e1, simulated = energy_reading(self.power)
                rec.add_energy(e1 - e0 if e0 is not None and e1 is not None else None, simulated)


def served_llama_class(
    power_saving: bool, power: PowerSettings, *, gpu_layers_set: bool = True
) -> type[MeteredLlama]:
    """A ``MeteredLlama`` whose constructor always gets these power settings (the server's
    model loader only passes llama-cpp-python's arguments). ``gpu_layers_set`` False:
    the user gave no --n-gpu-layers, so the loader's default 0 is dropped and ``Llama``
    chooses (every layer on a local real GPU)."""

    class ServedLlama(MeteredLlama):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not gpu_layers_set:
                kwargs.pop("n_gpu_layers", None)
            super().__init__(*args, power_saving=power_saving, power=power, **kwargs)

    return ServedLlama
