"""Offload policy on a real local GPU, with this machine's llama.cpp (a CPU build here;
under .venv-vulkan the same tests see a GPU backend and take the other branch).

The GPU is a fake Jetson devfreq tree; what is checked is the policy: every layer by
default, one clear error while the model stays on the CPU, a warning with allow_cpu,
the GPU given back as found, and what ``stats()["offload"]`` says.
"""

from __future__ import annotations

import pytest
from fakesysfs import make_jetson_orin

from turboinfer_llama import Llama
from turboinfer_llama import offload as offload_mod
from turboinfer_llama.bench.runner import BenchConfig, BenchError, run_bench
from turboinfer_llama.devices import open_device
from turboinfer_llama.engine import backends
from turboinfer_llama.server.metering import RequestLedger, served_llama_class
from turboinfer_llama.settings import PowerSettings

CPU_BUILD = not backends.supports_gpu_offload()
cpu_only = pytest.mark.skipif(not CPU_BUILD, reason="llama.cpp here has a GPU backend")
FILES = ("governor", "min_freq", "max_freq")


def _state(node):
    return {f: (node / f).read_text().strip() for f in FILES}


@pytest.fixture
def devfreq(tmp_path):
    return make_jetson_orin(tmp_path)["devfreq"]


def _power(node, **kw):
    return {"device": f"devfreq:{node}", "controller": "max", **kw}


def test_registry_lists_the_cpu_device():
    devs = backends.devices()
    assert any(d.type == "cpu" and d.backend == "CPU" for d in devs)
    assert {"name": "CPU", "devices": 1} in backends.backends()
    assert all(d.memory_total_bytes >= d.memory_free_bytes >= 0 for d in devs)


def test_adb_and_sim_are_not_local_gpus(devfreq):
    sim = open_device("sim:adreno650")
    real = open_device(f"devfreq:{devfreq}")
    try:
        assert not offload_mod.steers_local_gpu(sim)
        assert offload_mod.steers_local_gpu(real)
        # An adb device is real hardware too, but its inference runs on the phone.
        adb_cls = type(
            "AdbGpu",
            (),
            {"__module__": "turboinfer_llama.devices.adb", "capabilities": real.capabilities},
        )
        adb_like = adb_cls()
        assert offload_mod.backend_name(adb_like) == "adb"  # type: ignore[arg-type]
        assert not offload_mod.steers_local_gpu(adb_like)  # type: ignore[arg-type]
        kw: dict = {}
        offload_mod.default_gpu_layers(kw, real)
        assert kw == {"n_gpu_layers": -1}
        kw = {"n_gpu_layers": 3}
        offload_mod.default_gpu_layers(kw, real)
        assert kw == {"n_gpu_layers": 3}
        kw = {}
        offload_mod.default_gpu_layers(kw, sim)
        assert kw == {}
    finally:
        sim.close()
        real.close()


@cpu_only
def test_cpu_build_on_a_real_gpu_is_one_clear_error(tiny_gguf, devfreq):
    before = _state(devfreq)
    with pytest.raises(offload_mod.CpuInferenceError) as err:
        Llama(model_path=str(tiny_gguf), n_ctx=128, verbose=False, power=_power(devfreq))
    msg = str(err.value)
    assert "no GPU backend" in msg and "pointless while the model runs on the CPU" in msg
    assert "-DGGML_VULKAN=ON" in msg and "-DGGML_OPENCL=ON" in msg
    assert "TURBOINFER_ALLOW_CPU" in msg and "17000000.ga10b" in msg
    assert _state(devfreq) == before  # "max" pinned the clock; it was given back


@cpu_only
def test_allow_cpu_turns_it_into_a_warning(tiny_gguf, devfreq, caplog):
    before = _state(devfreq)
    with Llama(
        model_path=str(tiny_gguf),
        n_ctx=128,
        verbose=False,
        power=_power(devfreq, allow_cpu=True),
    ) as llm:
        assert llm.model_params.n_gpu_layers == 0x7FFFFFFF  # defaulted to -1: all layers
        text = llm.create_completion("hello", max_tokens=4, temperature=0.0)
        assert text["choices"][0]["text"] is not None
        assert llm.power is not None
        off = llm.power.stats()["offload"]
    assert off["n_gpu_layers"] == -1 and off["gpu_backend"] is False
    assert off["gpu_share"] == 0.0 and "pointless" in off["warning"]
    assert any("allow_cpu is set" in r.getMessage() for r in caplog.records)
    assert _state(devfreq) == before


def test_explicit_zero_is_the_cpu_case(tiny_gguf, devfreq):
    with pytest.raises(offload_mod.CpuInferenceError, match=r"n_gpu_layers=0|no GPU backend"):
        Llama(
            model_path=str(tiny_gguf),
            n_ctx=128,
            verbose=False,
            n_gpu_layers=0,
            power=_power(devfreq),
        )


def test_env_allow_cpu_is_read(monkeypatch):
    monkeypatch.setenv("TURBOINFER_ALLOW_CPU", "1")
    assert PowerSettings().allow_cpu is True


def test_simulated_default_keeps_the_cpu_and_reports_it(tiny_gguf):
    with Llama(model_path=str(tiny_gguf), n_ctx=128, verbose=False) as llm:
        assert llm.model_params.n_gpu_layers == 0
        assert llm.power is not None
        off = llm.power.stats()["offload"]
    assert off["n_gpu_layers"] == 0 and off["gpu_share"] == 0.0 and off["warning"] is None


@cpu_only
def test_server_loader_default_is_dropped_unless_the_user_set_it(tiny_gguf, devfreq):
    """llama-cpp-python's loader always passes n_gpu_layers (0 by default); the served
    class drops it when the user gave none, so Llama's own default (all layers) holds."""
    settings = PowerSettings(device=f"devfreq:{devfreq}", controller="max", allow_cpu=True)
    for user_set, want in ((False, 0x7FFFFFFF), (True, 0)):
        cls = served_llama_class(True, settings, RequestLedger(), gpu_layers_set=user_set)
        llm = cls(model_path=str(tiny_gguf), n_ctx=128, verbose=False, n_gpu_layers=0)
        try:
            assert llm.model_params.n_gpu_layers == want
        finally:
            llm.close()


@cpu_only
def test_bench_on_real_gpu_refuses_cpu_inference(tiny_gguf, devfreq, tmp_path):
    from fakesysfs import make_rapl

    from turboinfer_llama.power import open_meter

    make_rapl(tmp_path)
    device = open_device(f"devfreq:{devfreq}")
    meter = open_meter("rapl", root=str(tmp_path))
    try:
        cfg = BenchConfig(
            model=str(tiny_gguf), prompts=["hi"], max_tokens=2, n_ctx=128, live_rounds=0
        )
        with pytest.raises(BenchError, match="pointless while the model runs on the CPU"):
            run_bench(cfg, device=device, meter=meter)
    finally:
        device.close()
