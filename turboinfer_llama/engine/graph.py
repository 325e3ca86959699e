"""Cost model: what one ggml graph node asks of a GPU, as operations and DRAM bytes.

The simulator times a kernel with a roofline from ``flops`` and ``bytes``; the timeline
shares a graph's measured time across its kernels by ``KernelCost.weight_ns``; the
controller predicts kernel times from the same numbers. Op names are what
``ggml_op_desc`` returns (unary and GLU ops by their own name, e.g. ``GELU``,
``SWIGLU``). Shapes use ggml's ``ne`` order: ``ne[0]`` is the innermost dimension.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass

from .events import NodeShape

# ggml type id -> (name, bits per element including block scales).
# Source: ggml.h ``enum ggml_type`` and the block structs in ggml-common.h
# (e.g. Q4_K: 144 bytes per 256 weights = 4.5 bits).
GGML_TYPES: dict[int, tuple[str, float]] = {
    0: ("F32", 32.0),
    1: ("F16", 16.0),
    2: ("Q4_0", 4.5),
    3: ("Q4_1", 5.0),
    6: ("Q5_0", 5.5),
    7: ("Q5_1", 6.0),
    8: ("Q8_0", 8.5),
    9: ("Q8_1", 9.0),
    10: ("Q2_K", 2.625),
    11: ("Q3_K", 3.4375),
    12: ("Q4_K", 4.5),
    13: ("Q5_K", 5.5),
    14: ("Q6_K", 6.5625),
    15: ("Q8_K", 9.125),
    16: ("IQ2_XXS", 2.0625),
    17: ("IQ2_XS", 2.3125),
    18: ("IQ3_XXS", 3.0625),
    19: ("IQ1_S", 1.5625),
    20: ("IQ4_NL", 4.5),
    21: ("IQ3_S", 3.4375),
    22: ("IQ2_S", 2.5625),
    23: ("IQ4_XS", 4.25),
    24: ("I8", 8.0),
    25: ("I16", 16.0),
    26: ("I32", 32.0),
    27: ("I64", 64.0),
    28: ("F64", 64.0),
    29: ("IQ1_M", 1.75),
    30: ("BF16", 16.0),
    34: ("TQ1_0", 1.6875),
    35: ("TQ2_0", 2.0625),
    39: ("MXFP4", 4.25),
}
_PLAIN_TYPES = frozenset({0, 1, 24, 25, 26, 27, 28, 30})

# Extra operations a GPU spends per weight to unpack and scale a quantized block before
# the multiply-add. Assumption: about 3 (mask/shift, convert, scale) on mobile GPU
# kernels, which do not have int4 dot-product units; 0 for plain float/int types.
DEQUANT_OPS_PER_WEIGHT = 3.0

# Reference machine balance used only for ``compute_bound_fraction`` and ``weight_ns``
# (the simulator has its own per-profile numbers). Values of the adreno650 profile at
# its top clock: 2048 ops/cycle x 670 MHz x 0.25 achieved, and 44 GB/s x 0.6 achieved.
REF_OPS_PER_S = 2048 * 670e6 * 0.25
REF_BYTES_PER_S = 44e9 * 0.6

# Operations per output element for element-wise work (assumption: simple arithmetic
# is one op; a transcendental such as exp/tanh/erf is about eight ALU ops on a GPU).
_SIMPLE_UNARY = frozenset(
    {
        "ABS",
        "SGN",
        "NEG",
        "STEP",
        "RELU",
        "SQR",
        "SQRT",
        "SCALE",
        "CLAMP",
        "FLOOR",
        "CEIL",
        "ROUND",
        "TRUNC",
        "HARDSIGMOID",
        "HARDSWISH",
        "LEAKY_RELU",
        "DIAG_MASK_INF",
        "DIAG_MASK_ZERO",
    }
)
_TRANSCENDENTAL_UNARY = frozenset(
    {
        "GELU",
        "GELU_ERF",
        "GELU_QUICK",
        "SILU",
        "TANH",
        "SIGMOID",
        "ELU",
        "EXP",
        "LOG",
        "SIN",
        "COS",
        "EXPM1",
        "SOFTPLUS",
        "XIELU",
    }
)
_GLU = frozenset({"GLU", "REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_OAI"})
_BINARY = frozenset({"ADD", "SUB", "MUL", "DIV", "ADD1", "ADD_ID"})
_NORMS = frozenset({"NORM", "RMS_NORM", "L2_NORM", "GROUP_NORM"})
_COPIES = frozenset({"CPY", "CONT", "DUP"})
_DATA_MOVES = frozenset({"REPEAT", "CONCAT", "PAD", "ACC", "GET_ROWS_BACK", "ROLL"})
_REDUCTIONS = frozenset({"SUM", "SUM_ROWS", "MEAN", "ARGMAX", "ARGSORT", "TOP_K", "COUNT_EQUAL"})
# Nodes that only relabel memory: ggml's backends launch nothing for them.
NOOP_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})

# Conservative default for ops we do not model: treat every output element as 8 ops
# (frequency-sensitive) and read all sources once, so an unknown node is never
# assumed to be a free stall.
_UNKNOWN_OPS_PER_ELEMENT = 8.0

_unknown_lock = threading.Lock()
_unknown: Counter[str] = Counter()


@dataclass(frozen=True, slots=True)
class KernelCost:
    """Work of one node. ``flops`` counts all ALU operations (dequantisation included);
    ``bytes`` is DRAM traffic. ``compute_bound_fraction`` is compute time / memory-or-
    compute time on the reference machine: 1.0 means the kernel slows as soon as the
    clock drops; 0.3 means the clock could fall to ~30% before it slows."""

    op: str
    flops: float
    bytes: float
    compute_bound_fraction: float

    @property
    def is_noop(self) -> bool:
        return self.flops == 0 and self.bytes == 0

    @property
    def weight_ns(self) -> float:
        """Roofline time on the reference machine: a relative weight for sharing a
        graph's measured time across its kernels."""
        return max(self.flops / REF_OPS_PER_S, self.bytes / REF_BYTES_PER_S) * 1e9


def bits_per_element(ggml_type: int) -> float:
    """Storage bits per element of a ggml type (F16 for an unknown id: an assumption)."""
    entry = GGML_TYPES.get(ggml_type)
    return entry[1] if entry else 16.0


def type_name(ggml_type: int) -> str:
    entry = GGML_TYPES.get(ggml_type)
    return entry[0] if entry else f"type{ggml_type}"


def unknown_ops() -> dict[str, int]:
    """How many times each unmodelled op was costed with the default, since start or
    the last ``reset_unknown_ops``."""
    with _unknown_lock:
        return dict(_unknown)


def reset_unknown_ops() -> None:
    with _unknown_lock:
        _unknown.clear()


def _n(ne: tuple[int, int, int, int] | None) -> int:
    return math.prod(ne) if ne else 0


def _b(ne: tuple[int, int, int, int] | None, ggml_type: int) -> float:
    if not ne:
        return 0.0
    return _n(ne) * bits_per_element(ggml_type if ggml_type >= 0 else 0) / 8.0


def _make(op: str, flops: float, nbytes: float) -> KernelCost:
    t_c = flops / REF_OPS_PER_S
    t_m = nbytes / REF_BYTES_PER_S
    longest = max(t_c, t_m)
    fraction = t_c / longest if longest > 0 else 0.0
    return KernelCost(op, float(flops), float(nbytes), fraction)


def _dequant_ops(ggml_type: int) -> float:
    return 0.0 if ggml_type in _PLAIN_TYPES or ggml_type < 0 else DEQUANT_OPS_PER_WEIGHT


def _mul_mat(s: NodeShape) -> KernelCost:
    if s.src0_ne is None or s.src1_ne is None:
        return _default("MUL_MAT", s)
    k, m = s.src0_ne[0], s.src0_ne[1]
    n_cols = s.src1_ne[1] * s.src1_ne[2] * s.src1_ne[3]
    weights = _n(s.src0_ne)
    flops = 2.0 * k * m * n_cols + _dequant_ops(s.src0_type) * weights
    nbytes = _b(s.src0_ne, s.src0_type) + _b(s.src1_ne, s.src1_type) + _b(s.ne, s.type)
    return _make("MUL_MAT", flops, nbytes)


def _mul_mat_id(s: NodeShape) -> KernelCost:
    """Mixture-of-experts: only the experts the routed tokens use are read."""
    if s.src0_ne is None or s.src1_ne is None:
        return _default("MUL_MAT_ID", s)
    k, m, n_expert = s.src0_ne[0], s.src0_ne[1], max(1, s.src0_ne[2])
    n_used, n_tokens = s.src1_ne[1], s.src1_ne[2] * s.src1_ne[3]
    experts_read = min(n_expert, n_used * n_tokens)
    weights = k * m * experts_read
    flops = 2.0 * k * m * n_used * n_tokens + _dequant_ops(s.src0_type) * weights
    nbytes = (
        weights * bits_per_element(s.src0_type) / 8.0
        + _b(s.src1_ne, s.src1_type)
        + _b(s.ne, s.type)
    )
    return _make("MUL_MAT_ID", flops, nbytes)


def _flash_attn(s: NodeShape) -> KernelCost:
    """q: src0 [D, n_q, H, B]; k: src1 [D, n_kv, H_kv, B]; v is assumed shaped and typed
    like k (src2 is not recorded). QK^T and PV are 2*D*n_kv per query and head each,
    plus ~5 ops per score for the online softmax."""
    if s.src0_ne is None or s.src1_ne is None:
        return _default("FLASH_ATTN_EXT", s)
    d, n_q, heads, batch = s.src0_ne
    n_kv = s.src1_ne[1]
    scores = float(n_kv) * n_q * heads * batch
    flops = 4.0 * d * scores + 5.0 * scores
    kv_bytes = 2.0 * _b(s.src1_ne, s.src1_type)
    nbytes = _b(s.src0_ne, s.src0_type) + kv_bytes + _b(s.ne, s.type)
    return _make("FLASH_ATTN_EXT", flops, nbytes)


def _elementwise(op: str, s: NodeShape, ops_per_element: float, passes: float = 1.0) -> KernelCost:
    n = _n(s.ne)
    nbytes = passes * (_b(s.src0_ne, s.src0_type) + _b(s.src1_ne, s.src1_type)) + _b(s.ne, s.type)
    if s.src0_ne is None and s.src1_ne is None:
        nbytes = 2.0 * _b(s.ne, s.type)
    return _make(op, ops_per_element * n, nbytes)


def _get_rows(s: NodeShape) -> KernelCost:
    """Reads only the selected rows of src0 (e.g. token embeddings), dequantising them."""
    n_out = _n(s.ne)
    nbytes = (
        n_out * bits_per_element(s.src0_type) / 8.0 + _b(s.src1_ne, s.src1_type) + _b(s.ne, s.type)
    )
    return _make("GET_ROWS", (1.0 + _dequant_ops(s.src0_type)) * n_out, nbytes)


def _set_rows(s: NodeShape) -> KernelCost:
    """The KV-cache write: src0 rows converted to the destination's type and stored;
    the destination tensor (the whole cache) is not read."""
    n_in = _n(s.src0_ne) if s.src0_ne else 0
    nbytes = (
        _b(s.src0_ne, s.src0_type)
        + _b(s.src1_ne, s.src1_type)
        + n_in * bits_per_element(s.type) / 8.0
    )
    return _make("SET_ROWS", float(n_in), nbytes)


def _copy(op: str, s: NodeShape) -> KernelCost:
    """CPY writes src0 into src1's type; CONT/DUP into the node's own type."""
    src = s.src0_ne if s.src0_ne is not None else s.ne
    n = _n(src)
    dst_type = s.src1_type if op == "CPY" and s.src1_type >= 0 else s.type
    nbytes = _b(src, s.src0_type if s.src0_ne is not None else s.type)
    nbytes += n * bits_per_element(dst_type) / 8.0
    return _make(op, float(n), nbytes)


def _default(op: str, s: NodeShape | None) -> KernelCost:
    with _unknown_lock:
        _unknown[op] += 1
    if s is None:
        # Nothing known: a mid-size element-wise kernel (1 Mi elements of F32 in and out).
        n = float(1 << 20)
        return _make(op, _UNKNOWN_OPS_PER_ELEMENT * n, 8.0 * n)
    nbytes = _b(s.src0_ne, s.src0_type) + _b(s.src1_ne, s.src1_type) + _b(s.ne, s.type)
    if nbytes == 0:
        nbytes = float(s.nbytes)
    return _make(op, _UNKNOWN_OPS_PER_ELEMENT * max(_n(s.ne), 1), nbytes)


def cost(op: str, shape: NodeShape | None) -> KernelCost:
    """The work of one node. Unknown ops (and known ones without a shape) get a
    conservative default and are counted in ``unknown_ops()``."""
    op = op.upper()
    if op in NOOP_OPS:
        return KernelCost(op, 0.0, 0.0, 0.0)
    if shape is None:
        return _default(op, None)
    if op == "MUL_MAT":
        return _mul_mat(shape)
    if op == "MUL_MAT_ID":
        return _mul_mat_id(shape)
    if op == "FLASH_ATTN_EXT":
        return _flash_attn(shape)
    if op == "GET_ROWS":
        return _get_rows(shape)
    if op == "SET_ROWS":
        return _set_rows(shape)
    if op in _COPIES:
        return _copy(op, shape)
    if op in _BINARY:
        return _elementwise(op, shape, 1.0)
    if op in _SIMPLE_UNARY:
        return _elementwise(op, shape, 1.0)
    if op in _TRANSCENDENTAL_UNARY:
        return _elementwise(op, shape, 8.0)
    if op in _GLU:
        # activation (transcendental) of one half times the other half
        return _elementwise(op, shape, 9.0)
    if op in _NORMS:
        # mean/variance pass then normalise pass: src read twice, ~4 ops per element
        return _elementwise(op, shape, 4.0, passes=2.0)
    if op == "SOFT_MAX":
        # max, exp-sum and normalise passes over the row (plus optional mask)
        return _elementwise(op, shape, 10.0, passes=2.0)
    if op == "ROPE":
        # sin/cos of the angle (transcendental) and a 2x2 rotation per pair
        return _elementwise(op, shape, 6.0)
    if op in _DATA_MOVES:
        return _elementwise(op, shape, 1.0)
    if op in _REDUCTIONS:
        src = shape.src0_ne or shape.ne
        nbytes = _b(shape.src0_ne, shape.src0_type) + _b(shape.ne, shape.type)
        return _make(op, float(_n(src)) * (4.0 if op in ("ARGSORT", "TOP_K") else 1.0), nbytes)
    return _default(op, shape)
