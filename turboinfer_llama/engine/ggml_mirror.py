"""ggml's tensor accessors, and a mirror of the ``ggml_tensor`` struct prefix checked at load.

ggml exports accessors for a node's op (``ggml_op_desc``), name (``ggml_get_name``) and
size (``ggml_nbytes``, ``ggml_nelements``) but none for its shape, type or sources. The
hooks need those to cost a kernel later, so :class:`TensorPrefix` mirrors the start of
``struct ggml_tensor`` as ggml.h lays it out (llama.cpp as vendored by
llama-cpp-python 0.3.x; the header was read for reference, not copied). Because a
llama.cpp upgrade could move the fields, :func:`tensor_layout` checks the mirror once
against the accessors on real tensors built with libggml-base; on any mismatch the
hooks record op, name and size only, and we log why.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("turboinfer_llama")

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
# ggml_type values are part of the GGUF file format, so they do not move.
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
_TYPE_SIZE = {GGML_TYPE_F32: 4, GGML_TYPE_F16: 2}


class GgmlUnavailable(RuntimeError):
    """libggml-base (shipped inside llama-cpp-python) cannot be found or loaded."""


class TensorPrefix(ctypes.Structure):
    """The leading fields of ``struct ggml_tensor`` (ggml.h), up to and including ``name``."""

    _fields_ = [
        ("type", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int32),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
    ]


class _InitParams(ctypes.Structure):
    """``struct ggml_init_params``, passed by value to ``ggml_init``."""

    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


@dataclass(frozen=True)
class TensorLayout:
    """Where the hooks find type, ne and src inside a tensor; ``valid`` False: don't look."""

    valid: bool
    reason: str
    off_type: int = -1
    off_ne: int = -1
    off_src: int = -1


@dataclass(frozen=True)
class GgmlApi:
    """libggml-base, with the accessors the hooks call typed for ctypes."""

    path: Path
    lib: ctypes.CDLL
    op_desc: Callable[[int], bytes | None]
    get_name: Callable[[int], int | None]
    nbytes: Callable[[int], int]
    nelements: Callable[[int], int]

    def address(self, fn: Any) -> int:
        """The C address of one of the accessors, to hand to the native library."""
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        if not addr:
            raise GgmlUnavailable(f"null address for a ggml accessor in {self.path}")
        return int(addr)


def find_ggml_base() -> Path:
    """Path of libggml-base next to llama-cpp-python's own libraries."""
    try:
        import llama_cpp
    except ImportError as e:
        raise GgmlUnavailable(
            "llama-cpp-python is not importable; install it (see README: make install)"
        ) from e
    libdir = Path(llama_cpp.__file__).resolve().parent / "lib"
    for pattern in ("libggml-base.so", "libggml-base.so.*", "libggml-base.dylib"):
        found = sorted(libdir.glob(pattern))
        if found:
            return found[0]
    raise GgmlUnavailable(f"libggml-base not found in {libdir}")


def _typed(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


@functools.cache
def load_ggml() -> GgmlApi:
    """Load libggml-base once (the same mapping llama.cpp already uses) and type its API."""
    path = find_ggml_base()
    try:
        lib = ctypes.CDLL(str(path))
        vp = ctypes.c_void_p
        _typed(lib, "ggml_tensor_overhead", ctypes.c_size_t)
        _typed(lib, "ggml_init", vp, _InitParams)
        _typed(lib, "ggml_free", None, vp)
        _typed(lib, "ggml_new_tensor_1d", vp, vp, ctypes.c_int, ctypes.c_int64)
        _typed(lib, "ggml_new_tensor_4d", vp, vp, ctypes.c_int, *[ctypes.c_int64] * 4)
        _typed(lib, "ggml_add", vp, vp, vp, vp)
        _typed(lib, "ggml_set_name", vp, vp, ctypes.c_char_p)
        _typed(lib, "ggml_op_name", ctypes.c_char_p, ctypes.c_int)
        _typed(lib, "ggml_type_name", ctypes.c_char_p, ctypes.c_int)
        return GgmlApi(
            path=path,
            lib=lib,
            op_desc=_typed(lib, "ggml_op_desc", ctypes.c_char_p, vp),
            get_name=_typed(lib, "ggml_get_name", vp, vp),
            nbytes=_typed(lib, "ggml_nbytes", ctypes.c_size_t, vp),
            nelements=_typed(lib, "ggml_nelements", ctypes.c_int64, vp),
        )
    except (OSError, AttributeError) as e:
        raise GgmlUnavailable(f"cannot use {path}: {e}") from e


@dataclass(frozen=True)
class _Probe:
    ptr: int
    name: bytes
    ne: tuple[int, int, int, int]
    type: int
    op: str


def _check_tensor(
    api: GgmlApi, mirror: type[ctypes.Structure], p: _Probe, scratch: ctypes.Array
) -> list[str]:
    """Mismatches between the mirror's view of one tensor and the accessors'."""
    m: Any = mirror.from_address(p.ptr)
    bad = []
    ne = tuple(m.ne)
    if ne != p.ne or math.prod(ne) != api.nelements(p.ptr):
        bad.append(f"{p.name!r}: ne {ne}, expected {p.ne} ({api.nelements(p.ptr)} elements)")
    if api.get_name(p.ptr) != p.ptr + mirror.name.offset:  # type: ignore[attr-defined]
        bad.append(f"{p.name!r}: name is not at offset {mirror.name.offset}")  # type: ignore[attr-defined]
    elif m.name != p.name:
        bad.append(f"{p.name!r}: name reads {m.name!r}")
    if m.type != p.type:
        bad.append(f"{p.name!r}: type {m.type}, expected {p.type}")
    elif api.nbytes(p.ptr) != math.prod(p.ne) * _TYPE_SIZE[p.type]:
        bad.append(f"{p.name!r}: nbytes {api.nbytes(p.ptr)} disagrees with ne and type")
    # The op field is checked on a scratch copy: zeroing it there (GGML_OP_NONE) must
    # turn ggml_op_desc into "NONE". No out-of-range op value is ever passed to ggml.
    ctypes.memmove(scratch, p.ptr, len(scratch))
    ctypes.c_int32.from_buffer(scratch, mirror.op.offset).value = 0  # type: ignore[attr-defined]
    if (api.op_desc(p.ptr) or b"").decode() != p.op or api.op_desc(
        ctypes.addressof(scratch)
    ) != b"NONE":
        bad.append(f"{p.name!r}: op is not at offset {mirror.op.offset}")  # type: ignore[attr-defined]
    elif (api.lib.ggml_op_name(m.op) or b"").decode() != p.op:
        bad.append(f"{p.name!r}: ggml_op_name({m.op}) is not {p.op}")
    return bad


def _probe(api: GgmlApi, mirror: type[ctypes.Structure], ctx: int, overhead: int) -> list[str]:
    lib = api.lib
    a = lib.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 5, 7, 2)
    b = lib.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 1, 7, 1)
    h = lib.ggml_new_tensor_1d(ctx, GGML_TYPE_F16, 9)
    if not (a and b and h):
        return ["ggml_new_tensor failed"]
    s = lib.ggml_add(ctx, a, b)
    if not s:
        return ["ggml_add failed"]
    probes = [
        _Probe(a, b"ti_probe_a", (3, 5, 7, 2), GGML_TYPE_F32, "NONE"),
        _Probe(b, b"ti_probe_b", (3, 1, 7, 1), GGML_TYPE_F32, "NONE"),
        _Probe(h, b"ti_probe_h", (9, 1, 1, 1), GGML_TYPE_F16, "NONE"),
        _Probe(s, b"ti_probe_sum", (3, 5, 7, 2), GGML_TYPE_F32, "ADD"),
    ]
    scratch = (ctypes.c_char * overhead)()
    bad = []
    for p in probes:
        lib.ggml_set_name(p.ptr, p.name)
        bad += _check_tensor(api, mirror, p, scratch)
    src = list(mirror.from_address(s).src)  # type: ignore[attr-defined]
    if src[:2] != [a, b] or any(src[2:]):
        bad.append("src of ggml_add(a, b) does not read [a, b, NULL...]")
    return bad


def check_layout(api: GgmlApi, mirror: type[ctypes.Structure] = TensorPrefix) -> TensorLayout:
    """Compare ``mirror`` with ggml's accessors on real tensors; never raises on mismatch."""
    lib = api.lib
    overhead = int(lib.ggml_tensor_overhead())
    # Room for the probe tensors plus slack, so scratch copies of `overhead` bytes
    # starting at any probe tensor stay inside the pool.
    params = _InitParams(mem_size=16 * overhead, mem_buffer=None, no_alloc=True)
    ctx = lib.ggml_init(params)
    if not ctx:
        return TensorLayout(False, "ggml_init failed for the layout probe")
    try:
        bad = _probe(api, mirror, ctx, overhead)
    finally:
        lib.ggml_free(ctx)
    if bad:
        return TensorLayout(False, "; ".join(bad))
    return TensorLayout(
        True,
        "verified against ggml accessors",
        off_type=mirror.type.offset,  # type: ignore[attr-defined]
        off_ne=mirror.ne.offset,  # type: ignore[attr-defined]
        off_src=mirror.src.offset,  # type: ignore[attr-defined]
    )


@functools.cache
def tensor_layout() -> TensorLayout:
    """The verified layout for this process's libggml-base; logs once when it fails."""
    layout = check_layout(load_ggml())
    if not layout.valid:
        logger.warning(
            "ggml_tensor layout check failed (%s): hook records carry op, name and "
            "size only, no shapes",
            layout.reason,
        )
    return layout
