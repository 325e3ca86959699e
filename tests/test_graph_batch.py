"""The live ingest: ring records -> one GraphBatch per graph, with its per-shape cache."""

from __future__ import annotations

import numpy as np
import pytest

from turboinfer_llama.bench.decision_time import _records
from turboinfer_llama.control.graph_batch import NodeCosts, batch_from_records
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.engine import hooks


@pytest.fixture(scope="module")
def graphs():
    """Records of a synthetic gemma run, per graph (prefill 0, decode 1.. with the KV
    padded to 256 cells: decode graphs share one shape)."""
    out: dict[int, list] = {}
    for s in make_trace(requests=1, decode_tokens=4):
        if s.kind == "kernel":
            out.setdefault(s.graph, []).append(s)
    return {g: _records(g, nodes) for g, nodes in out.items()}


@pytest.fixture(params=["native", "numpy"])
def record_lib(request, monkeypatch):
    """Run the record helpers in C (where built) and in their numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(hooks, "_NATIVE_LIB", None)
    elif not hooks.NATIVE_AVAILABLE:
        pytest.skip("hook library not built")
    return request.param


def test_same_shape_ignores_only_time_graph_and_node(graphs, record_lib):
    a, b = graphs[1], graphs[2]
    assert hooks.records_same_shape(a, b)
    moved = b.copy()
    moved["t_ns"] += 12_345
    moved["node"] += 7
    moved["graph"] += 3
    assert hooks.records_same_shape(a, moved)
    for field, row in (("ne", 5), ("op", 17), ("name", 100), ("src1_type", len(b) - 1)):
        changed = b.copy()
        if field == "ne":
            changed["ne"][row, 1] += 1
        elif field in ("op", "name"):
            changed[field][row] = b"X" + bytes(changed[field][row])[1:]
        else:
            changed[field][row] += 1
        assert not hooks.records_same_shape(a, changed), field
    assert not hooks.records_same_shape(a, b[:-1])
    assert not hooks.records_same_shape(a, graphs[0][: len(a)])  # the prefill's


def _batch(rec, graph, costs, granularity="graph"):
    return batch_from_records(
        rec,
        graph=graph,
        n_tokens=1,
        granularity=granularity,
        t_begin_ns=int(rec["t_ns"].min()) - 1_000,
        t_end_ns=int(rec["t_ns"].max()) + 1_000,
        costs=costs,
    )


def test_repeated_shape_hits_the_cache_with_the_same_costs(graphs):
    costs = NodeCosts()
    first = _batch(graphs[1], 1, costs)
    second = _batch(graphs[2], 2, costs)
    assert costs.graph_hits == 1
    assert second.c_ns is first.c_ns  # handed out from the cache
    fresh = _batch(graphs[2], 2, NodeCosts())
    np.testing.assert_array_equal(second.c_ns, fresh.c_ns)
    np.testing.assert_array_equal(second.m_ns, fresh.m_ns)
    np.testing.assert_array_equal(second.layer_out, fresh.layer_out)
    assert second.layer_out.any()
    # a different shape (the prefill) misses and gets its own costs
    pre = _batch(graphs[0], 0, costs)
    assert costs.graph_hits == 1
    assert not np.array_equal(pre.c_ns, first.c_ns)


def test_mixed_ring_selects_the_graphs_asks_and_completions(graphs):
    """A ring holding two graphs and completion records (kernel granularity) gives each
    graph exactly what a ring of its own asks gives, with its completion times."""
    a, b = graphs[1].copy(), graphs[2].copy()
    done = a.copy()
    done["phase"] = 1
    done["t_ns"] += 500
    ring = np.concatenate([a, done, b])
    costs = NodeCosts()
    got = _batch(ring, 1, costs, "kernel")
    alone = _batch(a, 1, NodeCosts(), "kernel")
    np.testing.assert_array_equal(got.ask_ns, alone.ask_ns)
    np.testing.assert_array_equal(got.c_ns, alone.c_ns)
    np.testing.assert_array_equal(got.done_ns, a["t_ns"] + 500)
    assert (alone.done_ns == -1).all()
    other = _batch(ring, 2, costs, "kernel")
    np.testing.assert_array_equal(other.ask_ns, b["t_ns"])
    assert (other.done_ns == -1).all()


def test_scan_flags_own_asks_and_shape(graphs, record_lib):
    a, b = graphs[1], graphs[2]
    own, same, t_ns = hooks.records_scan(b, 2, a)
    assert (own, same) == (True, True)
    np.testing.assert_array_equal(t_ns, b["t_ns"])
    assert hooks.records_scan(b, 1, a)[:2] == (False, True)  # another graph's records
    done = b.copy()
    done["phase"][3] = 1
    # a completion inside: not only asks (and its phase byte differs from the asks)
    assert hooks.records_scan(done, 2, a)[:2] == (False, False)
    shape = b.copy()
    shape["src0_ne"][7, 0] += 1
    assert hooks.records_scan(shape, 2, a)[:2] == (True, False)
    assert hooks.records_scan(b, 2, None)[:2] == (True, False)  # nothing seen yet
    assert hooks.records_scan(b, 2, a[:-1])[:2] == (True, False)  # another length


def test_no_completions_is_told_by_identity():
    """The planner skips its pass over ``done_ns`` only for the ingest's own shared
    all -1 array; an equal array of another origin is read as before."""
    from turboinfer_llama.control import graph_batch

    own = graph_batch.none_done(7)
    assert graph_batch.is_none_done(own)
    assert graph_batch.none_done(7) is own
    assert not graph_batch.is_none_done(np.full(7, -1, dtype=np.int64))
    assert not graph_batch.is_none_done(np.arange(7, dtype=np.int64))
