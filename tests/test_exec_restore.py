"""Restore order: a SIGTERM in the middle of a plan stops and joins the native executor
before the device is restored, so no native write lands after the restore.

The child is an app that shuts down gracefully (its own SIGTERM handler keeps it
running for a while), the worst case: the executor's timer thread would go on writing
after the guard restored the device. Evidence is the fake devfreq tree's files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakesysfs import EXYNOS_MALI_HZ

from turboinfer_llama.engine import executor as native_exec

pytestmark = pytest.mark.skipif(
    not native_exec.EXECUTOR_AVAILABLE, reason="native executor library not built"
)

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, os, signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from fakesysfs import make_exynos_mali
from turboinfer_llama._clock import now_ns
from turboinfer_llama.control.plan import Anchor, Plan, Switch
from turboinfer_llama.devices.devfreq import DevfreqGpu
from turboinfer_llama.devices.sysfs_io import LocalSysfs
from turboinfer_llama.engine.executor import NativeExecutor

root, order = Path(sys.argv[1]), sys.argv[2]
caught = []
signal.signal(signal.SIGTERM, lambda s, f: caught.append(s))  # graceful shutdown
paths = make_exynos_mali(root)
node = "/sys/class/devfreq/18500000.mali"
if order == "device-first":  # the supported order: device opened, then executor
    gpu = DevfreqGpu(LocalSysfs(root), node)
    ex = NativeExecutor(gpu.frequencies_hz(), gpu.native_actuator())
else:  # control: an executor nobody stops (its guard taken out of the list)
    from turboinfer_llama.devices import guard
    gpu = DevfreqGpu(LocalSysfs(root), node)
    ex = NativeExecutor(gpu.frequencies_hz(), gpu.native_actuator())
    guard._active.pop(ex._guard._id)
# 1 s of switches, one every 20 ms, between levels 1..10
plan = Plan(first_level=5, switches=tuple(
    Switch(Anchor.OFFSET, 20_000_000 * (i + 1), 1 + i % 10) for i in range(50)))
ex.set_plan(plan)
ex.graph_begin(1)
ex.on_node(0, True, now_ns())
time.sleep(0.2)
os.kill(os.getpid(), signal.SIGTERM)  # mid-plan
time.sleep(0.3)  # the app is still shutting down
f = paths["devfreq"]
print(json.dumps({
    "caught": caught,
    "min": int((f / "min_freq").read_text().split()[0]),
    "max": int((f / "max_freq").read_text().split()[0]),
    "status": ex.status(),
}))
"""


def run_child(tmp_path: Path, order: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / order), order, str(ROOT / "tests")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sigterm_mid_plan_stops_the_executor_before_the_restore(tmp_path: Path) -> None:
    out = run_child(tmp_path, "device-first")
    assert out["caught"] == [15]  # the app's own handler still ran (chained)
    assert out["status"]["stopped"] == 1 and out["status"]["applied"] >= 2
    # restored, and nothing written after the restore
    assert (out["min"], out["max"]) == (EXYNOS_MALI_HZ[0], EXYNOS_MALI_HZ[-1])


def test_control_an_executor_left_running_overwrites_the_restore(tmp_path: Path) -> None:
    """Shows the check above can fail: an executor nobody stops keeps pinning the
    clock from its timer thread after the device was restored."""
    out = run_child(tmp_path, "unguarded")
    assert out["status"]["stopped"] == 0
    assert (out["min"], out["max"]) != (EXYNOS_MALI_HZ[0], EXYNOS_MALI_HZ[-1])
