"""The benchmark on real hardware: controllers drive the device live, a meter measures.

The hardware is a fake Jetson Orin devfreq tree and a fake RAPL counter under a tmp
dir; the code path is the one a phone or a Jetson takes.
"""

from __future__ import annotations

import os
import threading

from fakesysfs import make_jetson_orin, make_rapl, write

from turboinfer_llama.bench.runner import BenchConfig, run_bench
from turboinfer_llama.devices import open_device
from turboinfer_llama.power import open_meter


def _files(devfreq):
    return {k: (devfreq / k).read_text().strip() for k in ("governor", "min_freq", "max_freq")}


def test_live_controllers_on_fake_devfreq_with_rapl(tmp_path, tiny_gguf):
    tree = make_jetson_orin(tmp_path)
    rapl = make_rapl(tmp_path)
    before = _files(tree["devfreq"])
    device = open_device("devfreq", root=str(tmp_path))
    meter = open_meter("rapl", root=str(tmp_path))
    counter = rapl["energy_uj"]
    stop = threading.Event()

    def tick():  # the package draws about 2 W while the benchmark runs
        uj = int(counter.read_text())
        while not stop.wait(0.001):
            uj += 2_000
            tmp = counter.with_suffix(".tmp")
            write(tmp, uj)
            os.replace(tmp, counter)  # atomic: the meter never reads a half-written file

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        cfg = BenchConfig(
            model=str(tiny_gguf),
            prompts=["hello the world"],
            max_tokens=32,
            n_ctx=256,
            controllers=["default", "tmpc", "oracle"],
            live_rounds=0,
            allow_cpu=True,  # this machine's llama.cpp is a CPU build
        )
        out = run_bench(cfg, device=device, meter=meter)
    finally:
        stop.set()
        ticker.join()
        device.close()
    report = out.report
    assert report["simulated"] is False
    assert report["energy_source"].startswith("measured")
    assert set(report["controllers"]) == {"default", "tmpc"}  # the oracle is offline only
    for row in report["controllers"].values():
        assert row["simulated"] is False
        assert row["energy_per_token_j"] > 0 and row["tpot_ms"] > 0
    assert _files(tree["devfreq"]) == before
