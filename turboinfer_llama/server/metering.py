"""Per-request records: a ledger of recent requests and the ``Llama`` that fills it in.

The HTTP layer puts a ``RequestRecord`` in the ``CURRENT_REQUEST`` context variable;
the context follows the request into the worker thread that runs llama.cpp. The served
``Llama`` does no accounting on the request path: it only counts tokens and notes which
engine request (the session's n-th ``generate``) and which generation window
(``begin_ns``, ``end_ns`` on the monotonic clock) belong to the HTTP request.

Energy is settled afterwards, off the request path: the power session's worker replays
finished requests on the simulated GPU while the server is quiet and hands each
request's figures to ``RequestLedger.settle``, which books them on the HTTP request
that ran it. ``/v1/power`` shows them by request id (``energy_status`` says whether
they are ``pending``, ``settled`` or ``unavailable``).

llama-cpp-python serialises generation with its model lock, so the generation windows
of two requests to one model never overlap, and on a real device the one governor of
the model's session sees one request at a time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .._clock import now_ns
from ..llama import Llama
from ..settings import PowerSettings

log = logging.getLogger(__name__)

EnergyStatus = str  # "pending" | "settled" | "unavailable"


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
    default_energy_j: float | None = None
    simulated: bool | None = None
    status: str = "running"
    http_status: int | None = None
    # (session key, engine request index) of each generate() this request ran
    engine_requests: list[tuple[int, int]] = field(default_factory=list)
    unsettled: set[tuple[int, int]] = field(default_factory=set)
    windows_ns: list[tuple[int, int | None]] = field(default_factory=list)
    settles: bool = False  # some generate() ran on a session that settles energy later

    @property
    def energy_status(self) -> EnergyStatus:
        """``settled`` once every generate() of this request is accounted for,
        ``pending`` until then, ``unavailable`` when nothing will settle it (power
        saving off, observing only, a real device without a meter)."""
        if not self.settles:
            return "unavailable"
        if self.unsettled or self.ended_ns is None:
            return "pending"
        return "settled"

    def to_json(self) -> dict[str, Any]:
        end = self.ended_ns if self.ended_ns is not None else now_ns()
        status = self.energy_status
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
            "generation_windows_ns": [list(w) for w in self.windows_ns],
            "energy_status": status,
            "energy_j": self.energy_j if status == "settled" else None,
            "default_energy_j": self.default_energy_j if status == "settled" else None,
            "simulated": self.simulated,
        }


CURRENT_REQUEST: ContextVar[RequestRecord | None] = ContextVar("turboinfer_request", default=None)


class RequestLedger:
    """The most recent requests (bounded) and running totals. Settled figures arrive
    from the power session's worker thread; everything here takes the lock briefly."""

    def __init__(self, keep: int = 64) -> None:
        self._lock = threading.Lock()
        self._recent: deque[RequestRecord] = deque(maxlen=keep)
        self._by_engine: dict[tuple[int, int], RequestRecord] = {}
        self.total = 0
        self.open = 0  # model requests not finished yet
        self.by_status: dict[str, int] = {}
        self.settled_requests = 0

    def add(self, rec: RequestRecord) -> None:
        with self._lock:
            if len(self._recent) == self._recent.maxlen:
                for key in self._recent[0].engine_requests:
                    self._by_engine.pop(key, None)
            self._recent.append(rec)
            self.total += 1
            self.open += 1

    def begin_generation(self, rec: RequestRecord, key: tuple[int, int], settles: bool) -> None:
        """``rec`` is running engine request ``key`` (session key, index) from now on."""
        with self._lock:
            rec.engine_requests.append(key)
            rec.windows_ns.append((now_ns(), None))
            if settles:
                rec.settles = True
                rec.unsettled.add(key)
                self._by_engine[key] = rec

    def end_generation(self, rec: RequestRecord) -> None:
        with self._lock:
            begin, _ = rec.windows_ns[-1]
            rec.windows_ns[-1] = (begin, now_ns())

    def settle(self, session_key: int, record: dict[str, Any]) -> None:
        """Book one settled engine request (from ``PowerSession.add_settled_sink``)."""
        key = (session_key, int(record["request"]))
        with self._lock:
            rec = self._by_engine.pop(key, None)
            if rec is None:  # a request outside the HTTP layer, or one long gone
                return
            rec.unsettled.discard(key)
            rec.energy_j = (rec.energy_j or 0.0) + float(record["energy_j"])
            if record.get("default_energy_j") is not None:
                base = float(record["default_energy_j"])
                rec.default_energy_j = (rec.default_energy_j or 0.0) + base
            rec.simulated = bool(record.get("simulated", True))
            self.settled_requests += 1

    def finish(self, rec: RequestRecord, status: str, http_status: int | None) -> None:
        with self._lock:
            rec.status = status
            rec.http_status = http_status
            rec.ended_ns = now_ns()
            self.open -= 1
            self.by_status[status] = self.by_status.get(status, 0) + 1

    def recent(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self._recent]

    def pending(self) -> int:
        """Recent requests whose energy is still to be settled."""
        with self._lock:
            return sum(1 for r in self._recent if r.energy_status == "pending")


KV_FULL = "llama_decode returned 1"  # llama.cpp: no KV-cache slot for the batch


class MeteredLlama(Llama):
    """Our ``Llama`` noting, per HTTP request, its tokens, its engine request index
    and its generation window. No energy is read here (nothing waits for accounting).

    A generation that runs into a full context (llama-cpp-python lets ``max_tokens``
    unset or over-long reach ``llama_decode``, which then has no KV slot) ends there,
    as a ``length`` finish, instead of failing the request with a 500.
    """

    ledger: RequestLedger | None = None

    def generate(
        self, tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Sequence[int] | None, None]:
        rec = CURRENT_REQUEST.get()
        inner = super().generate(tokens, *args, **kwargs)
        ledger = self.ledger
        if rec is None or ledger is None:
            return (yield from inner)
        rec.prompt_tokens += len(tokens)
        power = self.power
        # Inside the model lock: this generate() is the session's next request.
        key = (id(power), power.request_count if power is not None else -1)
        ledger.begin_generation(rec, key, settles=bool(getattr(self, "_settles", False)))
        try:
            token = next(inner)
            while True:
                rec.tokens_generated += 1
                sent = yield token
                token = inner.send(sent)
        except StopIteration:
            pass
        except RuntimeError as e:
            if KV_FULL not in str(e) or rec.tokens_generated == 0:
                raise
            log.info("request %s: context full after %d tokens", rec.id, rec.tokens_generated)
        finally:
            inner.close()
            ledger.end_generation(rec)


def served_llama_class(
    power_saving: bool,
    power: PowerSettings,
    ledger: RequestLedger,
    *,
    gpu_layers_set: bool = True,
) -> type[MeteredLlama]:
    """A ``MeteredLlama`` whose constructor always gets these power settings (the
    server's model loader only passes llama-cpp-python's arguments) and books its
    requests' settled energy in ``ledger``. ``gpu_layers_set`` False: the user gave no
    --n-gpu-layers, so the loader's default 0 is dropped and ``Llama`` chooses (every
    layer on a local real GPU)."""

    class ServedLlama(MeteredLlama):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not gpu_layers_set:
                kwargs.pop("n_gpu_layers", None)
            super().__init__(*args, power_saving=power_saving, power=power, **kwargs)
            self.ledger = ledger
            self._settles = False
            session = self.power
            if session is not None:
                session.SETTLE_ON_CLOSE = False  # shutdown must not wait for a replay
                key = id(session)
                sink: Callable[[dict[str, Any]], None] = lambda r: ledger.settle(key, r)  # noqa: E731
                self._settles = session.add_settled_sink(sink)

    return ServedLlama
