"""``HeapFreezer``: survivors leave the cycle collector's scans; frozen garbage cycles
are reclaimed once the server is quiet; closing unfreezes."""

from __future__ import annotations

import gc
import weakref

import pytest

from turboinfer_llama.server.heap import HeapFreezer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def freezer():
    quiet = {"now": False}
    f = HeapFreezer(lambda: quiet["now"], interval_s=3600.0, reclaim_objects=100)
    f.start()
    try:
        yield f, quiet
    finally:
        f.close()


def test_survivors_leave_the_scans(freezer):
    f, _ = freezer
    assert gc.get_freeze_count() > 0
    before = gc.get_freeze_count()
    keep = [_Node() for _ in range(1000)]
    f.step()
    assert gc.get_freeze_count() >= before + len(keep)
    # what a full collection now walks: not the frozen survivors
    assert not any(o is keep[0] for o in gc.get_objects(generation=2))


def test_frozen_cycles_wait_for_a_quiet_reclaim(freezer, monkeypatch):
    f, quiet = freezer
    ref = _cycle()
    f.step()  # the cycle is alive: frozen with the rest
    gc.collect()
    assert ref() is not None  # frozen garbage cycle: the collector does not see it
    junk = [_Node() for _ in range(500)]  # frozen growth over reclaim_objects
    f.step()
    monkeypatch.setattr(HeapFreezer, "RECLAIM_EVERY_S", 0.0)
    f.step()  # due and grown, but not quiet
    assert f.reclaims == 0 and ref() is not None
    quiet["now"] = True
    f.step()
    assert f.reclaims == 1 and ref() is None
    assert f.reclaimed >= 2
    assert len(junk) == 500  # alive throughout: the growth that made the reclaim due


def test_refcounted_objects_are_freed_while_frozen(freezer):
    f, _ = freezer
    x = _Node()
    ref = weakref.ref(x)
    f.step()
    del x  # no cycle: reference counting frees it, frozen or not
    assert ref() is None


def test_close_unfreezes():
    f = HeapFreezer(lambda: True, interval_s=3600.0).start()
    assert gc.get_freeze_count() > 0
    f.close()
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError):
        HeapFreezer(lambda: True, interval_s=0)


def test_served_app_freezes_while_serving(tiny_gguf):
    from fastapi.testclient import TestClient

    from turboinfer_llama.server.app import create_app
    from turboinfer_llama.server.settings import TurboModelSettings, TurboServerSettings

    def model() -> TurboModelSettings:
        return TurboModelSettings(
            model=str(tiny_gguf), n_ctx=256, n_threads=1, verbose=False, device="sim"
        )

    app = create_app(TurboServerSettings(port=0), [model()])
    with TestClient(app):
        assert isinstance(app.state.heap, HeapFreezer)
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    assert app.state.heap.interval_s is None  # the default: the startup heap, once
    periodic = create_app(TurboServerSettings(port=0, heap_freeze_s=0.5), [model()])
    with TestClient(periodic):
        assert periodic.state.heap.interval_s == 0.5
        assert periodic.state.heap._thread is not None
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_startup_freeze_only_lets_cycles_go():
    """The server's default: the startup heap is frozen once; a garbage cycle made
    afterwards is collected as usual (periodic freezing would keep it until a quiet
    reclaim)."""
    f = HeapFreezer(lambda: False, interval_s=None).start()
    try:
        assert f._thread is None and gc.get_freeze_count() > 0
        ref = _cycle()
        gc.collect()
        assert ref() is None
    finally:
        f.close()
    assert gc.get_freeze_count() == 0
