"""``/v1/power`` and ``/metrics`` read settled figures only: neither they nor the
request path ever decode the timeline or replay the accounting; only the session's
worker does, once the server is quiet.

The app runs in-process (``TestClient``) so the settling code can be instrumented:
every call of the replay and of the timeline derivation records its thread. The
worker is held off (a quiet period of an hour) during the load, so the GETs right
after it meet a full backlog; then it is let go and settles everything. Latencies
are printed, not asserted.
"""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient
from test_server_support import MODEL

from turboinfer_llama import live
from turboinfer_llama.server import adapter
from turboinfer_llama.server.app import create_app
from turboinfer_llama.server.settings import TurboModelSettings, TurboServerSettings
from turboinfer_llama.session import PowerSession

WORKER = "turboinfer-timeline"
GREEDY = {"temperature": 0.0, "seed": 1, "max_tokens": 12}


@pytest.fixture
def served(tiny_gguf, monkeypatch):
    calls: list[tuple[str, str]] = []
    real_settle = live.applied_energy  # the settle's simulator pass
    real_materialize = PowerSession.materialize

    def spy_settle(*args, **kwargs):
        calls.append(("settle", threading.current_thread().name))
        return real_settle(*args, **kwargs)

    def spy_materialize(self, **kwargs):
        calls.append(("materialize", threading.current_thread().name))
        return real_materialize(self, **kwargs)

    monkeypatch.setattr(live, "applied_energy", spy_settle)
    monkeypatch.setattr(PowerSession, "materialize", spy_materialize)
    monkeypatch.setattr(PowerSession, "SETTLE_QUIET_NS", 3600 * 10**9)
    server = TurboServerSettings(port=0)
    model = TurboModelSettings(
        model=str(tiny_gguf),
        model_alias=MODEL,
        n_ctx=512,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
        device="sim",
    )
    app = create_app(server, [model])
    with TestClient(app) as client:
        yield client, calls


def _timed_get(client: TestClient, path: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    r = client.get(path)
    ms = (time.perf_counter() - t0) * 1e3
    assert r.status_code == 200
    return ms, (r.json() if path == "/v1/power" else r.text)


def test_power_and_metrics_never_settle(served):
    client, calls = served
    ids = []
    for i in range(6):
        body = {"model": MODEL, "prompt": f"hello {i} the world", "stream": i % 2 == 1, **GREEDY}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200
        ids.append(r.headers["x-turboinfer-request-id"])
        assert "x-turboinfer-energy-j" not in r.headers
    # Every response above came back with nothing settled: the request path did not
    # wait for accounting.
    assert not [c for c in calls if c[0] == "settle"]

    ms_power, doc = _timed_get(client, "/v1/power")
    ms_metrics, _ = _timed_get(client, "/metrics")
    print(f"\nright after load: /v1/power {ms_power:.1f} ms, /metrics {ms_metrics:.1f} ms")
    assert isinstance(doc, dict)
    assert doc["accounting"]["settled"] is False
    assert doc["accounting"]["pending_items"] + doc["accounting"]["unsettled_segments"] > 0
    recent = {r["id"]: r for r in doc["requests"]["recent"]}
    assert all(recent[i]["energy_status"] == "pending" for i in ids)
    assert all(recent[i]["energy_j"] is None for i in ids)
    # Only the worker ever derived or replayed anything.
    assert {thread for _, thread in calls} <= {WORKER}

    # Let the worker settle (as it does once the server is quiet).
    _, llm = adapter.loaded_model()
    assert llm is not None and llm.power is not None
    llm.power.SETTLE_QUIET_NS = 0
    deadline = time.monotonic() + 60
    while True:
        ms, doc = _timed_get(client, "/v1/power")
        assert isinstance(doc, dict)
        if doc["accounting"]["settled"]:
            break
        assert time.monotonic() < deadline, doc["accounting"]
        time.sleep(0.05)
    print(f"settled: /v1/power {ms:.1f} ms")
    recent = {r["id"]: r for r in doc["requests"]["recent"]}
    for i in ids:
        assert recent[i]["energy_status"] == "settled"
        assert recent[i]["energy_j"] > 0 and recent[i]["simulated"] is True
    assert doc["requests"]["energy_settled"] >= len(ids)
    settles = [thread for what, thread in calls if what == "settle"]
    assert settles and set(settles) == {WORKER}
    assert {thread for _, thread in calls} == {WORKER}
    # The server-wide figure is the sum of the settled requests (simulated).
    assert doc["energy"]["energy_j"] == pytest.approx(
        sum(recent[i]["energy_j"] for i in ids), rel=1e-9
    )


def test_settling_pauses_while_a_request_runs(tiny_gguf, monkeypatch):
    """Settling runs the simulator batch by batch (a graph's kernels between switch
    instants, a stall); before each it waits while a request runs. Count the batches
    simulated while a request was in flight: at most one per request (the one under
    way when it started), against hundreds simulated overall."""
    from turboinfer_llama import Llama

    seen = {"during": 0, "total": 0}

    def counting(real):
        def run(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            seen["total"] += 1
            if power._in_flight > 0:
                seen["during"] += 1
            return out

        return run

    for name in ("run_batch", "run_gap"):
        monkeypatch.setattr(live._Gated, name, counting(getattr(live._Gated, name)))
    with Llama(model_path=str(tiny_gguf), n_ctx=256, verbose=False, power={"device": "sim"}) as llm:
        power = llm.power
        assert power is not None
        power.SETTLE_QUIET_NS = 0  # settle in every gap between requests
        n = 12
        for i in range(n):
            llm.create_completion(f"hello {i}", max_tokens=24, temperature=0.0)
            time.sleep(0.002)  # a gap: the worker starts settling
        deadline = time.monotonic() + 60
        while not power.stats(settle=False)["energy"]["accounting"]["settled"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    print(f"\nbatches simulated: {seen['total']}, while a request ran: {seen['during']}")
    assert seen["total"] > 20 * n
    assert seen["during"] <= n


def test_busy_holds_deferred_work_until_the_response_is_out(tiny_gguf):
    """A server marks each model request busy from its arrival to its last byte; the
    worker neither decodes nor settles meanwhile, and does both once it is over."""
    from turboinfer_llama import Llama

    with Llama(model_path=str(tiny_gguf), n_ctx=256, verbose=False, power={"device": "sim"}) as llm:
        power = llm.power
        assert power is not None
        power.SETTLE_QUIET_NS = 3600 * 10**9  # nothing starts before busy() below
        llm.create_completion("hello the world", max_tokens=16, temperature=0.0)
        with power.busy():
            power.SETTLE_QUIET_NS = 0  # the worker would go at once, but for busy()
            time.sleep(1.5)
            acc = power.stats(settle=False)["energy"]["accounting"]
            assert acc["settled"] is False and acc["settled_requests"] == 0
            assert acc["pending_items"] > 0  # not even decoded
        deadline = time.monotonic() + 60
        while not power.stats(settle=False)["energy"]["accounting"]["settled"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert power.stats(settle=False)["energy"]["accounting"]["settled_requests"] == 1


def _worker_locks(power: PowerSession) -> list:
    """Every lock a worker (the session's timeline worker, settling, the engine's
    drain) may hold for long: derivation, the timeline (a settle's eviction), the
    pending list, the account's settle and bookkeeping, the hook's ring."""
    account = power._account
    assert account is not None and power.hook is not None
    return [
        power._derive_lock,
        power._timeline._lock,
        power._swap_lock,
        power._held_lock,
        account._replay_lock,
        account._lock,
        power.hook._lock,  # type: ignore[attr-defined]
    ]


def test_power_and_metrics_take_no_worker_lock(served):
    """The read path is lock-free towards the workers: with every lock they use held
    by this thread, ``/v1/power`` and ``/metrics`` still answer (with the old read
    path they block on the timeline's lock until it is released)."""
    client, _ = served
    for i in range(2):
        body = {"model": MODEL, "prompt": f"hello {i}", "stream": i == 1, **GREEDY}
        assert client.post("/v1/completions", json=body).status_code == 200
    _, llm = adapter.loaded_model()
    llm.power.SETTLE_QUIET_NS = 0  # let the worker derive and settle, then hold it
    deadline = time.monotonic() + 60
    while not client.get("/v1/power").json()["accounting"]["settled"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    locks = _worker_locks(llm.power)
    answers: dict[str, object] = {}

    def read() -> None:
        for path in ("/v1/power", "/metrics"):
            r = client.get(path)
            answers[path] = (r.status_code, r.json() if path == "/v1/power" else r.text)

    for lock in locks:
        assert lock.acquire(timeout=30)
    try:
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(60)  # a deadlock detector, not a latency bound
        blocked = reader.is_alive()
    finally:
        for lock in reversed(locks):
            lock.release()
    reader.join(60)
    assert not blocked, "a power read waited for a worker's lock"
    status, doc = answers["/v1/power"]
    assert status == 200 and isinstance(doc, dict)
    assert doc["requests"]["engine_requests"] == 2
    assert doc["timeline"]["total_events"] > 0  # the published figures, not empty ones
    assert doc["accounting"]["settled"] is True
    assert answers["/metrics"][0] == 200
    assert "turboinfer_stall_seconds" in str(answers["/metrics"][1])


def _thread_hops(monkeypatch) -> list[str]:
    """Names of the functions run in the thread pool from now on (anyio's
    ``to_thread.run_sync``, which starlette's ``run_in_threadpool`` and FastAPI's sync
    dependencies go through)."""
    import anyio.to_thread

    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def counting(fn, *args, **kwargs):
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    return hops


def test_power_and_metrics_never_use_the_thread_pool(served, monkeypatch):
    """Both answer inline on the event loop, API-key check included: no thread-pool
    hop (each is a GIL hand-off that waits behind the engine and the streams)."""
    client, _ = served
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", **GREEDY})
    hops = _thread_hops(monkeypatch)
    for path in ("/v1/power", "/metrics", "/v1/power"):
        assert client.get(path).status_code == 200
    assert hops == []
    # the counter sees hops where there are some: llama-cpp-python's /v1/models reads
    # its settings through a generator dependency run in the thread pool
    assert client.get("/v1/models").status_code == 200
    assert hops


def test_stats_unsettled_read_matches_a_locked_read(tiny_gguf):
    """``stats(settle=False)`` reads published timeline figures; once the worker is
    done they are the same as a read under the locks."""
    from turboinfer_llama import Llama

    with Llama(model_path=str(tiny_gguf), n_ctx=256, verbose=False, power={"device": "sim"}) as llm:
        power = llm.power
        assert power is not None
        power.SETTLE_QUIET_NS = 0
        for i in range(3):
            llm.create_completion(f"hello {i}", max_tokens=8, temperature=0.0)
        deadline = time.monotonic() + 60
        while not power.stats(settle=False)["energy"]["accounting"]["settled"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        fast = power.stats(settle=False)
        slow = power.stats(settle=True)
        for key in ("events", "kernels", "stalls", "timeline", "events_dropped", "requests"):
            assert fast[key] == slow[key], key
        assert fast["timeline"]["total_events"] > 0
        assert fast["hook"] == slow["hook"]


def test_a_real_device_is_read_off_the_event_loop(served, monkeypatch):
    """With a real device the figures read its current clock (sysfs, adb), which can
    block: both endpoints then go to the thread pool, never onto the event loop."""
    import types

    from turboinfer_llama.live import RealDeviceControl
    from turboinfer_llama.server import app as app_module

    client, _ = served
    assert not app_module._reads_hardware()  # the simulated device: inline
    real_live = object.__new__(RealDeviceControl)
    fake_llm = types.SimpleNamespace(power=types.SimpleNamespace(live=real_live))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_module.adapter, "loaded_model", lambda: ("m", fake_llm))
        assert app_module._reads_hardware()

    hops = _thread_hops(monkeypatch)
    monkeypatch.setattr(app_module, "_reads_hardware", lambda: True)
    for path in ("/v1/power", "/metrics"):
        assert client.get(path).status_code == 200
    assert len(hops) >= 2, hops
