"""Faults under the real engine: ``turboinfer_llama.Llama`` with the tiny model steering
a fake devfreq tree with ztt (it switches the clock every token), in process
(``stats()``) and behind the server (``/v1/power``)."""

from __future__ import annotations

import os
from pathlib import Path

from fakesysfs import make_jetson_orin, write

from turboinfer_llama import Llama

TOKENS = 24


def devfreq_range(node: Path) -> tuple[str, ...]:
    return tuple((node / f).read_text().strip() for f in ("governor", "min_freq", "max_freq"))


def _llama(model: Path, node: Path) -> Llama:
    return Llama(
        model_path=str(model),
        n_ctx=256,
        verbose=False,
        seed=1,
        power={"device": f"devfreq:{node}", "controller": "ztt", "allow_cpu": True},
    )


def _generate(llm: Llama, inject, at: int) -> int:
    """Generate TOKENS tokens (EOS banned); ``inject`` runs on the engine thread after
    token ``at`` (the session's per-token call). Returns the tokens generated."""
    session = llm.power
    on_token = session.on_token
    seen = [0]

    def spy(index: int) -> None:
        on_token(index)
        seen[0] += 1
        if seen[0] == at:
            inject()

    session.on_token = spy  # type: ignore[method-assign]
    before = llm.power.stats()["tokens"]
    out = llm.create_completion(
        "hello world",
        max_tokens=TOKENS,
        temperature=0.0,
        logit_bias={llm.token_eos(): -100.0},
    )
    assert out["choices"][0]["finish_reason"] == "length"
    assert seen[0] > at  # tokens came after the fault
    return int(llm.power.stats()["tokens"] - before)


def test_gpu_vanishes_mid_generation(tiny_gguf, tmp_path, fault) -> None:
    fault.backend, fault.fault = "devfreq+Llama", "device vanishes mid-generation"
    node = make_jetson_orin(tmp_path)["devfreq"]
    initial = devfreq_range(node)
    gone = node.with_name(node.name + ".unbound")
    llm = _llama(tiny_gguf, node)
    try:

        def inject() -> None:
            fault.inject()
            node.rename(gone)

        try:
            assert _generate(llm, inject, at=6) == TOKENS  # generation went on
            health = llm.power.stats()["energy"]["health"]
            assert health["ok"] is False and "DeviceNotFound" in health["error"]
        finally:
            gone.rename(node)
    finally:
        llm.close()
    assert devfreq_range(node) == initial
    fault.outcome = "all tokens generated; error in stats(); restored on close"


def test_thermal_cap_lowered_mid_generation(tiny_gguf, tmp_path, fault) -> None:
    fault.backend, fault.fault = "devfreq+Llama", "thermal cap lowered mid-generation"
    node = make_jetson_orin(tmp_path)["devfreq"]
    initial = devfreq_range(node)
    llm = _llama(tiny_gguf, node)
    try:
        gov = llm.power.live.governor
        mark = [0]

        def inject() -> None:
            fault.inject()
            gov.health()  # the switches so far
            mark[0] = len(gov.applied_entries)
            write(node / "max_freq", 510000000)

        assert _generate(llm, inject, at=6) == TOKENS
        assert llm.power.stats()["energy"]["health"]["ok"] is True
        after = list(gov.applied_entries)[mark[0] :]
        # every switch after the cap was written (the executor's or the backend's)
        assert after and max(a.freq_hz for a in after[1:] or after) <= 510000000
        # and the files: pinned at or below the cap when generation ended
        assert int((node / "min_freq").read_text()) <= 510000000
        assert int((node / "max_freq").read_text()) <= 510000000
    finally:
        llm.close()
    assert devfreq_range(node) == initial
    fault.outcome = "all tokens generated; every clock at or below the cap"


def test_server_reports_a_vanished_gpu_in_v1_power(tiny_gguf, tmp_path, fault) -> None:
    from test_server_support import ServerProcess

    fault.backend, fault.fault = "devfreq+server", "device vanishes between requests"
    node = make_jetson_orin(tmp_path)["devfreq"]
    initial = devfreq_range(node)
    env = {
        **os.environ,
        "TURBOINFER_DEVICE": f"devfreq:{node}",
        "TURBOINFER_ALLOW_CPU": "1",
        "TURBOINFER_CONTROLLER": "ztt",
    }
    srv = ServerProcess(tiny_gguf, "--n-ctx", "256", env=env)
    gone = node.with_name(node.name + ".unbound")
    try:
        client = srv.client()
        client.completions.create(model="tiny", prompt="hello", max_tokens=4)
        assert srv.power()["controller"]["healthy"] is True
        fault.inject()
        node.rename(gone)
        r = client.completions.create(model="tiny", prompt="hello world", max_tokens=8)
        assert r.choices[0].text is not None  # served
        doc = srv.power()
        assert doc["controller"]["healthy"] is False
        assert "17000000.ga10b" in doc["controller"]["last_error"]
        assert "no such file" in doc["controller"]["last_error"]
        gone.rename(node)
    finally:
        srv.stop()  # SIGTERM: the restore guard puts the GPU back, then dies by it
    assert devfreq_range(node) == initial
    fault.outcome = "request served; error in /v1/power; restored at shutdown"
