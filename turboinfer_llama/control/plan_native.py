"""The tmpc planner's per-node passes, in C when the hook library was built.

Per graph the planner reads every node twice: once to learn (the clock each node ran
at, the time spent per level, the model's regressors) and once to tabulate the phase's
template at every level. In numpy that is about thirty whole-array operations over a
gemma decode graph's 600-800 nodes, ~300 us of the plan's CPU; ``hooks/ti_plan.c``
does each pass in one loop. The numpy twins below are the reference (and the fallback
where the library was not built); ``tests/test_plan_native.py`` holds the two equal.
Live and replay call the same functions, so they agree whichever one runs.
"""

from __future__ import annotations

import ctypes
import logging
from typing import NamedTuple

import numpy as np

from ..engine import hooks

logger = logging.getLogger(__name__)

LAUNCH_NS = 1_000.0  # unit of the floor term th_o, ns (TI_PLAN_LAUNCH_NS)
MAX_SEGMENTS = 2048  # clock segments inside one graph (TI_PLAN_MAX_SEG)
MAX_LEVELS = 64  # TI_PLAN_MAX_LEVELS


class _Nodes(ctypes.Structure):
    """struct ti_plan_nodes (hooks/ti_plan.h)."""

    _fields_ = [
        ("c_ns", ctypes.c_void_p),
        ("m_ns", ctypes.c_void_p),
        ("launch", ctypes.c_void_p),
        ("n", ctypes.c_size_t),
        ("c_stride", ctypes.c_size_t),
        ("m_stride", ctypes.c_size_t),
        ("launch_stride", ctypes.c_size_t),
    ]


def _load() -> tuple[ctypes.PyDLL | None, str]:
    path = hooks._native_path()
    if path is None or not hooks.NATIVE_AVAILABLE:
        return None, "turboinfer_llama/_ti_hooks was not built"
    try:
        # PyDLL keeps the GIL over the call: these calls take ~10-30 us, and handing
        # the GIL over and back would cost the planner a wait for the engine thread
        lib = ctypes.PyDLL(str(path))
        vp, sz, dbl, rc = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_double, ctypes.c_int
        nodes = ctypes.POINTER(_Nodes)
        for name, restype, argtypes in [
            ("ti_plan_nodes_size", sz, []),
            ("ti_plan_observe", rc,
             [nodes, vp, vp, vp, vp, sz, vp, dbl, vp, sz, vp, vp, sz, vp, vp, vp]),
            ("ti_plan_tabulate", rc,
             [nodes, vp, vp, vp, vp, vp, sz, dbl, dbl, vp, vp, sz, vp, vp, vp, vp, vp, vp, sz,
              vp, vp, vp, vp]),
            ("ti_plan_horizon", rc, [vp, vp, sz, sz, vp, dbl, dbl, vp, vp]),
            ("ti_plan_block_levels", rc, [vp, vp, sz, sz, vp, sz, dbl, vp, vp]),
            ("ti_plan_rls", rc, [vp, vp, vp, dbl, dbl, vp, dbl, dbl, vp, vp, vp]),
            ("ti_plan_dwell", rc, [vp, vp, sz, sz, dbl, vp]),
            ("ti_plan_layout", rc, [vp, vp, sz, sz, vp, vp, sz, vp, vp, vp]),
        ]:  # fmt: skip
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
    except (OSError, AttributeError) as e:
        return None, f"cannot load the planner's passes from {path}: {e}"
    if lib.ti_plan_nodes_size() != ctypes.sizeof(_Nodes):
        return None, f"{path} does not match this package (ti_plan_nodes size)"
    return lib, ""


_LIB, _WHY = _load()
# the C passes are used where built; tests turn this off to run the numpy twins
NATIVE: bool = _LIB is not None
if not NATIVE:
    logger.info("planner passes in numpy (%s)", _WHY)


# addresses of long-lived arrays (a level table, a graph shape's costs): id -> (the
# array, kept alive so its id is not reused, its address)
_ADDR: dict[int, tuple[np.ndarray, int]] = {}
_ADDR_KEEP = 64


def _ptr(a: np.ndarray) -> int:
    """The address of ``a``'s first element. A writable contiguous array's comes from
    ctypes' buffer view (~0.4 us); numpy's own (``a.ctypes.data``) costs ~2-3 us, and
    a graph's passes take ~15 pointers."""
    if a.flags.writeable and a.flags.c_contiguous and a.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]
    return a.ctypes.data  # type: ignore[no-any-return]


def _ptr_kept(a: np.ndarray) -> int:
    """:func:`_ptr` of an array that lives across graphs (its address never changes:
    numpy does not move an array's data while it is referenced)."""
    got = _ADDR.get(id(a))
    if got is not None and got[0] is a:
        return got[1]
    if len(_ADDR) >= _ADDR_KEEP:
        _ADDR.clear()
    addr = _ptr(a)
    _ADDR[id(a)] = (a, addr)
    return addr


def _column(a: np.ndarray) -> tuple[np.ndarray, int]:
    """``a`` as float64 with a stride that is a whole number of doubles."""
    if a.dtype != np.float64 or a.ndim != 1 or a.strides[0] % 8 or a.strides[0] <= 0:
        a = np.ascontiguousarray(a, dtype=np.float64)
    return a, a.strides[0] // 8 if len(a) > 1 else 1


_LAST_NODES: list[tuple[np.ndarray, np.ndarray, np.ndarray, _Nodes, tuple]] = []


def _nodes(c_ns: np.ndarray, m_ns: np.ndarray, launch: np.ndarray) -> tuple[_Nodes, tuple]:
    """The nodes' struct, and the arrays it points into (keep them alive over the
    call). The last one is kept: the ingest hands out the same (read-only) arrays
    while a graph's shape repeats."""
    for c0, m0, l0, nodes, keep in _LAST_NODES:
        if c0 is c_ns and m0 is m_ns and l0 is launch:
            return nodes, keep
    c, sc = _column(c_ns)
    m, sm = _column(m_ns)
    la, sl = _column(launch)
    nodes = _Nodes(_ptr(c), _ptr(m), _ptr(la), len(c), sc, sm, sl)
    keep = (c, m, la)
    if c is c_ns and m is m_ns and la is launch:
        # the caller's own arrays (no copy made): their addresses hold while they live
        _LAST_NODES[:] = [(c_ns, m_ns, launch, nodes, keep)]
    return nodes, keep


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


class Observation(NamedTuple):
    """What one graph teaches the model."""

    x: np.ndarray  # summed regressors at the theta given (PhaseModel.features)
    level_ns: np.ndarray  # time spent at each level (a node's mean clock, rounded up)
    min_hz: float  # the lowest mean clock any node ran at


def coupling_of(
    f_hz: np.ndarray, f_max_hz: float, coupling_hz: np.ndarray | None, extra: np.ndarray | None
) -> np.ndarray:
    """Extra DRAM time (relative) at clock ``f_hz``: the vote table's at the level at or
    below (``coupling_hz``/``extra``), else the smooth shape ``f_max/f - 1``."""
    if coupling_hz is None or extra is None:
        return f_max_hz / f_hz - 1.0
    # side="right" minus one is at most the last index; only the floor needs a bound
    # (np.clip costs ~10 us of Python per call in numpy 2)
    i = np.maximum(np.searchsorted(coupling_hz, f_hz * 1.0005, side="right") - 1, 0)
    return extra[i]


def mean_hz_numpy(
    starts: np.ndarray, ends: np.ndarray, seg_t: np.ndarray, seg_hz: np.ndarray
) -> np.ndarray:
    """Time-weighted mean clock over each ``[start, end]``: the clock is ``seg_hz[k]``
    from ``seg_t[k]`` to ``seg_t[k + 1]`` (its integral is piecewise linear)."""
    if len(seg_hz) == 1:  # no switch landed inside the graph: one clock throughout
        return np.full(len(starts), float(seg_hz[0]))
    integral = np.empty(len(seg_t))
    integral[0] = 0.0
    np.cumsum(np.diff(seg_t) * seg_hz, out=integral[1:])
    span = ends - starts
    hi = np.interp(ends, seg_t, integral)
    lo = np.interp(starts, seg_t, integral)
    mean = (hi - lo) / np.maximum(span, 1.0)
    if (span > 0).all():
        return mean  # type: ignore[no-any-return]
    at = seg_hz[np.maximum(np.searchsorted(seg_t, starts) - 1, 0)]
    return np.where(span > 0, mean, at)


def features_numpy(
    c_ns: np.ndarray,
    m_ns: np.ndarray,
    launches: np.ndarray,
    f_hz: np.ndarray,
    theta: np.ndarray,
    f_max_hz: float,
    coupling_hz: np.ndarray | None,
    extra: np.ndarray | None,
) -> np.ndarray:
    """Summed regressors of nodes run at ``f_hz`` (per node): compute time of
    compute-bound nodes, memory time of memory-bound ones, the partly hidden shorter
    side (at ``theta``), launches on the floor, the memory time's coupling."""
    th = theta
    ratio = f_max_hz / f_hz
    cf = c_ns * ratio
    md = m_ns * coupling_of(f_hz, f_max_hz, coupling_hz, extra)
    a, b = th[0] * cf, th[1] * m_ns + th[4] * md
    comp = a >= b
    lo = np.minimum(a, b)
    # kernels at the minimum kernel time (the floor side wins) carry only the floor
    # regressor: their time does not scale with the clock
    floor = th[3] * LAUNCH_NS * launches
    roof = ~((floor > np.maximum(a, b) + th[2] * lo) & (launches > 0))
    mem = ~comp & roof
    md = md if md.shape == m_ns.shape else np.broadcast_to(md, m_ns.shape)
    return np.array(
        [
            float(cf[comp & roof].sum()),
            float(m_ns[mem].sum()),
            float(lo[roof].sum()),
            float(launches[~roof].sum() * LAUNCH_NS),
            float(md[mem].sum()),
        ]
    )


def observe(
    c_ns: np.ndarray,
    m_ns: np.ndarray,
    launch: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    seg_t: np.ndarray,
    seg_hz: np.ndarray,
    theta: np.ndarray,
    f_max_hz: float,
    levels_hz: np.ndarray,
    coupling_hz: np.ndarray | None,
    extra: np.ndarray | None,
    *,
    native: bool | None = None,
) -> Observation:
    """One graph's clock and regressors: each node's mean clock over its span (the
    clock ``seg_hz`` between boundaries ``seg_t``), the time spent per level of
    ``levels_hz``, and ``features`` at those clocks under ``theta``."""
    n_seg = len(seg_hz)
    use_c = (
        (NATIVE if native is None else native) and _LIB is not None and 0 < n_seg <= MAX_SEGMENTS
    )
    use_c = use_c and len(c_ns) > 0 and len(levels_hz) > 0
    if use_c:
        assert _LIB is not None
        nodes, keep = _nodes(c_ns, m_ns, launch)
        st, en, tb, hz, th, lv = (_f64(a) for a in (starts, ends, seg_t, seg_hz, theta, levels_hz))
        if extra is not None and coupling_hz is not None:
            cz, ex, n_c = _f64(coupling_hz), _f64(extra), len(coupling_hz)
            cz_p, ex_p = _ptr_kept(cz), _ptr_kept(ex)
        else:
            n_c, cz_p, ex_p = 0, None, None
        # the outputs in one buffer: one address to take, not three
        out = np.empty(6 + len(lv))
        base = _ptr(out)
        rc = _LIB.ti_plan_observe(
            ctypes.byref(nodes), _ptr(st), _ptr(en), _ptr(tb), _ptr(hz), n_seg, _ptr(th),
            f_max_hz, _ptr_kept(lv), len(lv), cz_p, ex_p, n_c, base, base + 40,
            base + 8 * (5 + len(lv)),
        )  # fmt: skip
        del keep
        if rc != 0:
            raise ValueError(f"ti_plan_observe rejected its arguments ({rc})")
        return Observation(out[:5], out[5:-1], float(out[-1]))
    f = mean_hz_numpy(starts, ends, seg_t, seg_hz)
    x = features_numpy(c_ns, m_ns, launch, f, theta, f_max_hz, coupling_hz, extra)
    top = len(levels_hz) - 1
    idx = np.minimum(np.searchsorted(levels_hz, f * 0.999), top)
    per_level = np.bincount(idx, weights=ends - starts, minlength=len(levels_hz))
    return Observation(x, per_level.astype(np.float64), float(f.min()) if len(f) else 0.0)


class Tables(NamedTuple):
    """A phase's template at every level (row-major, nodes or blocks by levels)."""

    kernel_ns: np.ndarray  # (nodes, levels): each node's kernel time
    graph_ns: np.ndarray  # (levels,): the graph's time, host time included
    energy: np.ndarray  # (levels,): W x ns
    block_ns: np.ndarray  # (blocks, levels)
    block_energy: np.ndarray  # (blocks, levels), W x ns
    # the same four with the levels below ``seen`` at their worst case (the top
    # level's kernel time times ``worst``); the very same arrays when seen is 0
    safe_graph_ns: np.ndarray | None = None
    safe_energy: np.ndarray | None = None
    safe_block_ns: np.ndarray | None = None
    safe_block_energy: np.ndarray | None = None


def roof_ns(a: np.ndarray, b: np.ndarray, th_x: float) -> np.ndarray:
    """The roofline of compute side ``a`` and memory side ``b`` (ns): the longer, plus
    ``th_x`` of the shorter (the share of it that does not overlap)."""
    hi = np.maximum(a, b)
    hi += th_x * np.minimum(a, b)
    return hi


def kernel_times_numpy(
    c_ns: np.ndarray,
    m_ns: np.ndarray,
    launches: np.ndarray,
    theta: np.ndarray,
    ratio: np.ndarray,
    coupling: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-node time at every level, (nodes, levels), with its roofline terms
    (compute side, memory side, roof, floor): ``max(max(a, b) + th_x min(a, b),
    th_o launch 1 us)``, ``a = c th_c f_max/f``, ``b = m (th_m + th_d coupling)``."""
    th = theta
    a = c_ns[:, None] * (th[0] * ratio)
    b = m_ns[:, None] * (th[1] + th[4] * coupling)
    hi = roof_ns(a, b, float(th[2]))
    floor = (th[3] * LAUNCH_NS) * launches[:, None]
    return np.maximum(hi, floor), a, b, hi, floor


def _block_sums(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per-node ``values`` summed per block (between ``edges``)."""
    return np.add.reduceat(np.asarray(values, dtype=np.float64), edges[:-1])


def tabulate(
    c_ns: np.ndarray,
    m_ns: np.ndarray,
    launch: np.ndarray,
    theta: np.ndarray,
    ratio: np.ndarray,
    coupling: np.ndarray,
    busy_w: np.ndarray,
    idle_w: np.ndarray,
    time_scale: float,
    host_ns: float,
    edges: np.ndarray,
    host_node: np.ndarray | None = None,
    worst: np.ndarray | None = None,
    seen: int = 0,
    *,
    host_block: np.ndarray | None = None,
    native: bool | None = None,
) -> Tables:
    """Kernel time per node and level times ``time_scale``; the graph's host time
    ``host_ns`` (level-independent) at the nodes ``host_node`` places it (per node,
    summing to ``host_ns``: the measured gap before each node), else shared out by
    launches; whole-graph and per-block (between ``edges``) time and energy per
    level. With ``worst`` (per level) and ``seen`` > 0, also the safe tables: each
    block's kernel time at the levels below ``seen`` at least its top-level kernel
    time times ``worst``. ``host_block``: ``host_node`` summed per block, where the
    caller has it already."""
    if host_node is not None and host_block is None:
        host_block = _block_sums(host_node, edges)
    if worst is None or not 0 < seen < len(ratio):
        seen = 0
    n, n_lv = len(c_ns), len(ratio)
    use_c = (
        (NATIVE if native is None else native)
        and _LIB is not None
        and n > 0
        and 0 < n_lv <= MAX_LEVELS
    )
    if use_c:
        assert _LIB is not None
        nodes, keep = _nodes(c_ns, m_ns, launch)
        th, ra, co, bw, iw = (_f64(a) for a in (theta, ratio, coupling, busy_w, idle_w))
        ed = np.ascontiguousarray(edges, dtype=np.int64)
        nb = len(ed) - 1
        if host_node is not None and len(host_node) != n:
            raise ValueError("ti_plan_tabulate: host_node needs one value per node")
        # every output in one buffer, cut into views: one address to take, not up to nine
        sizes = (n * n_lv, n_lv, n_lv, nb * n_lv, nb * n_lv) + (
            (n_lv, n_lv, nb * n_lv, nb * n_lv) if seen else ()
        )
        buf = np.empty(sum(sizes))
        addr, at, parts = _ptr(buf), 0, []
        for size in sizes:
            parts.append((buf[at : at + size], addr + 8 * at))
            at += size
        kernel_ns, graph_ns, energy = parts[0][0].reshape(n, n_lv), parts[1][0], parts[2][0]
        block_ns, block_energy = parts[3][0].reshape(nb, n_lv), parts[4][0].reshape(nb, n_lv)
        # the blocks' host time summed here, in numpy, for the C pass and the twin alike
        hn = None if host_block is None else _f64(host_block)
        safe: tuple[int | None, int, int | None, int | None, int | None, int | None]
        if seen:
            wo = _f64(worst)  # type: ignore[arg-type]
            s_g, s_e = parts[5][0], parts[6][0]
            s_bn, s_be = parts[7][0].reshape(nb, n_lv), parts[8][0].reshape(nb, n_lv)
            safe = (_ptr_kept(wo), seen, parts[5][1], parts[6][1], parts[7][1], parts[8][1])
        else:
            safe = (None, 0, None, None, None, None)
        rc = _LIB.ti_plan_tabulate(
            ctypes.byref(nodes), _ptr(th), _ptr_kept(ra), _ptr_kept(co), _ptr_kept(bw),
            _ptr_kept(iw), n_lv, float(time_scale), float(host_ns),
            None if hn is None else _ptr(hn), _ptr_kept(ed), nb,
            parts[0][1], parts[1][1], parts[2][1], parts[3][1], parts[4][1], *safe,
        )  # fmt: skip
        del keep
        if rc != 0:
            raise ValueError(f"ti_plan_tabulate rejected its arguments ({rc})")
        if seen:
            return Tables(kernel_ns, graph_ns, energy, block_ns, block_energy, s_g, s_e, s_bn, s_be)
        return Tables(
            kernel_ns, graph_ns, energy, block_ns, block_energy,
            graph_ns, energy, block_ns, block_energy,
        )  # fmt: skip
    k = kernel_times_numpy(c_ns, m_ns, launch, theta, ratio, coupling)[0] * time_scale
    graph_kernel_ns = k.sum(axis=0)
    ck = np.add.reduceat(k, edges[:-1], axis=0)
    if host_node is None:
        per_launch = host_ns / max(float(launch.sum()), 1.0)
        ch = (np.add.reduceat(launch, edges[:-1]) * per_launch)[:, None]
    else:
        ch = host_block[:, None]  # type: ignore[index]
    graph_ns, energy = graph_kernel_ns + host_ns, busy_w * graph_kernel_ns + idle_w * host_ns
    block_ns, block_energy = ck + ch, busy_w * ck + idle_w * ch
    if not seen:
        return Tables(
            k, graph_ns, energy, block_ns, block_energy, graph_ns, energy, block_ns, block_energy
        )
    cks = ck.copy()
    cks[:, :seen] = np.maximum(ck[:, :seen], ck[:, -1:] * np.asarray(worst)[:seen])
    # summed block by block, as the C pass does
    safe_k = np.zeros(len(ratio))
    for row in cks:
        safe_k += row
    return Tables(
        k, graph_ns, energy, block_ns, block_energy,
        safe_k + host_ns, busy_w * safe_k + idle_w * host_ns, cks + ch, busy_w * cks + idle_w * ch,
    )  # fmt: skip


def horizon(
    energy: np.ndarray,
    time_ns: np.ndarray,
    penalty: np.ndarray,
    budget_ns: float,
    first_budget_ns: float | None,
) -> tuple[np.ndarray, float, bool] | None:
    """``tmpc_solver.solve_horizon`` in C: (levels, time, feasible), or None where the
    library is missing or the table too large (the caller runs the numpy twin)."""
    n_seg, n_lv = energy.shape
    if not NATIVE or _LIB is None or n_lv > MAX_LEVELS or n_seg > 16 or n_lv**n_seg > (1 << 20):
        return None
    e, t, pen = _f64(energy), _f64(time_ns), _f64(penalty)
    levels = np.empty(n_seg, dtype=np.int64)
    used = ctypes.c_double()
    first = np.inf if first_budget_ns is None else float(first_budget_ns)
    rc = _LIB.ti_plan_horizon(
        _ptr(e), _ptr(t), n_seg, n_lv, _ptr(pen), float(budget_ns), first, _ptr(levels),
        ctypes.addressof(used),
    )  # fmt: skip
    if rc < 0:
        raise ValueError(f"ti_plan_horizon rejected its arguments ({rc})")
    return levels, float(used.value), rc == 1


def block_levels(
    block_energy: np.ndarray, block_ns: np.ndarray, prices: np.ndarray, cap_ns: float
) -> tuple[np.ndarray, float] | bool | None:
    """``tmpc_solver.block_levels`` in C: (levels, time), None when no price fits, or
    False where the library is missing or the table too large (run the numpy twin)."""
    nb, n_lv = block_ns.shape
    if not NATIVE or _LIB is None or nb > 256 or n_lv > MAX_LEVELS:
        return False
    e, t, pr = _f64(block_energy), _f64(block_ns), _f64(prices)
    pr_p = _ptr_kept(pr) if pr is prices else _ptr(pr)
    levels = np.empty(nb, dtype=np.int64)
    used = ctypes.c_double()
    rc = _LIB.ti_plan_block_levels(
        _ptr(e), _ptr(t), nb, n_lv, pr_p, len(pr), float(cap_ns), _ptr(levels),
        ctypes.addressof(used),
    )  # fmt: skip
    if rc < 0:
        raise ValueError(f"ti_plan_block_levels rejected its arguments ({rc})")
    return (levels, float(used.value)) if rc == 1 else None


def dwell(levels: np.ndarray, block_ns: np.ndarray, min_ns: float) -> np.ndarray | None:
    """``tmpc_solver.dwell_merge`` in C: the levels (the input array itself when none
    changed), or None where the library is missing or the table too large (the caller
    runs the Python twin)."""
    nb, n_lv = block_ns.shape
    if not NATIVE or _LIB is None or nb > 256 or n_lv > MAX_LEVELS or nb != len(levels):
        return None
    lv = np.ascontiguousarray(levels, dtype=np.int64)
    t = _f64(block_ns)
    out = np.empty(nb, dtype=np.int64)
    rc = _LIB.ti_plan_dwell(_ptr(lv), _ptr(t), nb, n_lv, float(min_ns), _ptr(out))
    if rc < 0:
        raise ValueError(f"ti_plan_dwell rejected its arguments ({rc})")
    return out if rc == 1 else levels


def layout(
    kernel_ns: np.ndarray,
    host_ns: np.ndarray,
    block_ns: np.ndarray,
    edges: np.ndarray,
    levels: np.ndarray,
    share: bool,
    *,
    native: bool | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """A block plan (``levels``, one per block between ``edges``) laid out over its
    graph: each block's end in the plan's time (the running sum of ``block_ns`` at the
    blocks' levels), and with ``share`` each node's end as a share of the graph's time
    (node ``i`` of block ``j`` takes ``kernel_ns[i, levels[j]] + host_ns[i]``)."""
    nb, n_lv = block_ns.shape
    n = len(kernel_ns)
    if (
        (NATIVE if native is None else native)
        and _LIB is not None
        and nb == len(levels)
        and 0 < n_lv <= MAX_LEVELS
        and (not share or (n > 0 and kernel_ns.shape == (n, n_lv) and len(host_ns) == n))
    ):
        lv = np.ascontiguousarray(levels, dtype=np.int64)
        ed = np.ascontiguousarray(edges, dtype=np.int64)
        bn = _f64(block_ns)
        out = np.empty(nb + (n if share else 0))
        base = _ptr(out)
        k_p: int | None
        h_p: int | None
        s_p: int | None
        if share:
            kn, hn = _f64(kernel_ns), _f64(host_ns)
            k_p, h_p, s_p = _ptr(kn), _ptr(hn), base + 8 * nb
        else:
            k_p = h_p = s_p = None
        rc = _LIB.ti_plan_layout(
            k_p, h_p, n, n_lv, _ptr(bn), _ptr_kept(ed), nb, _ptr(lv), base, s_p
        )
        if rc != 0:
            raise ValueError(f"ti_plan_layout rejected its arguments ({rc})")
        return out[:nb], (out[nb:] if share else None)
    ends = np.cumsum(block_ns[np.arange(nb), levels])
    if not share:
        return ends, None
    lv_node = np.repeat(levels, np.diff(edges))
    cw = np.cumsum(kernel_ns[np.arange(n), lv_node] + host_ns)
    return ends, cw / max(float(cw[-1]), 1e-9)


def rls_step(
    theta: np.ndarray,
    P: np.ndarray,
    x: np.ndarray,
    y_ns: float,
    forget: float,
    th_min: np.ndarray,
    th_max: float,
    p0_trace: float,
    *,
    native: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """One recursive-least-squares step with forgetting (``PhaseModel.update``):
    regressors ``x`` took ``y_ns``, the row scaled by ``1/y_ns``. Returns new (theta,
    P, residual before the step); the inputs are not changed."""
    n = len(theta)
    if (NATIVE if native is None else native) and _LIB is not None and n == 5:
        th, p, xx = _f64(theta), _f64(P), _f64(x)
        theta_out, p_out = np.empty(5), np.empty((5, 5))
        err = ctypes.c_double()
        rc = _LIB.ti_plan_rls(
            _ptr(th), _ptr(p), _ptr(xx), float(y_ns), float(forget), _ptr_kept(th_min),
            float(th_max), float(p0_trace), _ptr(theta_out), _ptr(p_out),
            ctypes.addressof(err),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"ti_plan_rls rejected its arguments ({rc})")
        return theta_out, p_out, float(err.value)
    xs = x / y_ns
    px = P @ xs
    k = px / (forget + float(xs @ px))
    err_f = 1.0 - float(xs @ theta)
    new_theta = np.minimum(np.maximum(theta + k * err_f, th_min), th_max)
    new_p = (P - k[:, None] * px[None, :]) * (1.0 / forget)
    # bound covariance windup in directions no observation excites (scaling keeps P
    # positive definite)
    tr = float(new_p.trace())
    return new_theta, (new_p * (p0_trace / tr) if tr > p0_trace else new_p), err_f
