"""SIGTERM/SIGINT: the in-flight request ends cleanly and the GPU (a fake Jetson Orin
devfreq tree) gets its governor, min and max back; bad start-up input is one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
from fakesysfs import make_jetson_orin
from test_server_support import MODEL, ServerProcess

PIN_HZ = 714000000  # a middle level: pinning it changes both min_freq and max_freq
WORDS_ONLY = {str(i): 50.0 for i in range(259, 268)}
FILES = ("governor", "min_freq", "max_freq")


def _read(node) -> dict[str, str]:
    return {f: (node / f).read_text().strip() for f in FILES}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_request_and_restores_gpu(tiny_gguf, tmp_path, sig):
    node = make_jetson_orin(tmp_path)["devfreq"]
    before = _read(node)
    srv = ServerProcess(
        tiny_gguf,
        "--n-ctx",
        "2048",
        "--device",
        f"devfreq:{node}",
        "--controller",
        f"static:{PIN_HZ}",
        "--allow-cpu",  # this machine's llama.cpp is a CPU build: the layers stay there
    )
    try:
        doc = srv.power()
        assert doc["simulated"] is False
        assert "17000000.ga10b" in doc["device"]["name"]
        assert doc["controller"]["name"] == f"static:{PIN_HZ}"

        result: dict = {}

        def long_request() -> None:
            try:
                result["out"] = srv.client().completions.create(
                    model=MODEL, prompt="the", max_tokens=1500, logit_bias=WORDS_ONLY
                )
            except Exception as e:  # reported by the assertions below
                result["error"] = e

        t = threading.Thread(target=long_request)
        t.start()
        srv.wait_for(
            lambda d: any(
                r["status"] == "running" and r["tokens_generated"] > 0
                for r in d["requests"]["recent"]
            )
        )
        during = _read(node)
        assert during["min_freq"] == during["max_freq"] == str(PIN_HZ)
        srv.proc.send_signal(sig)
        t.join(120)
        code = srv.stop(sig)
    finally:
        if srv.proc.poll() is None:
            srv.stop(signal.SIGKILL)

    assert "error" not in result, result.get("error")
    assert result["out"].usage.completion_tokens == 1500
    assert code in (0, -sig, 128 + sig, 130), srv.output
    assert "restoring the GPU" in srv.output
    assert _read(node) == before
    assert before["min_freq"] != str(PIN_HZ) or before["max_freq"] != str(PIN_HZ)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turboinfer_llama.server", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_model_is_one_line_error(tmp_path):
    r = _serve("--model", str(tmp_path / "nope.gguf"))
    assert r.returncode == 2
    assert "model file not found" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [("--device", "gpu9", "unknown device"), ("--controller", "turbo", "unknown controller")],
)
def test_bad_power_setting_is_one_line_error(tiny_gguf, flag, value, words):
    r = _serve("--model", str(tiny_gguf), flag, value)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr
