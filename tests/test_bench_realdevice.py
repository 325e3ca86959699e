"""The benchmark on real hardware: controllers drive the device live, a meter measures.

The hardware is a fake Jetson Orin devfreq tree and a fake RAPL counter under a tmp
dir; the code path is the one a phone or a Jetson takes.
"""

from __future__ import annotations

import threading

import pytest
from fakesysfs import make_jetson_orin, make_rapl, write

from turboinfer_llama._clock import now_ns
from turboinfer_llama.bench.runner import BenchConfig, run_bench
from turboinfer_llama.devices import open_device
from turboinfer_llama.devices.sysfs_io import LocalSysfs
from turboinfer_llama.power.rapl import RaplMeter


def _files(devfreq):
    return {k: (devfreq / k).read_text().strip() for k in ("governor", "min_freq", "max_freq")}


class _DrawingRapl(LocalSysfs):
    """The fake RAPL counter advances by 2 W times the time since the last read.

    A counter that moves with the clock, not with a ticker thread: a thread starved of
    the core on a loaded machine left a window with no tick and a row of 0 J.
    """

    POWER_W = 2.0

    def __init__(self, root, counter):
        super().__init__(root)
        self._counter = counter
        self._lock = threading.Lock()
        self._t_ns = now_ns()

    def read(self, path):
        if path.endswith("/energy_uj"):
            with self._lock:
                t_ns = now_ns()
                uj = int(self._counter.read_text()) + int(self.POWER_W * (t_ns - self._t_ns) / 1e3)
                self._t_ns = t_ns
                write(self._counter, uj)
        return super().read(path)


def test_live_controllers_on_fake_devfreq_with_rapl(tmp_path, tiny_gguf):
    tree = make_jetson_orin(tmp_path)
    rapl = make_rapl(tmp_path)
    before = _files(tree["devfreq"])
    device = open_device("devfreq", root=str(tmp_path))
    meter = RaplMeter(_DrawingRapl(tmp_path, rapl["energy_uj"]))
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
        device.close()
    report = out.report
    assert report["simulated"] is False
    assert report["energy_source"].startswith("measured")
    assert set(report["controllers"]) == {"default", "tmpc"}  # the oracle is offline only
    for row in report["controllers"].values():
        assert row["simulated"] is False
        assert row["energy_per_token_j"] > 0 and row["tpot_ms"] > 0
        # each measured request's own figures, from the run's events
        (req,) = row["per_request"]
        assert req["tokens"] == row["tokens"]
        assert req["ttft_ms"] == pytest.approx(row["ttft_ms"])
        assert req["tpot_ms"] == pytest.approx(row["tpot_ms"])
    assert _files(tree["devfreq"]) == before
