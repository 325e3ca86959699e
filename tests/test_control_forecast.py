"""Forecaster: convergence on stationary stall streams, re-convergence after a shift."""

import numpy as np
import pytest

from turboinfer_llama.control.forecast import EnginePosition, Forecaster, StallStats
from turboinfer_llama.engine.events import StallKind


def _stream(rng, median_ns, n, sigma=0.2):
    return median_ns * rng.lognormal(0.0, sigma, n)


def test_converges_on_stationary_stream():
    rng = np.random.default_rng(1)
    st = StallStats(window=64, quantile=0.9)
    for x in _stream(rng, 3e6, 400):
        st.update(x)
    est = st.estimate()
    true_q90 = 3e6 * np.exp(0.2 * 1.2816)
    assert est.typical_ns == pytest.approx(3e6, rel=0.08)
    assert est.upper_ns == pytest.approx(true_q90, rel=0.12)
    assert est.lower_ns < est.typical_ns < est.upper_ns
    assert est.err_ns == pytest.approx(
        max(est.upper_ns - est.typical_ns, est.typical_ns - est.lower_ns)
    )
    assert st.shifts <= 1  # a stationary stream does not look like drift


def test_reconverges_quickly_after_a_shift():
    rng = np.random.default_rng(2)
    st = StallStats(window=64, quantile=0.9, drift_run=6)
    for x in _stream(rng, 3e6, 200):
        st.update(x)
    for x in _stream(rng, 6e6, 10):  # a regime shift: twice the sampling time
        st.update(x)
    assert st.shifts >= 1
    assert st.estimate().typical_ns == pytest.approx(6e6, rel=0.15)
    for x in _stream(rng, 6e6, 100):
        st.update(x)
    assert st.estimate().typical_ns == pytest.approx(6e6, rel=0.08)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="quantile"):
        StallStats(quantile=0.4)
    with pytest.raises(ValueError, match="window"):
        StallStats(window=8, drift_run=6)


def test_engine_position_uses_the_previous_graph_as_template():
    pos = EnginePosition(cost_fn=lambda op, shape: (10.0, 2.0))
    pos.begin_graph(0, "decode")
    for i in range(5):
        pos.ask(i, "MUL_MAT", None)
    pos.end_graph()
    pos.begin_graph(1, "decode")
    assert pos.remaining_work() == (50.0, 10.0, 5)
    pos.ask(0, "MUL_MAT", None)
    pos.done(1)
    assert pos.remaining_work() == (30.0, 6.0, 3)
    assert pos.next_stall() is StallKind.INTER_KERNEL
    pos.done(3)
    assert pos.next_stall() is StallKind.SAMPLE  # graph end -> sampling


def test_forecaster_keeps_one_estimate_per_kind():
    f = Forecaster(cost_fn=lambda op, shape: (0.0, 0.0))
    f.observe(StallKind.SAMPLE, 3e6)
    f.observe(StallKind.SUBMIT, 1e5)
    assert f.estimate(StallKind.SAMPLE).typical_ns == 3e6
    assert f.estimate(StallKind.SUBMIT).typical_ns == 1e5
    assert f.estimate(StallKind.IDLE).n == 0
