"""What the native plan executor costs, measured natively on this machine.

Prints, in ns:

* per switch from the engine-thread path (``ti_exec_on_node`` for an ask whose NODE
  switch is due: lock, plan walk, actuator, log record), RECORD actuator and a
  SYSFS_PAIR actuator on a fake devfreq tree in tmpfs (two ``pwrite`` per switch);
  the actuator call alone (the log's ``cost_ns``) beside it;
* per callback with nothing due (the executor's overhead on every node);
* the eval callback (``ti_hook_eval``, ask + done at ``kernel`` granularity) with an
  executor attached and without, interleaved rounds, per call.

Timing is done in C around each call (``ti_exec_bench_*``), so no Python overhead is
in the figures. A benchmark, not a test: ``python -m turboinfer_llama.bench.executor_cost``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from ..control.plan import Anchor, Plan, Switch
from ..engine import executor as ex_mod
from ..engine import hooks
from ..engine.ggml_mirror import GGML_TYPE_F32, _InitParams, load_ggml

LEVELS_HZ = [100_000_000, 200_000_000, 300_000_000, 400_000_000, 500_000_000]
PER_PLAN = 256


def _pct(a: np.ndarray) -> str:
    return (
        f"median {np.median(a):8.0f}  p99 {np.percentile(a, 99):8.0f}  "
        f"mean {a.mean():8.0f}  (n={len(a)})"
    )


def switch_cost(ex: ex_mod.NativeExecutor, n_switches: int) -> tuple[np.ndarray, np.ndarray]:
    """ns per engine-path call that applies a NODE switch; and the actuator's own cost."""
    plan = Plan(
        switches=tuple(Switch(Anchor.NODE, k, 1 + k % 2) for k in range(PER_PLAN)),
    )
    per_call: list[np.ndarray] = []
    actuator: list[np.ndarray] = []
    graph = 0
    while sum(len(c) for c in per_call) < n_switches:
        graph += 1
        ex.set_plan(plan)
        ex.graph_begin(graph)
        per_call.append(ex.bench_nodes(0, PER_PLAN))
        ex.graph_end()
        raw = ex.drain_raw()
        actuator.append(raw["cost_ns"][raw["source"] == 1])
    calls = np.concatenate(per_call)
    status = ex.status()
    if status["failed_errno"]:
        raise RuntimeError(f"actuator failed: errno {status['failed_errno']}")
    # the first ask of each graph also starts the graph (plan activation): keep it
    return calls, np.concatenate(actuator)


def idle_callback_cost(ex: ex_mod.NativeExecutor, n: int) -> np.ndarray:
    ex.set_plan(Plan())
    ex.graph_begin(1_000_000)
    out = ex.bench_nodes(0, n)
    ex.graph_end()
    return out[1:]


def fake_devfreq(root: Path) -> ex_mod.SysfsPairActuator:
    node = root / "devfreq"
    node.mkdir(parents=True)
    values = tuple(str(h) for h in LEVELS_HZ)
    (node / "min_freq").write_text(values[0])
    (node / "max_freq").write_text(values[-1])
    return ex_mod.SysfsPairActuator(
        str(node / "min_freq"), str(node / "max_freq"), values, values, 0, len(values) - 1
    )


def eval_cost(rounds: int, per_round: int) -> tuple[np.ndarray, np.ndarray]:
    """ns per eval-callback call (ask + done pair / 2) without and with an executor."""
    api = load_ggml()
    lib = api.lib
    ctx = lib.ggml_init(_InitParams(mem_size=16 * lib.ggml_tensor_overhead(), no_alloc=True))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        tensor = lib.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4096)
        lib.ggml_set_name(tensor, b"bench")
        hook = hooks.make_hook("kernel", 1 << 16, native=True)
        assert isinstance(hook, hooks.NativeHook)
        ex = ex_mod.NativeExecutor(LEVELS_HZ, ex_mod.RecordActuator())
        plain: list[np.ndarray] = []
        attached: list[np.ndarray] = []
        try:
            ex.set_plan(Plan(first_level=2))
            for _ in range(rounds):
                for on, sink in ((False, plain), (True, attached)):
                    hook.attach_executor(ex if on else None)
                    hook.begin_graph()
                    sink.append(ex_mod.bench_eval(tensor, hook, per_round) / 2)
                    hook.drain_raw()
        finally:
            ex.close()
            hook.close()
        return np.concatenate(plain), np.concatenate(attached)
    finally:
        lib.ggml_free(ctx)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switches", type=int, default=10_240, help="switches per actuator")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved eval-cost rounds")
    args = ap.parse_args(argv)
    if not ex_mod.EXECUTOR_AVAILABLE:
        print(f"native executor unavailable: {ex_mod._WHY}")
        return 1
    print(f"native plan executor cost on this machine ({os.cpu_count()} CPUs), ns")
    with ex_mod.NativeExecutor(LEVELS_HZ, ex_mod.RecordActuator(), log_capacity=1024) as ex:
        calls, act = switch_cost(ex, args.switches)
        idle = idle_callback_cost(ex, args.switches)
    print(f"RECORD     switch, engine path : {_pct(calls)}")
    print(f"RECORD     actuator call alone : {_pct(act)}")
    print(f"callback, no switch due        : {_pct(idle)}")
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        act_desc = fake_devfreq(Path(tmp))
        with ex_mod.NativeExecutor(LEVELS_HZ, act_desc, log_capacity=1024) as ex:
            calls, act = switch_cost(ex, args.switches)
        where = "tmpfs" if base else "tmp dir"
        print(f"SYSFS_PAIR switch, engine path : {_pct(calls)}  ({where}, 2 pwrite)")
        print(f"SYSFS_PAIR actuator call alone : {_pct(act)}")
    plain, attached = eval_cost(args.rounds, 16_384)
    print(f"eval callback, no executor     : {_pct(plain)}  per call")
    print(f"eval callback, executor        : {_pct(attached)}  per call")
    print(
        f"executor adds per callback     : {np.median(attached) - np.median(plain):8.0f} (median)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
