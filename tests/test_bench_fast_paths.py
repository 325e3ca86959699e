"""The benchmark's faster set-up paths against the code they replaced (kept here as
the reference): ``accounting.phone_segments`` (no-op test cached per shape object, gaps
without a per-kernel dict) gives the very same segments."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turboinfer_llama.accounting import _with_dur, phone_segments
from turboinfer_llama.control.synthetic import make_trace
from turboinfer_llama.devices.sim import SimProfile, load_profile
from turboinfer_llama.engine.events import StallKind
from turboinfer_llama.engine.graph import cost
from turboinfer_llama.engine.segments import Segment


def _phone_segments_reference(segments: Sequence[Segment], profile: SimProfile) -> list[Segment]:
    """``phone_segments`` as it was (one ``cost`` per kernel, a dict of gaps by id)."""
    out: list[Segment] = []
    segs = list(segments)
    i = 0
    n = len(segs)
    while i < n:
        s = segs[i]
        if s.kind == "stall":
            if s.stall is StallKind.INTER_KERNEL:
                i += 1
                continue
            if s.stall in (StallKind.SUBMIT, StallKind.SAMPLE):
                s = _with_dur(s, profile.scale_host_ns(s.dur_ns))
            out.append(s)
            i += 1
            continue
        j = i
        graph_kernels: list[Segment] = []
        while j < n and (
            (segs[j].kind == "kernel" and segs[j].graph == s.graph)
            or segs[j].stall is StallKind.INTER_KERNEL
        ):
            if segs[j].kind == "kernel":
                graph_kernels.append(segs[j])
            j += 1
        real = [k for k in graph_kernels if not cost(k.op, k.shape).is_noop]
        gaps = profile.host_gaps_ns(len(real))
        gap_of = {id(k): int(g) for k, g in zip(real, gaps, strict=True)}
        for k in graph_kernels:
            g = gap_of.get(id(k), 0)
            if g > 0:
                out.append(
                    Segment(
                        "stall",
                        k.t_ns,
                        g,
                        k.phase,
                        stall=StallKind.INTER_KERNEL,
                        request=k.request,
                        token=k.token,
                        graph=k.graph,
                    )
                )
            out.append(k)
        i = j
    return out


def _same(a: list[Segment], b: list[Segment]) -> None:
    assert a == b
    assert all(x is y for x, y in zip(a, b, strict=True) if x.kind == "kernel")


@pytest.mark.parametrize("profile", ["adreno650", "mali-g76"])
def test_phone_segments_equal_the_reference_on_a_real_recording(gemma_10tok_segments, profile):
    p = load_profile(profile)
    segs = list(gemma_10tok_segments)
    got = phone_segments(segs, p)
    _same(got, _phone_segments_reference(segs, p))
    assert sum(s.stall is StallKind.INTER_KERNEL for s in got) >= 10


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_phone_segments_equal_the_reference_on_synthetic_traces(seed, timing):
    p = load_profile("adreno650")
    segs = make_trace(seed=seed, kernel_timing=timing, requests=2, decode_tokens=4)
    _same(phone_segments(segs, p), _phone_segments_reference(segs, p))
