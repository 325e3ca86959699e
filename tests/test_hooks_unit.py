"""Eval hooks without a model: argument checks, the ggml struct mirror, the native ABI."""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from turboinfer_llama.engine import ggml_mirror, hooks
from turboinfer_llama.engine.events import EventKind

pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("granularity", ["token", "", "KERNEL", None])
def test_unknown_granularity_names_the_choices(native: bool, granularity: str) -> None:
    with pytest.raises(ValueError, match="graph, layer, kernel"):
        hooks.make_hook(granularity, 16, native=native)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("capacity", [0, -1, hooks.MAX_RING_CAPACITY + 1, True, 2.5, "8"])
def test_bad_capacity_is_refused(native: bool, capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        hooks.make_hook("kernel", capacity, native=native)  # type: ignore[arg-type]


def test_mirror_matches_this_ggml() -> None:
    layout = ggml_mirror.tensor_layout()
    assert layout.valid, layout.reason
    prefix = ggml_mirror.TensorPrefix
    assert (layout.off_type, layout.off_ne, layout.off_src) == (
        prefix.type.offset,
        prefix.ne.offset,
        prefix.src.offset,
    )


def test_a_shifted_mirror_is_caught_with_a_reason() -> None:
    class Shifted(ctypes.Structure):
        _fields_ = [("extra", ctypes.c_int64), *ggml_mirror.TensorPrefix._fields_]

    layout = ggml_mirror.check_layout(ggml_mirror.load_ggml(), Shifted)
    assert not layout.valid
    assert "ne" in layout.reason and "src of ggml_add" in layout.reason
    assert layout.off_ne == -1


def test_native_library_matches_the_record_dtype() -> None:
    if not hooks.NATIVE_AVAILABLE:
        pytest.skip(f"native hooks not built: {hooks._NATIVE_WHY}")
    lib = hooks._NATIVE_LIB
    assert lib is not None
    assert lib.ti_record_size() == hooks.RECORD_DTYPE.itemsize
    assert lib.ti_record_field_offset(b"no_such_field") == -1
    assert hooks._abi_mismatch(lib) == ""


@pytest.mark.parametrize("native", [True, False])
def test_disabled_hook_never_syncs_or_aborts(native: bool) -> None:
    if native and not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    hook = hooks.make_hook("kernel", 8, native=native)
    try:
        hook.disable()
        # The pointer is never read once disabled, so any non-null value will do.
        assert hook.cb_eval(0x1000, True, hook.user_data) is False
        assert hook.cb_eval(0x1000, False, hook.user_data) is True
        assert hook.drain() == []
        assert hook.overflow == 0
    finally:
        hook.close()


@pytest.mark.parametrize("native", [True, False])
def test_close_is_idempotent(native: bool) -> None:
    if native and not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    hook = hooks.make_hook("graph", 8, native=native)
    assert hook.native is (native and hooks.NATIVE_AVAILABLE)
    assert isinstance(hook, hooks.EvalHook)
    assert hook.begin_graph() == 1
    hook.close()
    hook.close()
    assert hook.drain() == []
    with pytest.raises(hooks.HookError, match="closed"):
        hook.begin_graph()


def _ggml_context(n_tensors: int) -> tuple[Any, int]:
    """libggml-base and a no-alloc context with room for ``n_tensors`` tensors."""
    lib = ggml_mirror.load_ggml().lib
    params = ggml_mirror._InitParams(
        mem_size=n_tensors * lib.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True
    )
    ctx = lib.ggml_init(params)
    assert ctx
    return lib, ctx


@pytest.mark.parametrize("native", [True, False])
def test_records_from_real_ggml_tensors(native: bool) -> None:
    """Drive the callback by hand with tensors built in libggml-base."""
    if native and not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    lib, ctx = _ggml_context(8)
    hook = hooks.make_hook("layer", 16, native=native)
    try:
        a = lib.ggml_new_tensor_4d(ctx, ggml_mirror.GGML_TYPE_F32, 4, 3, 1, 1)
        b = lib.ggml_new_tensor_4d(ctx, ggml_mirror.GGML_TYPE_F32, 4, 1, 1, 1)
        s = lib.ggml_add(ctx, a, b)
        lib.ggml_set_name(a, b"attn_norm-0")
        lib.ggml_set_name(s, b"l_out-7")
        assert hook.begin_graph() == 1
        assert hook.cb_eval(a, True, hook.user_data) is False  # not a layer output
        assert hook.cb_eval(s, True, hook.user_data) is True  # l_out: sync here
        assert hook.cb_eval(s, False, hook.user_data) is True  # done never aborts
        events = hook.drain()
    finally:
        hook.close()
        lib.ggml_free(ctx)
    assert [(e.kind, e.node, e.name, e.layer, e.op) for e in events] == [
        (EventKind.NODE_ASK, 0, "attn_norm-0", 0, "NONE"),
        (EventKind.NODE_ASK, 1, "l_out-7", 7, "ADD"),
        (EventKind.NODE_DONE, 1, "l_out-7", 7, "ADD"),
    ]
    assert all(e.graph == 1 for e in events)
    assert events[0].t_ns <= events[1].t_ns <= events[2].t_ns
    shape = events[1].shape
    assert shape is not None
    assert shape.ne == (4, 3, 1, 1) and shape.type == ggml_mirror.GGML_TYPE_F32
    assert shape.src0_ne == (4, 3, 1, 1) and shape.src1_ne == (4, 1, 1, 1)
    assert shape.nbytes == 4 * 3 * 4
    assert events[0].shape is not None and events[0].shape.src0_ne is None


def test_missing_native_library_falls_back_and_says_so_once() -> None:
    """With no built library in sight, hooks are pure Python and one line says why."""
    code = (
        "import importlib.machinery, logging\n"
        "importlib.machinery.EXTENSION_SUFFIXES[:] = []\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "from turboinfer_llama.engine import hooks\n"
        "import turboinfer_llama.engine.hooks\n"
        "assert not hooks.NATIVE_AVAILABLE\n"
        "for g in hooks.GRANULARITIES:\n"
        "    h = hooks.make_hook(g, 4)\n"
        "    assert not h.native\n"
        "    h.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "pure-Python" in line]
    assert len(lines) == 1
    assert lines[0].startswith("turboinfer_llama ") and "was not built" in lines[0]


@contextlib.contextmanager
def _graph_hook_and_tensor() -> Iterator[tuple[hooks.NativeHook, Any]]:
    """A native graph-granularity hook and one libggml-base tensor to call it with."""
    if not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    lib, ctx = _ggml_context(4)
    hook = hooks.make_hook("graph", 64, native=True)
    assert isinstance(hook, hooks.NativeHook)
    try:
        yield hook, lib.ggml_new_tensor_4d(ctx, ggml_mirror.GGML_TYPE_F32, 4, 1, 1, 1)
    finally:
        hook.close()
        lib.ggml_free(ctx)


def test_the_native_callback_times_itself_only_while_asked() -> None:
    with _graph_hook_and_tensor() as (hook, t):
        hook.begin_graph()
        hook.cb_eval(t, True, hook.user_data)
        assert hook.self_time() == (0, 0)  # off by default
        hook.set_self_timing(True)
        for _ in range(5):
            hook.cb_eval(t, True, hook.user_data)
        hook.set_self_timing(False)
        hook.cb_eval(t, True, hook.user_data)
        ns, calls = hook.self_time()
        assert calls == 5 and ns > 0
        assert len(hook.drain_raw()) == 7  # timing changes no record
    with pytest.raises(hooks.HookError):
        hook.self_time()


def test_the_native_wake_is_posted_by_the_next_ask_once_armed() -> None:
    """The planner's wake: armed by one store between decodes, posted by the callback's
    next ask (inside llama_decode), taken once however many posts came."""
    with _graph_hook_and_tensor() as (hook, t):
        flag = hook.wake_flag()
        hook.begin_graph()
        hook.cb_eval(t, True, hook.user_data)
        assert hook.wait_wake(0.0) is False  # not armed: nothing posted
        flag.value = 1
        assert hook.wait_wake(0.0) is False  # armed, but no ask yet
        hook.cb_eval(t, True, hook.user_data)
        assert flag.value == 0  # taken by the ask
        hook.cb_eval(t, True, hook.user_data)  # not armed again: no second post
        assert hook.wake_stats() == {"posted": 1, "failed": 0}
        assert hook.wait_wake(0.0) is True
        assert hook.wait_wake(0.0) is False
        assert hook.post_wake() and hook.post_wake()
        assert hook.wait_wake(0.0) is True  # both posts in one wake
        assert hook.wait_wake(0.0) is False
        assert len(hook.drain_raw()) == 3  # the wake changes no record


def test_closing_the_native_hook_releases_a_waiting_planner() -> None:
    """close() frees the hook only after a thread blocked in wait_wake has left it;
    later waits and posts answer at once that the hook is closed."""
    import threading

    if not hooks.NATIVE_AVAILABLE:
        pytest.skip("native hooks not built")
    hook = hooks.make_hook("graph", 64, native=True)
    assert isinstance(hook, hooks.NativeHook)
    got: list[bool | None] = []
    waiter = threading.Thread(target=lambda: got.append(hook.wait_wake(60.0)))
    waiter.start()
    while not hook._waiting and waiter.is_alive():
        threading.Event().wait(0.001)
    hook.close()
    waiter.join(timeout=10.0)
    assert not waiter.is_alive() and got == [True]  # woken by close's post
    assert hook.wait_wake(60.0) is None
    assert hook.post_wake() is False
