"""bench.server_parity: the rounds are split over fresh server pairs whose start order
alternates, so a bias against the server started second falls on both sides."""

from __future__ import annotations

import pytest

from turboinfer_llama.bench import server_parity


@pytest.mark.parametrize(("rounds", "restarts"), [(10, 1), (10, 2), (12, 4), (7, 3), (5, 5)])
def test_restart_blocks_cover_every_round_once_and_alternate_the_start(rounds, restarts):
    blocks = server_parity.restart_blocks(rounds, restarts)
    assert len(blocks) == restarts
    covered = [r for r0, r1, _ in blocks for r in range(r0, r1)]
    assert covered == list(range(rounds))
    assert all(r1 > r0 for r0, r1, _ in blocks)  # no pair without a round
    assert max(r1 - r0 for r0, r1, _ in blocks) - min(r1 - r0 for r0, r1, _ in blocks) <= 1
    firsts = [first for _, _, first in blocks]
    assert firsts == ["theirs", "ours"] * (restarts // 2) + ["theirs"] * (restarts % 2)


def test_restarts_out_of_range_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        server_parity.main(["--rounds", "4", "--restarts", "5"])
    assert e.value.code == 2
    assert "--restarts must be between 1 and --rounds" in capsys.readouterr().err


def test_a_round_runs_each_request_on_both_servers_back_to_back_abba(monkeypatch):
    calls: list[tuple[str, str]] = []
    speed = {"ours": 1.0, "theirs": 1.25}  # theirs takes 1.25x as long: ratios known

    def completion(side, i, max_tokens):
        calls.append(("lat", side.name))
        return 100.0 * speed[side.name]

    def stream(http, i, max_tokens):
        calls.append(("st", http))
        return server_parity.Stream(chunks=9, ttft_ms=20.0 * speed[http], decode_s=speed[http])

    def wait_settled(side, timeout_s=1800):
        calls.append(("settle", side.name))
        return 0.01

    monkeypatch.setattr(server_parity, "completion", completion)
    monkeypatch.setattr(server_parity, "stream", stream)
    monkeypatch.setattr(server_parity, "wait_settled", wait_settled)
    sides = {n: server_parity.Side(n, None, n) for n in ("ours", "theirs")}  # type: ignore[arg-type]
    args = server_parity.argparse.Namespace(requests=2, max_tokens=8, stream_tokens=8)
    pairs, settle = server_parity.Pairs(), []
    server_parity.run_round(sides, args, 0, pairs, settle)
    runs = [name for kind, name in calls if kind != "settle"]
    # four pairs (two latency, two streams), first server ABBA: o t, t o, t o, o t
    assert runs == ["ours", "theirs", "theirs", "ours", "theirs", "ours", "ours", "theirs"]
    # our accounting settles right after each of our requests, and only then
    after_ours = [
        calls[k + 1]
        for k, (kind, name) in enumerate(calls[:-1])
        if name == "ours" and kind != "settle"
    ]
    assert after_ours == [("settle", "ours")] * 4
    assert pairs.lat == [1.25, 1.25] and pairs.ttft == [1.25, 1.25]
    assert pairs.tps == pytest.approx([1.25, 1.25])
    assert len(settle) == 4 and sides["ours"].tokens == 18  # 2 streams of 9 chunks
    assert sides["ours"].lat_ms == [100.0] and sides["theirs"].tps == [8 / 1.25]
