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
