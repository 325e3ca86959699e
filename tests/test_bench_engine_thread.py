"""bench.engine_thread: issue 14's per-token accounting of the engine thread runs end
to end on the tiny model and its figures hang together (no timing is asserted)."""

from __future__ import annotations

import json

from turboinfer_llama.bench import engine_thread
from turboinfer_llama.session import PowerSession


def test_engine_thread_bench_splits_each_requests_calls_by_stage(tiny_gguf, tmp_path, capsys):
    before = {name: PowerSession.__dict__[name] for name in engine_thread.CALLS}
    out = tmp_path / "engine.json"
    rc = engine_thread.main(
        [
            "--model", str(tiny_gguf), "--rounds", "1", "--tokens", "8",
            "--requests", "2", "--max-tokens", "8", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    # the wrappers are gone again: PowerSession is as it was
    assert {name: PowerSession.__dict__[name] for name in engine_thread.CALLS} == before
    doc = json.loads(out.read_text())
    per_token = doc["per_token"]
    assert set(per_token) == {"plain", "hooks only", "live loop"}
    for fig in per_token.values():
        assert fig["inside_decode_us"] > 0 and fig["between_decodes_us"] > 0
    for side in ("hooks only", "live loop"):  # paired with plain's rounds
        assert {"inside_decode_vs_plain_us", "between_decodes_vs_plain_us"} <= set(per_token[side])
        # our callback timed itself in C, inside the same llama_decode calls that were
        # timed around it: a share of their time (the per-decode mean, which has the
        # prompt's long decode in it, is not compared with the later decodes' median)
        assert per_token[side]["eval_callback_us"] > 0
        assert 0 < per_token[side]["eval_callback_share_of_decode"] < 1
        # the later decode graphs llama.cpp reused were told by their nodes' addresses
        assert per_token[side]["compact_asks"]["by_address"] > 0
    assert "eval_callback_us" not in per_token["plain"]
    rows = {r["call"]: r for r in doc["per_request"]["rows"]}
    # per 8-token request: one prompt graph (it yields the first token), then a decode
    # per sampled token, the last one's too (llama-cpp-python evaluates each token it
    # yields before it checks max_tokens): the first decode and seven later ones
    ends = rows["on_decode_end"]
    assert ends["prompt calls per request"] == 1
    assert ends["first decode calls per request"] == 1
    assert ends["later decodes calls per request"] == 7
    assert rows["on_request_begin"]["prompt calls per request"] == 1
    assert rows["on_request_end"]["later decodes calls per request"] == 1
    # each decode's DECODE_BEGIN and DECODE_END go through emit inside another call
    assert rows["emit (inside another)"]["later decodes calls per request"] >= 2 * 7
    top = sum(r["us per request"] for r in rows.values() if r["top_level"])
    assert abs(doc["per_request"]["us_per_request"] - top) < 1e-6
    assert top > 0
    printed = capsys.readouterr().out
    assert "between decodes" in printed and "us per request" in printed
