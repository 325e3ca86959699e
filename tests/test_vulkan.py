"""Every layer on a Vulkan device: drop-in output, hook semantics and offload policy.

Runs under .venv-vulkan (``make test``, or ``make test-vulkan`` alone), where llama.cpp
is built with ``-DGGML_VULKAN=ON`` and ``GGML_VK_VISIBLE_DEVICES=0`` shows Mesa's
lavapipe, a CPU Vulkan driver. Elsewhere the conftest skips these, saying why. Timings
on lavapipe mean nothing for a phone, so nothing here looks at time except ordering.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakesysfs import make_exynos_mali, make_jetson_orin
from test_exec_sysfs import Watcher, strip_newline
from test_hooks_decode import Run, generate, node_key, observe
from tiny_gguf import N_LAYER

from turboinfer_llama import Llama
from turboinfer_llama.engine import backends
from turboinfer_llama.engine.events import EventKind
from turboinfer_llama.offload import CpuInferenceError

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.vulkan

PROMPT = "hello world, the"
GREEDY = {"max_tokens": 12, "temperature": 0.0, "seed": 1}


def _vulkan_device() -> backends.BackendDevice:
    return next(d for d in backends.devices() if d.backend == "Vulkan")


@pytest.fixture(scope="module")
def vk_model(tiny_gguf: Path) -> Iterator[ctypes.c_void_p]:
    """The tiny GGUF with every layer on the Vulkan device (low-level API)."""
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 999
    m = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    assert m, "tiny GGUF did not load with Vulkan offload"
    yield m
    llama_cpp.llama_model_free(m)


@pytest.fixture(scope="module")
def vk_plain(vk_model: ctypes.c_void_p) -> Run:
    return generate(vk_model, None)


def test_all_layers_on_the_vulkan_device(vk_model: ctypes.c_void_p) -> None:
    assert backends.supports_gpu_offload()
    dev = _vulkan_device()
    assert dev.type in ("gpu", "igpu")
    p = backends.model_placement(vk_model)
    assert p.layers_on_gpu == p.n_layer == N_LAYER
    assert p.gpu_devices == [dev.name]
    # The Vulkan device computes (nearly) every node: only inputs stay on the CPU.
    assert p.nodes_by_device.get(dev.name, 0) > p.nodes_by_device.get("CPU", 0)


@pytest.mark.parametrize("granularity", ["graph", "layer", "kernel"])
@pytest.mark.parametrize("native", [True, False])
def test_hook_keeps_greedy_tokens(
    vk_model: ctypes.c_void_p, vk_plain: Run, granularity: str, native: bool
) -> None:
    run = observe(vk_model, granularity, native)
    assert run.tokens == vk_plain.tokens
    assert all(events for *_, events in run.steps)


def test_node_order_and_ops_per_graph(vk_model: ctypes.c_void_p) -> None:
    """graph granularity sees the same nodes, in the same order, as kernel granularity
    (which computes and syncs node by node); layer syncs only at l_out-<i>."""
    graph = observe(vk_model, "graph", True)
    kernel = observe(vk_model, "kernel", True)
    layer = observe(vk_model, "layer", True)
    for (_, _, _, g), (_, _, _, k), (_, _, _, lay) in zip(
        graph.steps, kernel.steps, layer.steps, strict=True
    ):
        g_asks = [(e.node, e.op, e.name) for e in g]
        k_asks = [(e.node, e.op, e.name) for e in k if e.kind is EventKind.NODE_ASK]
        assert g_asks == k_asks
        assert all(e.kind is EventKind.NODE_ASK for e in g)
        k_done = [e for e in k if e.kind is EventKind.NODE_DONE]
        assert len(k_done) == len(k_asks)
        l_done = [e.name for e in lay if e.kind is EventKind.NODE_DONE]
        assert l_done == [f"l_out-{i}" for i in range(N_LAYER)]
    ops = Counter(e.op for e in graph.steps[1][3])
    assert ops["MUL_MAT"] >= 7 * N_LAYER  # q, k, v, o, gate, up, down per layer


def test_native_and_python_hooks_agree_on_vulkan(vk_model: ctypes.c_void_p) -> None:
    native = observe(vk_model, "kernel", True)
    oracle = observe(vk_model, "kernel", False)
    assert native.tokens == oracle.tokens
    for (_, _, _, got), (_, _, _, want) in zip(native.steps, oracle.steps, strict=True):
        assert [node_key(e) for e in got] == [node_key(e) for e in want]


def test_kernel_granularity_completes_each_node_before_the_next_starts(
    vk_model: ctypes.c_void_p,
) -> None:
    """An observed node makes the scheduler submit up to it and synchronise before the
    done call; so on a GPU backend each done lies between its ask and the next ask."""
    run = observe(vk_model, "kernel", True)
    for *_, events in run.steps[1:]:
        stamps = [e.t_ns for e in events]
        assert stamps == sorted(stamps)
        kinds = [e.kind for e in events]
        assert kinds == [EventKind.NODE_ASK, EventKind.NODE_DONE] * (len(events) // 2)


@pytest.mark.parametrize("granularity", ["graph", "layer", "kernel"])
def test_dropin_greedy_identical_with_all_layers_offloaded(
    tiny_gguf: Path, granularity: str
) -> None:
    plain = llama_cpp.Llama(
        model_path=str(tiny_gguf), n_ctx=256, n_gpu_layers=-1, verbose=False, seed=1
    )
    with contextlib.closing(plain):
        want = plain.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
    with Llama(
        model_path=str(tiny_gguf),
        n_ctx=256,
        n_gpu_layers=-1,
        verbose=False,
        seed=1,
        power={"granularity": granularity},
    ) as ours:
        got = ours.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]
        assert ours.power is not None
        stats = ours.power.stats()
    assert got == want and want
    assert stats["offload"]["gpu_share"] == 1.0
    assert stats["offload"]["gpu_devices"] == [_vulkan_device().name]


@pytest.mark.model
def test_gemma_greedy_identical_on_vulkan(gemma_gguf: Path) -> None:
    kw = {"n_ctx": 256, "n_gpu_layers": -1, "verbose": False, "seed": 1}
    few = {**GREEDY, "max_tokens": 6}
    plain = llama_cpp.Llama(model_path=str(gemma_gguf), **kw)
    with contextlib.closing(plain):
        want = plain.create_completion(PROMPT, **few)["choices"][0]["text"]
    with Llama(model_path=str(gemma_gguf), power={"granularity": "graph"}, **kw) as ours:
        got = ours.create_completion(PROMPT, **few)["choices"][0]["text"]
        assert ours.power is not None
        off = ours.power.stats()["offload"]
    assert got == want and want
    assert off["layers_on_gpu"] == off["n_layer"] == 18


def _devfreq_files(node: Path) -> dict[str, str]:
    return {k: (node / k).read_text().strip() for k in ("governor", "min_freq", "max_freq")}


@pytest.mark.slow
@pytest.mark.model
def test_live_executor_switches_while_gemma_decodes_on_vulkan(
    tmp_path: Path, gemma_gguf: Path
) -> None:
    """Issue 17: tmpc live at graph granularity while gemma decodes with every layer on
    lavapipe, steering a fake Mali devfreq tree through the native executor. Evidence
    from the device side only: inotify counts the writes to min_freq/max_freq.

    gemma, not the tiny model: the tiny model's graph is launch-bound on lavapipe (the
    fitted graph time is the same at every level), so tmpc rightly pins the floor and
    switches about never. The fake tree has no busy counter (its ``utilization`` is
    removed): a constant file says nothing about lavapipe's load, and fed to tmpc it
    makes graph time look independent of the clock, so tmpc would pin the floor too
    (the documented fallback is engine timing alone, asserted below)."""
    tree = make_exynos_mali(tmp_path)
    node = tree["devfreq"]
    tree["utilization"].unlink()
    strip_newline(node / "min_freq", node / "max_freq")
    before = _devfreq_files(node)
    watch = Watcher([node / "min_freq", node / "max_freq"])
    llm = Llama(
        model_path=str(gemma_gguf),
        verbose=False,
        n_ctx=256,
        n_gpu_layers=-1,
        power={"device": f"devfreq:{node}", "controller": "tmpc", "granularity": "graph"},
    )
    try:
        assert llm.power is not None
        llm("Tell me a story about a cat.", max_tokens=10, temperature=0.0)
        stats = llm.power.stats()
    finally:
        llm.close()
    events = watch.close()
    off, energy, tokens = stats["offload"], stats["energy"], stats["tokens"]
    assert off["layers_on_gpu"] == off["n_layer"] and off["gpu_share"] == 1.0
    assert off["gpu_devices"] == [_vulkan_device().name]
    assert energy["health"]["ok"], energy["health"]
    assert energy["feedback"] == "engine-only"
    assert energy["executor"]["native"] is True  # switches came from inside llama_decode
    # the planner was woken by the eval callback, from inside the Vulkan decodes
    wake = energy["planner_wake"]
    assert wake["by"] == "eval callback" and wake["posted"] > 0 and wake["failed"] == 0
    mins = [vals["min_freq"] for name, vals in events if name == "min_freq"]
    # inotify coalesces back-to-back writes: the count is a lower bound
    assert tokens > 0 and len(mins) >= tokens, (len(mins), tokens)
    assert len(set(mins)) >= 3, sorted(set(mins))
    for _, vals in events:  # the range never inverted, seen from the files
        lo, hi = vals["min_freq"], vals["max_freq"]
        assert lo is None or hi is None or lo <= hi
    assert _devfreq_files(node) == before  # governor, min and max given back


def test_real_gpu_default_offloads_everything(tiny_gguf: Path, tmp_path: Path) -> None:
    node = make_jetson_orin(tmp_path)["devfreq"]
    power = {"device": f"devfreq:{node}", "controller": "max"}
    with Llama(model_path=str(tiny_gguf), n_ctx=128, verbose=False, power=power) as llm:
        assert llm.power is not None
        off = llm.power.stats()["offload"]
    assert off["n_gpu_layers"] == -1 and off["gpu_share"] == 1.0 and off["warning"] is None
    # llama.cpp counts the output layer: n_gpu_layers=N_LAYER puts the last
    # N_LAYER - 1 repeating layers (here one) on the GPU, the output stays on the CPU.
    with Llama(
        model_path=str(tiny_gguf), n_ctx=128, verbose=False, n_gpu_layers=N_LAYER, power=power
    ) as llm:
        assert llm.power is not None
        off = llm.power.stats()["offload"]
    assert off["layers_on_gpu"] == N_LAYER - 1
    assert off["gpu_share"] == pytest.approx((N_LAYER - 1) / N_LAYER)
    # Only the output layer offloaded: no repeating layer on the GPU is the CPU case.
    with pytest.raises(CpuInferenceError, match="none of the 2 layers on a GPU device"):
        Llama(model_path=str(tiny_gguf), n_ctx=128, verbose=False, n_gpu_layers=1, power=power)
    with pytest.raises(CpuInferenceError, match="n_gpu_layers=0 keeps every layer"):
        Llama(model_path=str(tiny_gguf), n_ctx=128, verbose=False, n_gpu_layers=0, power=power)


def test_probe_lists_the_vulkan_device(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import json

    from turboinfer_llama.cli import main

    make_jetson_orin(tmp_path)
    assert main(["probe", "--root", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    vk = [d for d in report["llama_cpp"]["devices"] if d["backend"] == "Vulkan"]
    assert vk and "llvmpipe" in vk[0]["description"]
    assert report["llama_cpp"]["gpu_offload"] is True
    # lavapipe is not the Jetson's GPU: the probe must not claim it is.
    assert report["compute_matches_steered"]["match"] is False


_ORDER_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import llama_cpp
from test_hooks_decode import observe
llama_cpp.llama_backend_init()
out = {{}}
for ngl in (0, 999):
    p = llama_cpp.llama_model_default_params()
    p.n_gpu_layers = ngl
    m = llama_cpp.llama_model_load_from_file({model!r}.encode(), p)
    out[ngl] = [e.op + " " + e.name for e in observe(m, "graph", True).steps[1][3]]
    llama_cpp.llama_model_free(m)
print("ORDER", json.dumps([out[0], out[999]]))
"""


@pytest.mark.parametrize("optimize", [True, False])
def test_vulkan_reorders_nodes_unless_graph_optimize_is_off(
    tiny_gguf: Path, optimize: bool
) -> None:
    """The hook sees nodes in the backend's execution order. ggml-vulkan's graph_optimize
    regroups a split (Q, K and V matmuls side by side, so they run without barriers in
    between): the same nodes as on the CPU, in another order. With
    GGML_VK_DISABLE_GRAPH_OPTIMIZE=1 the order is the CPU's."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("GGML_VK_DISABLE_GRAPH_OPTIMIZE", None)
    if not optimize:
        env["GGML_VK_DISABLE_GRAPH_OPTIMIZE"] = "1"
    tests = str(Path(__file__).resolve().parent)
    code = _ORDER_SCRIPT.format(tests=tests, model=str(tiny_gguf))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ORDER "))
    cpu, vk = json.loads(line[len("ORDER ") :])
    assert sorted(cpu) == sorted(vk) and len(cpu) > 0
    if optimize:
        assert cpu != vk
        q = vk.index("MUL_MAT Qcur-0")
        assert vk[q : q + 3] == ["MUL_MAT Qcur-0", "MUL_MAT Vcur-0", "MUL_MAT Kcur-0"]
    else:
        assert cpu == vk
