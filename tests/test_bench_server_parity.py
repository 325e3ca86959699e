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
