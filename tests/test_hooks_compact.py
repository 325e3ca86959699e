"""Compact repeats (``NativeHook.set_compact``, ``ti_hook_set_compact``): a graph that
repeats the last one node by node reaches the ring only as its ask times. Whatever the
graphs do (repeat, diverge mid-graph, shrink, grow, change a source's shape, go
unclaimed, overflow the ring), the records taken must be exactly those a plain hook
driven in lockstep gives, and as many dropped."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from turboinfer_llama._clock import now_ns
from turboinfer_llama.engine import ggml_mirror, hooks

pytest.importorskip("llama_cpp")
if not hooks.NATIVE_AVAILABLE:
    pytest.skip(f"native hooks not built: {hooks._NATIVE_WHY}", allow_module_level=True)

F32 = ggml_mirror.GGML_TYPE_F32
TPL_MAX = 1 << 15  # TI_TPL_MAX in ti_hooks.c


@pytest.fixture
def ggml() -> Iterator[tuple]:
    api = ggml_mirror.load_ggml()
    lib = api.lib
    params = ggml_mirror._InitParams(
        mem_size=(2 * TPL_MAX + 256) * lib.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True
    )
    ctx = lib.ggml_init(params)
    assert ctx
    yield lib, ctx
    lib.ggml_free(ctx)


def _graph(lib, ctx, n: int, tag: str = "n") -> list[int]:
    """n nodes, each an ADD of the previous one and a fresh leaf (two sources)."""
    prev = lib.ggml_new_tensor_4d(ctx, F32, 8, 2, 1, 1)
    out = []
    for i in range(n):
        leaf = lib.ggml_new_tensor_4d(ctx, F32, 8, 2, 1, 1)
        prev = lib.ggml_add(ctx, prev, leaf)
        lib.ggml_set_name(prev, f"{tag}-{i}".encode())
        out.append(prev)
    return out


def _masked(rec: np.ndarray, *fields: str) -> np.ndarray:
    out = np.array(rec, copy=True)
    for f in ("t_ns", *fields):
        out[f] = 0
    return out


class Lockstep:
    """A plain hook and a compact one, fed the same asks in turn."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self.ref = hooks.make_hook("graph", capacity, native=True)
        self.hook = hooks.make_hook("graph", capacity, native=True)
        assert isinstance(self.hook, hooks.NativeHook)
        self.hook.set_compact(True)
        self.spans: dict[int, tuple[int, int]] = {}

    def run(self, nodes: list[int]) -> int:
        seq = self.ref.begin_graph()
        assert self.hook.begin_graph() == seq
        t0 = now_ns()
        for t in nodes:
            assert self.ref.cb_eval(t, True, self.ref.user_data) is False
            assert self.hook.cb_eval(t, True, self.hook.user_data) is False
        self.spans[seq] = (t0, now_ns())
        return seq

    def take(self, seq: int | None = None, told: int | None = None):
        """Both hooks drained: the compact one at the graph's end (drain_graph) when
        ``seq`` is given, else with drain_raw. Checks the records agree."""
        want = self.ref.drain_raw()
        if seq is None:
            got = self.hook.drain_raw()
        else:
            got = self.hook.drain_graph(seq if told is None else told)
        rec = hooks.as_records(got)
        assert np.array_equal(_masked(rec), _masked(want))
        for r in rec:  # each ask timed within its graph's span
            t0, t1 = self.spans[int(r["graph"])]
            assert t0 <= r["t_ns"] <= t1
        assert self.hook.overflow == self.ref.overflow
        return got

    def close(self) -> None:
        self.ref.close()
        self.hook.close()


def test_a_repeated_graph_is_taken_as_times_only(ggml) -> None:
    a = _graph(*ggml, 6)
    ls = Lockstep()
    try:
        kinds = [type(ls.take(ls.run(a))) for _ in range(4)]
        assert kinds == [np.ndarray] + [hooks.GraphRecords] * 3
        got = ls.take(ls.run(a))
        assert isinstance(got, hooks.GraphRecords) and len(got.t_ns) == 6
        assert not got.template.flags.writeable and not got.t_ns.flags.writeable
    finally:
        ls.close()


def test_a_graph_that_diverges_mid_way_gives_every_record_and_becomes_the_template(
    ggml,
) -> None:
    lib, ctx = ggml
    a = _graph(lib, ctx, 6)
    b = [*a[:3], *_graph(lib, ctx, 3, "m")]  # the same first three nodes
    ls = Lockstep()
    try:
        ls.take(ls.run(a))
        assert isinstance(ls.take(ls.run(a)), hooks.GraphRecords)
        full = ls.take(ls.run(b))  # held asks 0-2 go to the ring as records
        assert isinstance(full, np.ndarray) and len(full) == 6
        again = ls.take(ls.run(b))
        assert isinstance(again, hooks.GraphRecords)
        # a template's t_ns and graph are its records' own (the repeat's replace them)
        assert np.array_equal(_masked(again.template, "graph"), _masked(full, "graph"))
    finally:
        ls.close()


@pytest.mark.parametrize("n", [4, 8])
def test_a_shorter_or_longer_graph_is_no_repeat(ggml, n: int) -> None:
    lib, ctx = ggml
    a = _graph(lib, ctx, 6)
    other = a[:n] if n < len(a) else [*a, *_graph(lib, ctx, n - len(a), "x")]
    ls = Lockstep()
    try:
        ls.take(ls.run(a))
        got = ls.take(ls.run(other))
        assert isinstance(got, np.ndarray) and len(got) == n
        assert isinstance(ls.take(ls.run(other)), hooks.GraphRecords)
    finally:
        ls.close()


@pytest.mark.parametrize("what", ["node ne", "source ne", "name"])
def test_a_change_in_place_is_seen(ggml, what: str) -> None:
    """The same tensors, one field changed between two graphs (as llama.cpp rebuilds a
    graph in the same buffer when the KV cache grows): the graph is no repeat."""
    lib, ctx = ggml
    a = _graph(lib, ctx, 6)
    ls = Lockstep()
    try:
        ls.take(ls.run(a))
        assert isinstance(ls.take(ls.run(a)), hooks.GraphRecords)
        node = ggml_mirror.TensorPrefix.from_address(a[4])
        if what == "node ne":
            node.ne[1] = 3
        elif what == "source ne":
            ggml_mirror.TensorPrefix.from_address(node.src[1]).ne[0] = 9
        else:
            lib.ggml_set_name(a[4], b"renamed")
        got = ls.take(ls.run(a))
        assert isinstance(got, np.ndarray) and len(got) == 6
    finally:
        ls.close()


def test_an_unclaimed_repeat_reaches_the_ring_as_records(ggml) -> None:
    """No drain_graph at its end: the next begin (or a drain_raw) puts the held
    repeat in the ring, exactly as the records it stands for."""
    a = _graph(*ggml, 6)
    ls = Lockstep()
    try:
        ls.take(ls.run(a))
        ls.run(a)
        ls.run(a)  # begin: the second graph's held asks go to the ring
        got = ls.take()  # drain_raw flushes the third
        assert len(got) == 12 and sorted(set(got["graph"].tolist())) == [2, 3]
        told = ls.run(a)
        assert isinstance(ls.take(told, told=told + 1), np.ndarray)  # another graph named
    finally:
        ls.close()


def test_a_full_ring_drops_the_same_records(ggml) -> None:
    a = _graph(*ggml, 6)
    b = [*a[:4], *_graph(*ggml, 2, "m")]
    ls = Lockstep(capacity=8)
    try:
        ls.take(ls.run(a))
        ls.run(a)  # held, unclaimed
        ls.run(b)  # the held 6 go in, then b's first 4 held asks and its 2 others
        got = ls.take()
        assert len(got) == 8 and ls.hook.overflow == 4
    finally:
        ls.close()


def test_a_graph_past_the_templates_room_is_recorded_whole(ggml) -> None:
    big = _graph(*ggml, TPL_MAX + 1)
    ls = Lockstep(capacity=1 << 17)
    try:
        kinds = [type(ls.take(ls.run(big))) for _ in range(2)]
        assert kinds == [np.ndarray, np.ndarray]
    finally:
        ls.close()


def test_compact_needs_graph_granularity() -> None:
    for granularity in ("layer", "kernel"):
        hook = hooks.make_hook(granularity, 64, native=True)
        assert isinstance(hook, hooks.NativeHook)
        try:
            with pytest.raises(hooks.HookError, match="Invalid argument"):
                hook.set_compact(True)
        finally:
            hook.close()
