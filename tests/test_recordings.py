"""The recording the README's controller comparisons replay (docs/recordings/)."""

from pathlib import Path

from turboinfer_llama.engine.events import EventKind
from turboinfer_llama.trace.record import load_trace

RECORDING = Path(__file__).parent.parent / "docs/recordings/gemma3-270m-4prompts.json.gz"


def test_the_stored_recording_holds_four_gemma_requests():
    events, meta = load_trace(RECORDING)
    assert meta["model"].startswith("gemma-3-270m")
    begins = [e for e in events if e.kind == EventKind.REQUEST_BEGIN]
    ends = [e for e in events if e.kind == EventKind.REQUEST_END]
    assert len(begins) == len(ends) == 4
    # the ~1,000-token summarisation is the second prompt
    assert begins[1].n_tokens > 900 > max(b.n_tokens for b in (begins[0], begins[2], begins[3]))
    assert [e.n_tokens for e in ends] == [48] * 4
    ts = [e.t_ns for e in events]
    assert ts == sorted(ts)


def _mali_splits(slack, names):
    """The named hindsight splits of the stored recording on sim:mali-g76 (simulated)."""
    from turboinfer_llama.bench.runner import phone_trace, segments_of
    from turboinfer_llama.control.factory import for_device, make_controller
    from turboinfer_llama.devices import open_device

    events, _ = load_trace(RECORDING)
    phone = phone_trace("sim:mali-g76", segments_of(events))

    def factory():
        return open_device("sim:mali-g76")

    return {
        name: make_controller(
            name, **for_device(factory()), latency_slack=slack, trace=phone, device_factory=factory
        )
        for name in names
    }


def test_phase_request_holds_each_requests_ttft_where_phase_pools_them():
    """On sim mali-g76 the phase split's run TTFT is within 2% only by pooling: its
    prefill level runs the ~1,000-token prompt past its own budget, banked against the
    short prompts. Held to each request's TTFT (tmpc's promise), the split keeps every
    request within it, at a higher prefill level, and saves less (simulated)."""
    slack = 0.02
    got = _mali_splits(slack, ("phase", "phase-request"))
    ref = got["phase"].reference
    pooled, each = got["phase"].account(), got["phase-request"].account()
    for acc in (pooled, each):
        assert acc.ttft_ms <= (1 + slack) * ref.ttft_ms
        assert acc.tpot_ms <= (1 + slack) * ref.tpot_ms

    def worst(acc):
        return max(
            a.ttft_ns / r.ttft_ns
            for a, r in zip(acc.requests_latency, ref.requests_latency, strict=True)
        )

    assert worst(pooled) > 1 + slack  # the pooled split runs one prompt over
    assert worst(each) <= 1 + slack
    assert got["phase-request"].prefill_hz > got["phase"].prefill_hz
    assert got["phase-request"].name == "phase-request"
    assert each.energy_j > pooled.energy_j


def _prefix_changes(acc, ref):
    """TTFT and TPOT over the first k requests against the default's, for each k."""
    out, sums = [], [0, 0, 0, 0]
    for a, r in zip(acc.requests_latency, ref.requests_latency, strict=True):
        sums = [sums[0] + a.ttft_ns, sums[1] + r.ttft_ns, sums[2] + a.gaps_ns, sums[3] + r.gaps_ns]
        out.append((sums[0] / sums[1] - 1.0, sums[2] / sums[3] - 1.0))
    return out


def test_phase_prefix_keeps_the_budget_wherever_the_run_ends():
    """``phase`` keeps sim mali-g76's 2% TTFT budget over the whole run only because
    the short prompts after the ~1,000-token one come in under theirs: had the run
    ended after that prompt's request, it would have been over (+2.97%). A live
    controller cannot know which request is the last; ``phase-prefix`` keeps the
    budget after every request, and pays for it (simulated)."""
    slack = 0.02
    got = _mali_splits(slack, ("phase", "phase-prefix"))
    ref = got["phase"].reference
    pooled, prefix = got["phase"].account(), got["phase-prefix"].account()
    assert max(ttft for ttft, _ in _prefix_changes(pooled, ref)) > slack + 0.002
    for ttft, tpot in _prefix_changes(prefix, ref):
        assert ttft <= slack and tpot <= slack
    assert got["phase-prefix"].name == "phase-prefix"
    assert got["phase-prefix"].prefill_hz > got["phase"].prefill_hz
    assert prefix.energy_j > pooled.energy_j
