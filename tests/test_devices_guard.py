"""The restore guard: state comes back on close, exceptions, exit, SIGTERM and SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fakesysfs import make_jetson_orin, make_oneplus8_kgsl

from turboinfer_llama.devices.guard import RestoreGuard, active_guards

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks on a hang
from turboinfer_llama.devices import open_device
root, spec, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "chain":
    def mine(signum, frame):
        open(root + "/chained", "w").write(str(signum))
        sys.exit(3)
    signal.signal(signal.SIGTERM, mine)
gpu = open_device(spec, root=root)
gpu.set_hz(gpu.frequencies_hz()[0])
if mode == "raise":
    raise RuntimeError("crash with the GPU pinned")
if mode == "exit":
    sys.exit(0)
print("READY", flush=True)
# Short sleeps, not one long one: a signal that lands between the last check for
# signals and the sleep's syscall is only run when the sleep ends (a CPython race,
# seen twice under load as a 600 s hang). Here it waits at most 50 ms.
for _ in range(12000):
    time.sleep(0.05)
"""


def run_child(root: Path, spec: str, mode: str, sig: int | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), spec, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        if sig is not None:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "READY", proc.stderr.read() if proc.stderr else line
            proc.send_signal(sig)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Say where the child is.
            proc.send_signal(signal.SIGUSR1)
            try:
                _, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            raise AssertionError(f"child still running 60 s after signal {sig}:\n{err}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def kgsl_levels(paths) -> tuple[str, str]:
    k = paths["kgsl"]
    return (k / "max_pwrlevel").read_text().strip(), (k / "min_pwrlevel").read_text().strip()


@pytest.mark.parametrize(
    ("mode", "sig", "expected_rc"),
    [
        ("wait", signal.SIGTERM, -signal.SIGTERM),
        ("chain", signal.SIGTERM, 3),
        ("wait", signal.SIGINT, None),
        ("raise", None, 1),
        ("exit", None, 0),
    ],
)
def test_kgsl_restored_in_child(tmp_path, mode, sig, expected_rc) -> None:
    paths = make_oneplus8_kgsl(tmp_path)
    rc = run_child(tmp_path, "kgsl", mode, sig)
    if expected_rc is not None:
        assert rc == expected_rc
    else:
        assert rc != 0  # interrupted
    assert kgsl_levels(paths) == ("0", "6")
    if mode == "chain":
        assert (tmp_path / "chained").read_text() == str(int(signal.SIGTERM))


def test_devfreq_restored_after_sigterm(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    assert run_child(tmp_path, "devfreq", "wait", signal.SIGTERM) == -signal.SIGTERM
    assert (paths["devfreq"] / "min_freq").read_text().strip() == "306000000"
    assert (paths["devfreq"] / "max_freq").read_text().strip() == "1300500000"


def test_guard_runs_once_and_as_context_manager() -> None:
    calls: list[int] = []
    with RestoreGuard(lambda: calls.append(1), "test-gpu") as guard:
        assert "test-gpu" in active_guards()
    assert calls == [1] and guard.done
    guard.restore()
    assert calls == [1]
    assert "test-gpu" not in active_guards()
