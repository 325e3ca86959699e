"""tmpc steers a phone's KGSL over adb while gemma decodes on the host: counted from the
fake adb server's command log (device-side evidence), never from the executor's own
log. The adb backend is token-level (its round trip is milliseconds): switches are
issued off the engine thread, so a slow adb never stalls decoding (issue 11).

gemma runs on this host's CPU, whose graph time does not follow the phone's clock (tmpc
then rightly settles at the bottom level: 36-49 pwrlevel writes per 48 tokens before the
stand-in), so the test stand-in ``clock_standin`` stretches each graph to the time it
would take at the level the executor applied (compute-bound: host time x f_top / f)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from fakeadb import oneplus8, serving
from test_live_loop import phone_sampling_stall

from turboinfer_llama import Llama

PROMPTS = ("The capital of France is", "Write a haiku about rain.")


@pytest.mark.slow
@pytest.mark.model
def test_tmpc_steers_kgsl_over_adb_while_gemma_decodes(tmp_path, monkeypatch, gemma_gguf):
    phone = oneplus8(tmp_path / "phone")
    kgsl = phone.root / "sys/class/kgsl/kgsl-3d0"
    before = {f: (kgsl / f).read_text() for f in ("min_pwrlevel", "max_pwrlevel")}
    with serving(monkeypatch, tmp_path / "state", phone):
        llm = Llama(
            model_path=str(gemma_gguf),
            verbose=False,
            n_ctx=512,
            power={
                "device": f"adb:{phone.serial}",
                "controller": "tmpc",
                "granularity": "graph",
                "clock_standin": True,  # graph time follows the phone's clock
            },
        )
        try:
            start = len(phone.commands_run)
            for p in PROMPTS:
                llm(p, max_tokens=24, temperature=0.0, logits_processor=phone_sampling_stall())
            stats = llm.power.stats()
            with phone.lock:
                cmds = list(phone.commands_run[start:])
        finally:
            llm.close()
    tokens = stats["tokens"]
    energy = stats["energy"]
    assert energy["health"]["ok"], energy["health"]
    assert energy["clock_standin"]["graphs"] >= tokens, energy["clock_standin"]
    # every pwrlevel write the phone's shell ran (the log keeps the command without its
    # redirection: ``echo N``); a switch pins min and max, so a level shows up twice in
    # a row: a switch is a run of equal values (the executor never re-writes the level
    # in effect)
    writes = [int(c.split()[1]) for c in cmds if re.fullmatch(r"echo \d+", c)]
    switches = [lv for i, lv in enumerate(writes) if i == 0 or writes[i - 1] != lv]
    assert len(switches) >= tokens, (len(switches), tokens, Counter(switches), cmds[-5:])
    assert len(set(switches)) >= 3, Counter(switches)
    assert {f: (kgsl / f).read_text() for f in before} == before  # handed back
