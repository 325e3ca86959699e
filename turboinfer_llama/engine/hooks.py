"""Eval callbacks that watch llama.cpp's graph from inside: one record per node ask/done.

llama.cpp's scheduler calls ``cb_eval(tensor, ask, user_data)`` for each graph node in
execution order. On ``ask`` the answer decides whether the backend computes up to that
node and synchronises (True, then a second call with ``ask=False``) or carries on (False).
A False on ``ask=False`` aborts the graph, so done calls always answer True.

Two implementations share one contract (:class:`EvalHook`):

* :class:`NativeHook` hands llama.cpp the C function ``ti_hook_eval`` itself
  (``hooks/ti_hooks.c``): records go into a lock-free ring without the GIL.
* :class:`PythonHook` is a ctypes callback recording the same fields; it is the
  fallback when the C library was not built, and the oracle in tests.

Granularity decides where the hook forces a sync: ``graph`` never (asks only),
``layer`` at each layer's output node (``l_out-<i>``), ``kernel`` at every node.

Numbering: ``graph`` counts :meth:`EvalHook.begin_graph` calls (one per llama_decode)
and ``node`` counts asks since then, in the scheduler's order. When one llama_decode
runs several ubatches, their nodes continue one numbering under one graph number.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.machinery
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .._clock import now_ns
from .blocks import BlockDecoder, NodeBlock, NodeTexts
from .events import Event, EventKind, NodeShape
from .ggml_mirror import GgmlApi, TensorLayout, TensorPrefix, load_ggml, tensor_layout

if TYPE_CHECKING:
    from .executor import NativeExecutor

logger = logging.getLogger("turboinfer_llama")

GRANULARITIES = ("graph", "layer", "kernel")
_GRANULARITY_CODE = {"graph": 0, "layer": 1, "kernel": 2}
LAYER_OUT_PREFIX = b"l_out-"  # llama.cpp's name for a layer's output node
MAX_RING_CAPACITY = 1 << 22  # same bound as TI_MAX_CAPACITY in ti_hooks.c
_DRAIN_CHUNK = 4096  # records copied out of the native ring per call (drain())
_TNS_SLAB = 1 << 16  # int64 t_ns per slab drain_graph's repeats are cut from (512 KB)

_OP_LEN = 32  # TI_OP_LEN: stored with a NUL, so at most 31 characters
_NAME_LEN = 64  # TI_NAME_LEN
_HAS_SHAPE, _HAS_SRC0, _HAS_SRC1 = 1, 2, 4
_ASK, _DONE = 0, 1

# struct ti_record (hooks/ti_hooks.h); checked field by field against the library.
RECORD_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"),
        ("graph", "<u8"),
        ("ne", "<i8", (4,)),
        ("src0_ne", "<i8", (4,)),
        ("src1_ne", "<i8", (4,)),
        ("nbytes", "<u8"),
        ("node", "<i4"),
        ("type", "<i4"),
        ("src0_type", "<i4"),
        ("src1_type", "<i4"),
        ("phase", "u1"),
        ("flags", "u1"),
        ("reserved", "V6"),
        ("op", f"S{_OP_LEN}"),
        ("name", f"S{_NAME_LEN}"),
    ]
)
_SHAPE_FIELDS = ["flags", "ne", "type", "src0_ne", "src0_type", "src1_ne", "src1_type", "nbytes"]
_SHAPE_DTYPE = np.dtype([(f, RECORD_DTYPE[f]) for f in _SHAPE_FIELDS])


class HookError(RuntimeError):
    """The native hook library refused a request (bad config, out of memory)."""


@runtime_checkable
class EvalHook(Protocol):
    """What the Llama subclass needs from a hook, native or pure Python."""

    granularity: str
    native: bool
    cb_eval: Any  # a llama_cpp.ggml_backend_sched_eval_callback, for context_params.cb_eval
    user_data: ctypes.c_void_p | None  # for context_params.cb_eval_user_data

    def begin_graph(self) -> int:
        """Call right before each llama_decode: graph seq += 1, node index to 0."""
        ...

    def drain_raw(self) -> Any:
        """Take pending records without decoding them (no per-record Python work);
        ``decode_raw`` turns them into Events later, off the decode path."""
        ...

    def decode_raw(self, raw: Any) -> list[Event]: ...

    def drain(self) -> list[Event]:
        """NODE_ASK / NODE_DONE events recorded since the last drain, in order."""
        ...

    @property
    def overflow(self) -> int:
        """Records dropped because the ring was full."""
        ...

    def disable(self) -> None:
        """Make the callback inert at once (records nothing, never syncs or aborts)."""
        ...

    def close(self) -> None:
        """Free the ring; only after the llama context is freed. Idempotent."""
        ...


class _Config(ctypes.Structure):
    """struct ti_hook_config (hooks/ti_hooks.h)."""

    _fields_ = [
        ("capacity", ctypes.c_uint32),
        ("granularity", ctypes.c_int32),
        ("op_desc", ctypes.c_void_p),
        ("get_name", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("valid", ctypes.c_int32),
        ("off_type", ctypes.c_int32),
        ("off_ne", ctypes.c_int32),
        ("off_src", ctypes.c_int32),
    ]


def _native_path() -> Path | None:
    here = Path(__file__).resolve().parent.parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_ti_hooks{suffix}"
        if candidate.exists():
            return candidate
    return None


def _abi_mismatch(lib: ctypes.CDLL) -> str:
    """Empty if the library's record and config layouts match ours, else why not."""
    if lib.ti_record_size() != RECORD_DTYPE.itemsize:
        return f"record size {lib.ti_record_size()} != {RECORD_DTYPE.itemsize}"
    if lib.ti_config_size() != ctypes.sizeof(_Config):
        return f"config size {lib.ti_config_size()} != {ctypes.sizeof(_Config)}"
    fields: dict[str, Any] = dict(RECORD_DTYPE.fields or {})
    for field in RECORD_DTYPE.names or ():
        offset = fields[field][1]
        if field != "reserved" and lib.ti_record_field_offset(field.encode()) != offset:
            return f"record field {field} is not at offset {offset}"
    return ""


def _load_native() -> tuple[ctypes.CDLL | None, str]:
    path = _native_path()
    if path is None:
        return None, "turboinfer_llama/_ti_hooks was not built"
    try:
        lib = ctypes.CDLL(str(path))
        vp = ctypes.c_void_p
        for name, restype, argtypes in [
            ("ti_hook_create", ctypes.c_int, [ctypes.POINTER(_Config), ctypes.POINTER(vp)]),
            ("ti_hook_destroy", None, [vp]),
            ("ti_hook_begin_graph", ctypes.c_uint64, [vp]),
            ("ti_hook_drain", ctypes.c_uint32, [vp, vp, ctypes.c_uint32]),
            ("ti_hook_pending", ctypes.c_uint32, [vp]),
            (
                "ti_hook_drain_like",
                ctypes.c_uint32,
                [vp, vp, ctypes.c_uint32, ctypes.c_uint64, vp],
            ),
            ("ti_hook_overflow", ctypes.c_uint64, [vp]),
            ("ti_hook_disable", None, [vp]),
            ("ti_hook_set_self_timing", None, [vp, ctypes.c_bool]),
            ("ti_hook_set_compact", ctypes.c_int, [vp, ctypes.c_bool]),
            ("ti_hook_set_reuse_probe", ctypes.c_int64, [vp, vp, vp]),
            ("ti_hook_compact_stats", None, [vp, vp]),
            ("ti_hook_end_graph", ctypes.c_int64, [vp, ctypes.c_uint64, vp, ctypes.c_uint32, vp]),
            ("ti_hook_flush", None, [vp]),
            ("ti_hook_copy_template", ctypes.c_int64, [vp, vp, ctypes.c_uint32, vp]),
            ("ti_hook_self_ns", ctypes.c_int64, [vp, ctypes.POINTER(ctypes.c_uint64)]),
            ("ti_hook_wake_flag", vp, [vp]),
            ("ti_hook_post_wake", ctypes.c_int, [vp]),
            ("ti_hook_wait_wake", ctypes.c_int, [vp, ctypes.c_int64]),
            ("ti_hook_wake_stats", None, [vp, vp]),
            ("ti_record_size", ctypes.c_size_t, []),
            ("ti_config_size", ctypes.c_size_t, []),
            ("ti_record_field_offset", ctypes.c_int64, [ctypes.c_char_p]),
            ("ti_record_same_shape", ctypes.c_int, [vp, vp, ctypes.c_size_t]),
            ("ti_record_scan", ctypes.c_int, [vp, ctypes.c_size_t, ctypes.c_uint64, vp, vp]),
        ]:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        eval_addr = ctypes.cast(lib.ti_hook_eval, vp).value
    except (OSError, AttributeError) as e:
        return None, f"cannot load {path}: {e}"
    why = _abi_mismatch(lib)
    if why or not eval_addr:
        return None, f"{path} does not match this package ({why or 'no ti_hook_eval'})"
    return lib, ""


_NATIVE_LIB, _NATIVE_WHY = _load_native()
NATIVE_AVAILABLE: bool = _NATIVE_LIB is not None


def _load_held(lib: ctypes.CDLL | None) -> ctypes.PyDLL | None:
    """The same library's ring calls the engine thread makes between two
    ``llama_decode`` calls, bound so that they keep the GIL: each is a short copy or
    compare, takes no lock (``ti_hook_begin_graph``: the executor's mutex, held only
    by native code for microseconds) and never calls back into Python. A ctypes call
    that released the GIL there handed it to any thread waiting for it (the planner)
    and the engine then waited for it back, for up to the switch interval."""
    if lib is None:
        return None
    vp = ctypes.c_void_p
    try:
        held = ctypes.PyDLL(lib._name)
        for name, restype, argtypes in [
            ("ti_hook_begin_graph", ctypes.c_uint64, [vp]),
            ("ti_hook_drain", ctypes.c_uint32, [vp, vp, ctypes.c_uint32]),
            ("ti_hook_pending", ctypes.c_uint32, [vp]),
            ("ti_hook_drain_like", ctypes.c_uint32, [vp, vp, ctypes.c_uint32, ctypes.c_uint64, vp]),
            (
                "ti_hook_end_graph",
                ctypes.c_int64,
                [vp, ctypes.c_uint64, vp, ctypes.c_uint32, vp],
            ),
            ("ti_hook_flush", None, [vp]),
            ("ti_hook_post_wake", ctypes.c_int, [vp]),
            ("ti_hook_copy_template", ctypes.c_int64, [vp, vp, ctypes.c_uint32, vp]),
        ]:
            fn = getattr(held, name)
            fn.restype = restype
            fn.argtypes = argtypes
    except (OSError, AttributeError):
        return None
    return held


_HELD_LIB = _load_held(_NATIVE_LIB)
if not NATIVE_AVAILABLE:
    logger.warning(
        "native eval hooks unavailable (%s); using the pure-Python callback", _NATIVE_WHY
    )


def _shape_bytes(rec: np.ndarray) -> np.ndarray:
    """``rec``'s bytes with the fields that differ between two graphs of the same shape
    (t_ns, graph, node) zeroed."""
    raw = np.ascontiguousarray(rec).view(np.uint8).reshape(len(rec), RECORD_DTYPE.itemsize)
    raw = raw.copy()
    for f in ("t_ns", "graph", "node"):
        sub, off = RECORD_DTYPE.fields[f][:2]  # type: ignore[index]
        raw[:, off : off + sub.itemsize] = 0
    return raw


def records_same_shape(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two graphs' records agree in every field but t_ns, graph and node (the
    same nodes, shapes, ops and names in the same order). In C where built (one pass
    over both, nothing written: ~3x cheaper than numpy's copy-and-compare on a cold
    cache)."""
    if len(a) != len(b) or a.dtype != RECORD_DTYPE or b.dtype != RECORD_DTYPE:
        return False
    lib = _NATIVE_LIB
    if lib is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return bool(lib.ti_record_same_shape(a.ctypes.data, b.ctypes.data, len(a)))
    return bool(np.array_equal(_shape_bytes(a), _shape_bytes(b)))


def records_scan(
    rec: np.ndarray, graph: int, seen: np.ndarray | None
) -> tuple[bool, bool, np.ndarray]:
    """One pass over a drained graph's records: (every record is an ask of ``graph``,
    ``seen`` has the same shape (:func:`records_same_shape`), each record's t_ns). In C
    where built: the records are read once (each is 240 bytes, so every field read in
    numpy touches all of them again)."""
    n = len(rec)
    lib = _NATIVE_LIB
    if seen is not None and (len(seen) != n or seen.dtype != RECORD_DTYPE):
        seen = None
    if (
        lib is not None
        and rec.dtype == RECORD_DTYPE
        and rec.flags.c_contiguous
        and (seen is None or seen.flags.c_contiguous)
    ):
        t_ns = np.empty(n, dtype=np.int64)
        got = lib.ti_record_scan(
            rec.ctypes.data, n, graph, None if seen is None else seen.ctypes.data, t_ns.ctypes.data
        )
        return bool(got & 1), bool(got & 2), t_ns
    own = bool((rec["graph"] == graph).all() and not rec["phase"].any())
    same = seen is not None and records_same_shape(rec, seen)
    return own, same, rec["t_ns"].astype(np.int64)


class GraphRecords:
    """One graph's records drained as a repeat of an earlier drain (``template``, the
    ring's records of a graph with the same nodes, shapes, ops and names): record ``i``
    is ``template[i]`` with ``t_ns[i]`` and ``graph``. What the engine thread takes
    from the ring at each decode token once shapes repeat (``NativeHook.drain_graph``):
    8 bytes per record instead of 240, nothing faulted in. ``records()`` gives the
    very records ``drain_raw`` would have."""

    __slots__ = ("graph", "t_ns", "template")

    def __init__(self, template: np.ndarray, t_ns: np.ndarray, graph: int) -> None:
        self.template = template  # read-only RECORD_DTYPE rows, shared between drains
        self.t_ns = t_ns  # int64, one per record
        self.graph = graph

    def __len__(self) -> int:
        return len(self.t_ns)

    def records(self) -> np.ndarray:
        """The records as ``RECORD_DTYPE`` rows (a copy; read-only like a drain's)."""
        out = np.frombuffer(bytearray(self.template.tobytes()), dtype=RECORD_DTYPE)
        out["t_ns"] = self.t_ns
        out["graph"] = self.graph
        out.setflags(write=False)
        return out


def as_records(raw: np.ndarray | GraphRecords) -> np.ndarray:
    """A drain's records as ``RECORD_DTYPE`` rows, whichever form it came in."""
    return raw.records() if isinstance(raw, GraphRecords) else raw


def _shape_keys(chunk: np.ndarray) -> list[bytes]:
    """Each record's shape fields, packed: its shape's cache key (``NativeHook``).
    ("S" drops trailing NULs; equal-length keys stay distinct.)"""
    packed = np.empty(len(chunk), dtype=_SHAPE_DTYPE)
    for f in _SHAPE_FIELDS:
        packed[f] = chunk[f]
    keys: list[bytes] = packed.view(f"S{_SHAPE_DTYPE.itemsize}").tolist()
    return keys


def _eval_callback_type() -> Any:
    import llama_cpp

    return llama_cpp.ggml_backend_sched_eval_callback


def _shape(
    flags: int,
    ne: Iterable[int],
    type_: int,
    src0_ne: Iterable[int],
    src0_type: int,
    src1_ne: Iterable[int],
    src1_type: int,
    nbytes: int,
) -> NodeShape | None:
    if not flags & _HAS_SHAPE:
        return None
    return NodeShape(
        ne=tuple(ne),  # type: ignore[arg-type]
        type=type_,
        src0_ne=tuple(src0_ne) if flags & _HAS_SRC0 else None,  # type: ignore[arg-type]
        src0_type=src0_type if flags & _HAS_SRC0 else -1,
        src1_ne=tuple(src1_ne) if flags & _HAS_SRC1 else None,  # type: ignore[arg-type]
        src1_type=src1_type if flags & _HAS_SRC1 else -1,
        nbytes=nbytes,
    )


class _Decoder:
    """Turns raw records into Events, caching what repeats every token (names, shapes)."""

    def __init__(self, build_shape: Callable[[Any], NodeShape | None]) -> None:
        self.texts = NodeTexts(build_shape)

    def decode(self, rows: Iterable[tuple[Any, ...]], out: list[Event]) -> None:
        """rows: (t_ns, graph, node, phase, op, name, shape_key); shape_key is hashable."""
        resolve = self.texts.resolve
        kinds = (EventKind.NODE_ASK, EventKind.NODE_DONE)  # indexed by phase
        for t_ns, graph, node, phase, op, name, key in rows:
            op_text, name_text, layer, shape = resolve(op, name, key)
            out.append(
                Event(
                    kind=kinds[phase],
                    t_ns=t_ns,
                    graph=graph,
                    node=node,
                    op=op_text,
                    name=name_text,
                    layer=layer,
                    shape=shape,
                )
            )


def _check_args(granularity: str, ring_capacity: int) -> int:
    if granularity not in _GRANULARITY_CODE:
        raise ValueError(
            f"unknown hook granularity {granularity!r}; valid choices: {', '.join(GRANULARITIES)}"
        )
    if isinstance(ring_capacity, bool) or not isinstance(ring_capacity, int):
        raise ValueError(f"ring capacity must be an integer, got {ring_capacity!r}")
    if not 0 < ring_capacity <= MAX_RING_CAPACITY:
        raise ValueError(
            f"ring capacity must be between 1 and {MAX_RING_CAPACITY} records, got {ring_capacity}"
        )
    return _GRANULARITY_CODE[granularity]


class NativeHook:
    """The C callback and its ring; Python only begins graphs and drains."""

    native = True

    def __init__(
        self, granularity: str, ring_capacity: int, api: GgmlApi, layout: TensorLayout
    ) -> None:
        code = _check_args(granularity, ring_capacity)
        lib = _NATIVE_LIB
        if lib is None:
            raise HookError(f"native eval hooks unavailable: {_NATIVE_WHY}")
        cfg = _Config(
            capacity=ring_capacity,
            granularity=code,
            op_desc=api.address(api.op_desc),
            get_name=api.address(api.get_name),
            nbytes=api.address(api.nbytes),
            valid=int(layout.valid),
            off_type=layout.off_type,
            off_ne=layout.off_ne,
            off_src=layout.off_src,
        )
        handle = ctypes.c_void_p()
        rc = lib.ti_hook_create(ctypes.byref(cfg), ctypes.byref(handle))
        if rc != 0:
            raise HookError(f"ti_hook_create failed: {os.strerror(-rc)}")
        self.granularity = granularity
        self._lib = lib
        self._held = _HELD_LIB or lib  # the engine thread's calls, GIL kept
        self._handle: int | None = handle.value
        self._overflow_at_close = 0
        self._lock = threading.Lock()  # one consumer at a time; close waits for drain
        # the planner's wake (wake_flag, wait_wake): waits under way and a close begun,
        # guarded by _lock; close frees the hook only once every wait has returned
        self._waiting = 0
        self._closing = False
        self._buf = np.zeros(min(ring_capacity, _DRAIN_CHUNK), dtype=RECORD_DTYPE)
        self._buf_addr = self._buf.ctypes.data
        self._empty = np.zeros(0, dtype=RECORD_DTYPE)
        self._empty.setflags(write=False)
        # drain_graph: the last full graph drained (its template) and the int64 slab
        # repeats' t_ns are cut from (views; a fresh slab when it runs out)
        self._tpl: np.ndarray | None = None
        self._tpl_addr = 0
        self._tns_slab = np.empty(0, dtype=np.int64)
        self._tns_addr = 0
        self._tns_pos = 0
        # compact repeats (set_compact): the C side holds the template; ours is its
        # copy of generation _tpl_gen
        self._compact = False
        self._tpl_gen = -1
        self._gen = ctypes.c_uint64()
        self._gen_ref = ctypes.byref(self._gen)
        self._decoder = _Decoder(self._shape_from_key)
        self._blocks = BlockDecoder(self._decoder.texts, records_same_shape, _shape_keys)
        self._executor: NativeExecutor | None = None
        self.user_data: ctypes.c_void_p | None = ctypes.c_void_p(handle.value)
        self.cb_eval = _eval_callback_type()(ctypes.cast(lib.ti_hook_eval, ctypes.c_void_p).value)

    def begin_graph(self) -> int:
        if self._handle is None:
            raise HookError("hook is closed")
        return int(self._held.ti_hook_begin_graph(self._handle))

    def set_compact(self, on: bool) -> None:
        """Compact repeats (``ti_hook_set_compact``, ``graph`` granularity only): a
        graph that repeats the last one node by node reaches the ring only as its ask
        times, taken by :meth:`drain_graph`; the drains flush what is held first. Call
        it, and every drain, on the thread that calls ``llama_decode``, between decodes
        (the C side's template is that thread's)."""
        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            rc = self._lib.ti_hook_set_compact(self._handle, bool(on))
            if rc != 0:
                raise HookError(f"ti_hook_set_compact failed: {os.strerror(-rc)}")
            self._compact = bool(on)
            self._tpl_gen = -1

    def set_reuse_probe(self, llama_ctx: int | None) -> bool:
        """Compact mode with llama.cpp's graph reuse (``ti_hook_set_reuse_probe``):
        ``llama_ctx`` is the context whose decodes this callback sees (None clears
        it). A graph llama.cpp reuses is then told a repeat by its nodes' addresses
        alone, without reading them. Checked against llama-cpp-python's own
        ``llama_perf_context`` (the reuse count must read the same); False, and no
        probe, where it does not. Between decodes; the context must outlive it."""
        import llama_cpp

        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            lib = self._lib
            if not llama_ctx:
                lib.ti_hook_set_reuse_probe(self._handle, None, None)
                return False
            try:
                fn = ctypes.cast(llama_cpp.llama_cpp._lib.llama_perf_context, ctypes.c_void_p)
                want = int(llama_cpp.llama_perf_context(llama_ctx).n_reused)
            except (AttributeError, OSError) as e:
                logger.info("graph reuse probe unavailable: %s", e)
                return False
            got = int(lib.ti_hook_set_reuse_probe(self._handle, fn.value, llama_ctx))
            if got != want:
                lib.ti_hook_set_reuse_probe(self._handle, None, None)
                logger.info("graph reuse probe off: it read %d, llama.cpp says %d", got, want)
                return False
            return True

    def compact_stats(self) -> dict[str, int]:
        """Compact mode's asks so far: told a repeat by address (a graph llama.cpp
        reused), by key, and recorded. Between decodes."""
        out = (ctypes.c_uint64 * 3)()
        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            self._lib.ti_hook_compact_stats(self._handle, out)
        return {"by_address": out[0], "by_key": out[1], "recorded": out[2]}

    def drain(self) -> list[Event]:
        events: list[Event] = []
        with self._lock:
            if self._handle is None:
                return events
            if self._compact:
                self._held.ti_hook_flush(self._handle)
            buf = self._buf
            while True:
                n = self._lib.ti_hook_drain(self._handle, buf.ctypes.data, len(buf))
                self._decode(buf[:n], events)
                if n < len(buf):
                    return events

    def drain_raw(self) -> np.ndarray:
        """The pending records, copied out of the ring once, straight into the array
        returned (read-only); an empty drain allocates nothing."""
        chunks: list[np.ndarray] = []
        with self._lock:
            handle = self._handle
            if handle is None:
                return self._empty
            lib = self._held
            if self._compact:
                lib.ti_hook_flush(handle)
            while True:
                want = lib.ti_hook_pending(handle)
                if not want:
                    break
                out = np.empty(want, dtype=RECORD_DTYPE)
                n = lib.ti_hook_drain(handle, out.ctypes.data, want)
                out = out[:n]
                out.setflags(write=False)
                chunks.append(out)
                if n < want:
                    break
        if not chunks:
            return self._empty
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def drain_graph(self, graph: int) -> np.ndarray | GraphRecords:
        """``drain_raw`` at the end of graph ``graph``: when its records repeat the last
        full drain's in everything but their times (every decode token), only their
        t_ns are copied out (``GraphRecords``); otherwise the records, which become the
        template for the next graphs. In compact mode (:meth:`set_compact`) the C side
        tells the repeat while the graph runs and keeps its records out of the ring."""
        if self._compact:
            return self._end_graph(graph)
        tpl = self._tpl
        if tpl is not None:
            n = len(tpl)
            with self._lock:
                handle = self._handle
                if handle is None:
                    return self._empty
                pos = self._tns_pos
                if pos + n > len(self._tns_slab):
                    self._tns_slab = np.empty(max(n, _TNS_SLAB), dtype=np.int64)
                    self._tns_addr = self._tns_slab.ctypes.data
                    pos = 0
                got = self._held.ti_hook_drain_like(
                    handle, self._tpl_addr, n, graph, self._tns_addr + 8 * pos
                )
                if got:
                    self._tns_pos = pos + n
                    t_ns = self._tns_slab[pos : pos + n]
                    t_ns.setflags(write=False)  # shared: the timeline and the planner
                    return GraphRecords(tpl, t_ns, graph)
        raw = self.drain_raw()
        if len(raw):
            self._tpl = raw
            self._tpl_addr = raw.ctypes.data
        return raw

    def _end_graph(self, graph: int) -> np.ndarray | GraphRecords:
        with self._lock:
            handle = self._handle
            if handle is None:
                return self._empty
            lib = self._held
            pos = self._tns_pos
            got = lib.ti_hook_end_graph(
                handle, graph, self._tns_addr + 8 * pos, len(self._tns_slab) - pos, self._gen_ref
            )
            if got < 0:  # the slab is short: a fresh one
                self._tns_slab = np.empty(max(-got, _TNS_SLAB), dtype=np.int64)
                self._tns_addr = self._tns_slab.ctypes.data
                pos = 0
                got = lib.ti_hook_end_graph(
                    handle, graph, self._tns_addr, len(self._tns_slab), self._gen_ref
                )
            if got > 0:
                if self._gen.value != self._tpl_gen:
                    self._copy_template(handle)
                if self._tpl is None or len(self._tpl) != got:  # cannot happen: one owner
                    raise HookError("the hook's template does not match its repeat")
                self._tns_pos = pos + got
                t_ns = self._tns_slab[pos : pos + got]
                t_ns.setflags(write=False)  # shared: the timeline and the planner
                return GraphRecords(self._tpl, t_ns, graph)
        return self.drain_raw()

    def _copy_template(self, handle: int) -> None:
        """Our copy of the C side's template (it changed: a graph that was no repeat)."""
        lib = self._lib
        n = -int(lib.ti_hook_copy_template(handle, None, 0, self._gen_ref))
        tpl = np.empty(n, dtype=RECORD_DTYPE)
        if lib.ti_hook_copy_template(handle, tpl.ctypes.data, n, self._gen_ref) != n:
            raise HookError("the hook's template changed while it was copied")
        tpl.setflags(write=False)
        self._tpl = tpl
        self._tpl_addr = tpl.ctypes.data
        self._tpl_gen = self._gen.value

    def decode_raw(self, raw: np.ndarray | GraphRecords) -> list[Event]:
        out: list[Event] = []
        self._decode(as_records(raw), out)
        return out

    def decode_block(self, raw: np.ndarray | GraphRecords) -> NodeBlock:
        """``decode_raw`` as arrays (engine.blocks): the same events, built only when
        read (``NodeBlock.events``)."""
        if isinstance(raw, GraphRecords):
            return self._blocks.decode_like(raw.template, raw.t_ns, raw.graph)
        return self._blocks.decode(raw)

    def _decode(self, chunk: np.ndarray, out: list[Event]) -> None:
        if not len(chunk):
            return
        # A record's shape fields, packed, are its shape's cache key: shapes repeat
        # every token.
        rows = zip(
            chunk["t_ns"].tolist(),
            chunk["graph"].tolist(),
            chunk["node"].tolist(),
            chunk["phase"].tolist(),
            chunk["op"].tolist(),
            chunk["name"].tolist(),
            _shape_keys(chunk),
            strict=True,
        )
        self._decoder.decode(rows, out)

    @staticmethod
    def _shape_from_key(key: bytes) -> NodeShape | None:
        row = np.frombuffer(key.ljust(_SHAPE_DTYPE.itemsize, b"\0"), dtype=_SHAPE_DTYPE)[0]
        return _shape(*(row[f].tolist() for f in _SHAPE_FIELDS))

    @property
    def overflow(self) -> int:
        with self._lock:
            if self._handle is None:
                return self._overflow_at_close
            return int(self._lib.ti_hook_overflow(self._handle))

    def disable(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._lib.ti_hook_disable(self._handle)

    def set_self_timing(self, on: bool) -> None:
        """Time each callback in C (a second clock read at its end, ~20 ns), for
        benchmarks: :meth:`self_time` reads the sums. Only between decodes."""
        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            self._lib.ti_hook_set_self_timing(self._handle, bool(on))

    def self_time(self) -> tuple[int, int]:
        """(ns spent inside the callback, calls timed) since the hook was created,
        counted while :meth:`set_self_timing` was on."""
        calls = ctypes.c_uint64()
        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            ns = int(self._lib.ti_hook_self_ns(self._handle, ctypes.byref(calls)))
        return ns, int(calls.value)

    def attach_executor(self, executor: NativeExecutor | None) -> None:
        """Feed ``executor`` (engine.executor) with every ask, done and begin_graph of
        this callback, natively; None detaches. Only between decodes."""
        from .executor import set_hook_executor

        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            old = self._executor
            if executor is not None and executor.handle is None:
                raise HookError("executor is closed")
            set_hook_executor(self._handle, executor.handle if executor else None)
            self._executor = executor
        if old is not None and old is not executor:
            old._attached(self, False)
        if executor is not None:
            executor._attached(self, True)

    # -- the planner's wake, posted from inside llama_decode (ti_hooks.h) ----------
    def wake_flag(self) -> ctypes.c_int32:
        """The int32 that arms the wake: store 1 in ``.value`` between decodes (the
        engine thread; a plain store, no call) and the callback's next ask, inside the
        next ``llama_decode``, posts the wake that :meth:`wait_wake` waits for. The
        memory is the hook's: store only while it is open (no decode runs after
        :meth:`close` anyway)."""
        with self._lock:
            if self._handle is None:
                raise HookError("hook is closed")
            addr = self._lib.ti_hook_wake_flag(self._handle)
        if not addr:
            raise HookError("the native hook has no wake here (no unnamed semaphores)")
        return ctypes.c_int32.from_address(addr)

    def post_wake(self) -> bool:
        """Post the wake now (any thread; the GIL kept: a post never blocks, and a
        released GIL would go to the planner it wakes); False once the hook is closing."""
        with self._lock:
            if self._handle is None or self._closing:
                return False
            rc = self._held.ti_hook_post_wake(self._handle)
        if rc != 0:
            raise HookError(f"ti_hook_post_wake failed: {os.strerror(-rc)}")
        return True

    def wait_wake(self, timeout_s: float) -> bool | None:
        """Block (GIL released) until the wake is posted: True; False after
        ``timeout_s`` without one; None once the hook is closing (it will not be
        posted again). One thread waits at a time."""
        with self._lock:
            if self._handle is None or self._closing:
                return None
            handle = self._handle
            self._waiting += 1
        try:
            rc = self._lib.ti_hook_wait_wake(handle, int(timeout_s * 1e9))
        finally:
            with self._lock:
                self._waiting -= 1
        if rc < 0:
            raise HookError(f"ti_hook_wait_wake failed: {os.strerror(-rc)}")
        return rc == 0

    def wake_stats(self) -> dict[str, int]:
        """The wakes the callback posted (armed by :meth:`wake_flag`), and failed."""
        out = (ctypes.c_uint64 * 2)()
        with self._lock:
            if self._handle is not None:
                self._lib.ti_hook_wake_stats(self._handle, out)
        return {"posted": int(out[0]), "failed": int(out[1])}

    def close(self) -> None:
        with self._lock:
            if self._handle is None:
                return
            self._lib.ti_hook_disable(self._handle)
            self._closing = True
        while True:  # a waiter still inside ti_hook_wait_wake: post until it has left
            with self._lock:
                if not self._waiting:
                    break
                self._lib.ti_hook_post_wake(self._handle)
            time.sleep(0.001)
        with self._lock:
            if self._handle is None:
                return
            self._overflow_at_close = int(self._lib.ti_hook_overflow(self._handle))
            self._lib.ti_hook_destroy(self._handle)
            self._handle = None
            self.user_data = ctypes.c_void_p(None)
            if self._executor is not None:
                self._executor._attached(self, False)
                self._executor = None


class PythonHook:
    """A ctypes eval callback with the native hook's contract and records."""

    native = False

    def __init__(
        self, granularity: str, ring_capacity: int, api: GgmlApi, layout: TensorLayout
    ) -> None:
        code = _check_args(granularity, ring_capacity)
        self.granularity = granularity
        self._code = code
        self._capacity = ring_capacity
        self._api = api
        self._layout = layout
        # deque append/popleft are atomic under the GIL: callback and drain may race.
        self._records: collections.deque[tuple[Any, ...]] = collections.deque()
        self._overflow = 0
        self._graph = 0
        self._next_node = 0
        self._cur_node = -1
        self._disabled = False
        self._closed = False
        self._failed = False
        self._decoder = _Decoder(lambda key: _shape(*key))
        self.user_data: ctypes.c_void_p | None = None
        self.cb_eval = _eval_callback_type()(self._eval)

    def _shape_key(self, tensor: int) -> tuple[Any, ...]:
        """The shape fields of the native record, in ``_shape``'s argument order."""
        nbytes = int(self._api.nbytes(tensor))
        unknown = ((0,) * 4, -1)
        if not self._layout.valid:
            return (0, *unknown, *unknown, *unknown, nbytes)
        m = TensorPrefix.from_address(tensor)
        flags, srcs = _HAS_SHAPE, [unknown, unknown]
        for i, bit in ((0, _HAS_SRC0), (1, _HAS_SRC1)):
            if m.src[i]:
                src = TensorPrefix.from_address(m.src[i])
                srcs[i] = (tuple(src.ne), src.type)
                flags |= bit
        return (flags, tuple(m.ne), m.type, *srcs[0], *srcs[1], nbytes)

    def _record(self, tensor: int, name: bytes, node: int, phase: int, t_ns: int) -> None:
        if len(self._records) >= self._capacity:
            self._overflow += 1
            return
        op = (self._api.op_desc(tensor) or b"")[: _OP_LEN - 1]
        key = self._shape_key(tensor)
        self._records.append((t_ns, self._graph, node, phase, op, name, key))

    def _eval(self, tensor: int | None, ask: bool, _user_data: int | None) -> bool:
        t_ns = now_ns()
        if self._disabled or not tensor:
            return not ask
        try:
            name_ptr = self._api.get_name(tensor)
            name = ctypes.string_at(name_ptr)[: _NAME_LEN - 1] if name_ptr else b""
            if not ask:
                self._record(tensor, name, self._cur_node, _DONE, t_ns)
                return True
            node = self._cur_node = self._next_node
            self._next_node += 1
            self._record(tensor, name, node, _ASK, t_ns)
            return self._code == 2 or (self._code == 1 and name.startswith(LAYER_OUT_PREFIX))
        except Exception:  # an exception must not escape into llama.cpp's compute loop
            if not self._failed:
                self._failed = True
                logger.exception("pure-Python eval hook failed; it stays inert from now on")
            self._disabled = True
            return not ask

    def begin_graph(self) -> int:
        if self._closed:
            raise HookError("hook is closed")
        self._graph += 1
        self._next_node = 0
        return self._graph

    def drain_raw(self) -> list[tuple[Any, ...]]:
        records = self._records
        return [records.popleft() for _ in range(len(records))]

    def decode_raw(self, raw: list[tuple[Any, ...]]) -> list[Event]:
        events: list[Event] = []
        self._decoder.decode(raw, events)
        return events

    def drain(self) -> list[Event]:
        events: list[Event] = []
        records = self._records
        self._decoder.decode((records.popleft() for _ in range(len(records))), events)
        return events

    @property
    def overflow(self) -> int:
        return self._overflow

    def disable(self) -> None:
        self._disabled = True

    def close(self) -> None:
        self._disabled = True
        self._closed = True
        self._records.clear()


def make_hook(granularity: str, ring_capacity: int, *, native: bool = True) -> EvalHook:
    """A hook at ``granularity`` with room for ``ring_capacity`` records between drains.

    ``native=True`` gives the C hook when it was built (else the pure-Python one, as
    logged once at import); ``native=False`` always gives the pure-Python one.
    """
    _check_args(granularity, ring_capacity)
    api = load_ggml()
    layout = tensor_layout()
    if native and NATIVE_AVAILABLE:
        return NativeHook(granularity, ring_capacity, api, layout)
    return PythonHook(granularity, ring_capacity, api, layout)


__all__ = [
    "GRANULARITIES",
    "NATIVE_AVAILABLE",
    "RECORD_DTYPE",
    "EvalHook",
    "GraphRecords",
    "HookError",
    "NativeHook",
    "PythonHook",
    "make_hook",
]
