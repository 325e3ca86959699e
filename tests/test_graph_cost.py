"""The cost model: hand-computed ops and bytes per op family."""

from __future__ import annotations

import pytest

from turboinfer_llama.engine import graph
from turboinfer_llama.engine.events import NodeShape
from turboinfer_llama.engine.graph import bits_per_element, cost, reset_unknown_ops, unknown_ops

F32, F16, Q4_0, Q4_K, Q6_K, Q8_0, I32 = 0, 1, 2, 12, 14, 8, 26


def test_type_table_bits_per_weight() -> None:
    # block sizes from ggml-common.h: Q4_0 18 B / 32, Q4_K 144 B / 256, Q6_K 210 B / 256
    assert bits_per_element(F32) == 32
    assert bits_per_element(F16) == 16
    assert bits_per_element(Q4_0) == 18 * 8 / 32
    assert bits_per_element(Q4_K) == 144 * 8 / 256
    assert bits_per_element(Q6_K) == 210 * 8 / 256
    assert bits_per_element(Q8_0) == 34 * 8 / 32
    assert bits_per_element(30) == 16  # BF16
    assert graph.type_name(12) == "Q4_K"


def test_mul_mat_matvec_q4k() -> None:
    k, m = 640, 2048
    s = NodeShape((m, 1, 1, 1), F32, (k, m, 1, 1), Q4_K, (k, 1, 1, 1), F32)
    c = cost("MUL_MAT", s)
    weights = k * m
    assert c.flops == 2 * k * m + graph.DEQUANT_OPS_PER_WEIGHT * weights
    assert c.bytes == weights * 4.5 / 8 + k * 4 + m * 4
    assert 0 < c.compute_bound_fraction <= 1


def test_mul_mat_batch_scales_compute_not_weights() -> None:
    k, m = 640, 2048
    one = cost("MUL_MAT", NodeShape((m, 1, 1, 1), F32, (k, m, 1, 1), Q4_K, (k, 1, 1, 1), F32))
    many = cost("MUL_MAT", NodeShape((m, 64, 1, 1), F32, (k, m, 1, 1), Q4_K, (k, 64, 1, 1), F32))
    weight_bytes = k * m * 4.5 / 8
    assert many.flops - one.flops == pytest.approx(2 * k * m * 63)
    assert many.bytes - weight_bytes == pytest.approx(64 * (one.bytes - weight_bytes))
    # prefill is more compute-bound than decode
    assert many.compute_bound_fraction > one.compute_bound_fraction


def test_f16_weights_have_no_dequant_ops() -> None:
    s = NodeShape((8, 1, 1, 1), F32, (4, 8, 1, 1), F16, (4, 1, 1, 1), F32)
    assert cost("MUL_MAT", s).flops == 2 * 4 * 8


def test_elementwise_norm_rope_softmax() -> None:
    v = (640, 3, 1, 1)
    n = 640 * 3
    add = cost("ADD", NodeShape(v, F32, v, F32, v, F32))
    assert (add.flops, add.bytes) == (n, 3 * n * 4)
    gelu = cost("GELU", NodeShape(v, F32, v, F32))
    assert gelu.flops == 8 * n and gelu.bytes == 2 * n * 4
    norm = cost("RMS_NORM", NodeShape(v, F32, v, F32))
    assert norm.flops == 4 * n and norm.bytes == 3 * n * 4  # src read twice + write
    rope = cost("ROPE", NodeShape(v, F32, v, F32, (3, 1, 1, 1), I32))
    assert rope.flops == 6 * n and rope.bytes == 2 * n * 4 + 3 * 4
    soft = cost("SOFT_MAX", NodeShape(v, F32, v, F32))
    assert soft.flops == 10 * n
    glu = cost("SWIGLU", NodeShape(v, F32, (1280, 3, 1, 1), F32))
    assert glu.flops == 9 * n and glu.bytes == 2 * n * 4 + n * 4


def test_get_rows_reads_only_selected_rows() -> None:
    s = NodeShape((640, 1, 1, 1), F32, (640, 262144, 1, 1), Q6_K, (1, 1, 1, 1), I32)
    c = cost("GET_ROWS", s)
    assert c.bytes == 640 * 6.5625 / 8 + 4 + 640 * 4


def test_set_rows_is_the_kv_write_in_cache_type() -> None:
    # 256 values per token written into an F16 cache; the cache is not read
    s = NodeShape((256, 4096, 1, 1), F16, (256, 1, 1, 1), F32, (1, 1, 1, 1), 27)
    c = cost("SET_ROWS", s)
    assert c.bytes == 256 * 4 + 8 + 256 * 2
    assert c.flops == 256


def test_flash_attention_scales_with_kv_length() -> None:
    def fa(n_kv: int):
        return cost(
            "FLASH_ATTN_EXT",
            NodeShape((256, 4, 1, 1), F32, (256, 1, 4, 1), F32, (256, n_kv, 1, 1), F16),
        )

    short, long = fa(128), fa(1024)
    assert long.flops == pytest.approx(8 * short.flops)
    assert long.bytes > 7 * short.bytes * 0.9


def test_copy_converts_type() -> None:
    c = cost("CPY", NodeShape((64, 1, 1, 1), F16, (64, 1, 1, 1), F32, (64, 1, 1, 1), F16))
    assert c.bytes == 64 * 4 + 64 * 2
    cont = cost("CONT", NodeShape((64, 1, 1, 1), F32, (64, 1, 1, 1), F32))
    assert cont.bytes == 64 * 8


def test_views_are_free_and_not_unknown() -> None:
    reset_unknown_ops()
    for op in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"):
        c = cost(op, None)
        assert c.is_noop
    assert unknown_ops() == {}


def test_unknown_ops_get_a_costly_default_and_are_counted() -> None:
    reset_unknown_ops()
    c = cost("CONV_TRANSPOSE_2D", NodeShape((10, 10, 1, 1), F32, (10, 10, 1, 1), F32))
    cost("CONV_TRANSPOSE_2D", None)
    cost("MUL_MAT", None)  # known op without a shape is also a guess
    assert c.flops > 0 and c.bytes > 0
    assert unknown_ops() == {"CONV_TRANSPOSE_2D": 2, "MUL_MAT": 1}
    reset_unknown_ops()
    assert unknown_ops() == {}


def test_weight_is_reference_roofline_time() -> None:
    c = cost("ADD", NodeShape((1024, 1, 1, 1), F32, (1024, 1, 1, 1), F32, (1024, 1, 1, 1), F32))
    assert c.weight_ns == pytest.approx(c.bytes / graph.REF_BYTES_PER_S * 1e9)
