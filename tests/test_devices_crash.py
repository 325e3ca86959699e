"""Crash safety on fake trees: the guardian puts the GPU back when its owner dies by a
signal nothing can catch (SIGKILL) or one the restore guard does not handle (SIGHUP,
SIGQUIT, SIGABRT), also mid-decode; one owner per GPU; left-over state files found by
``turboinfer probe`` and put back by ``turboinfer restore``; foreign writes counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakesysfs import make_jetson_orin, make_oneplus8_kgsl, write

from turboinfer_llama.cli import main
from turboinfer_llama.devices import open_device
from turboinfer_llama.devices.devfreq import DevfreqGpu
from turboinfer_llama.devices.owner import DeviceBusy
from turboinfer_llama.devices.state import leftovers
from turboinfer_llama.devices.sysfs_io import LocalSysfs

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ORIN = "/sys/class/devfreq/17000000.ga10b"
RESTORE_BUDGET_S = 1.0  # issue 15: back within 1 s of the owner's death

CHILD = """
import signal, sys, time
# the owner dies of the signals it does not handle, even when the test run ignores
# them and the ignoring is inherited through exec: SIGHUP under nohup, SIGQUIT (and
# SIGINT) in a command a non-interactive shell started in the background (`make test &`:
# SIGQUIT then left the owner alive for 30 s and failed the test)
for s in (signal.SIGHUP, signal.SIGQUIT, signal.SIGINT):
    signal.signal(s, signal.SIG_DFL)
sys.path.insert(0, sys.argv[3])
from turboinfer_llama.devices import open_device
root, spec = sys.argv[1], sys.argv[2]
if spec == "kmod-fake":
    from test_kmod_device import FakeTurboinfer
    from turboinfer_llama.devices.kmod import KmodDevice
    gpu = KmodDevice(root + "/turboinfer", ioctl=FakeTurboinfer().ioctl)
else:
    gpu = open_device(spec, root=root)
gpu.set_hz(gpu.frequencies_hz()[0])
print("READY", gpu.health()["guardian_pid"], flush=True)
time.sleep(120)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise AssertionError(proc.communicate()[1])
    return proc, line[1:]


def kill_and_time(proc: subprocess.Popen[str], sig: int, restored) -> float:
    """Send ``sig``, reap the owner, then poll until ``restored()``; seconds taken
    from the owner's death (fails past the budget)."""
    try:
        proc.send_signal(sig)
        proc.wait(timeout=30)
        t0 = time.monotonic()
        while not restored():
            elapsed = time.monotonic() - t0
            assert elapsed < RESTORE_BUDGET_S, f"not restored {elapsed:.2f} s after the owner died"
            time.sleep(0.005)
        return time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def logged(state_dir: Path, text: str, timeout_s: float = 10.0) -> bool:
    """Whether the guardian's log gets ``text``: it writes the line after it has put the
    GPU back and dropped the state file, so on a loaded host the line can follow the
    restore the caller saw by a scheduling slice."""
    log_path = state_dir / "guardian.log"
    t_end = time.monotonic() + timeout_s
    while True:
        if log_path.exists() and text in log_path.read_text():
            return True
        if time.monotonic() > t_end:
            return False
        time.sleep(0.01)


def devfreq_range(paths) -> tuple[str, str]:
    d = paths["devfreq"]
    return (d / "min_freq").read_text().strip(), (d / "max_freq").read_text().strip()


def kgsl_levels(paths) -> tuple[str, str]:
    k = paths["kgsl"]
    return (k / "max_pwrlevel").read_text().strip(), (k / "min_pwrlevel").read_text().strip()


def _no_state_files(state_dir: Path) -> bool:
    return not list(state_dir.glob("*.json"))


SIGNALS = [signal.SIGKILL, signal.SIGHUP, signal.SIGQUIT, signal.SIGABRT]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_devfreq_back_within_1s_after_owner_dies(tmp_path, _state_dir, sig) -> None:
    paths = make_jetson_orin(tmp_path)
    proc, (guardian,) = spawn(CHILD, str(tmp_path), "devfreq", str(TESTS))
    assert guardian != "None"
    assert devfreq_range(paths) == ("306000000", "306000000")  # pinned
    took = kill_and_time(
        proc,
        sig,
        lambda: devfreq_range(paths) == ("306000000", "1300500000") and _no_state_files(_state_dir),
    )
    print(f"devfreq {signal.Signals(sig).name}: restored {took * 1e3:.0f} ms after death")
    assert (paths["devfreq"] / "governor").read_text().strip() == "nvhost_podgov"
    assert logged(_state_dir, "died without closing"), (_state_dir / "guardian.log").read_text()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_kgsl_back_within_1s_after_owner_dies(tmp_path, _state_dir, sig) -> None:
    paths = make_oneplus8_kgsl(tmp_path)
    proc, _ = spawn(CHILD, str(tmp_path), "kgsl", str(TESTS))
    assert kgsl_levels(paths) == ("6", "6")
    took = kill_and_time(
        proc, sig, lambda: kgsl_levels(paths) == ("0", "6") and _no_state_files(_state_dir)
    )
    print(f"kgsl {signal.Signals(sig).name}: restored {took * 1e3:.0f} ms after death")


def test_kmod_state_released_after_sigkill(tmp_path, _state_dir) -> None:
    """The kernel drops the module's requests with the fd; the guardian, as a second
    line, checks and cleans up, and the GPU can be taken again at once."""
    os.mkfifo(tmp_path / "turboinfer")
    proc, _ = spawn(CHILD, str(tmp_path), "kmod-fake", str(TESTS))
    assert list(_state_dir.glob("kmod-*.json"))
    kill_and_time(proc, signal.SIGKILL, lambda: _no_state_files(_state_dir))
    assert logged(_state_dir, "kernel dropped"), (_state_dir / "guardian.log").read_text()
    from test_kmod_device import FakeTurboinfer

    from turboinfer_llama.devices.kmod import KmodDevice

    with KmodDevice(str(tmp_path / "turboinfer"), ioctl=FakeTurboinfer().ioctl) as dev:
        assert dev.set_hz(400_000_000) == 400_000_000


def test_normal_close_guardian_exits_quietly(tmp_path, _state_dir) -> None:
    paths = make_jetson_orin(tmp_path)
    gpu = open_device("devfreq", root=str(tmp_path))
    guardian = gpu.ownership_health()["guardian_pid"]
    assert guardian and Path(f"/proc/{guardian}").exists()
    gpu.set_hz(510_000_000)
    gpu.close()
    assert not Path(f"/proc/{guardian}").exists()  # reaped: exited on our goodbye
    assert devfreq_range(paths) == ("306000000", "1300500000")
    assert _no_state_files(_state_dir)
    log = _state_dir / "guardian.log"
    assert not log.exists() or "died" not in log.read_text()


def test_guardian_never_holds_the_owners_fds(tmp_path) -> None:
    os.mkfifo(tmp_path / "turboinfer")
    from test_kmod_device import FakeTurboinfer

    from turboinfer_llama.devices.kmod import KmodDevice

    with KmodDevice(str(tmp_path / "turboinfer"), ioctl=FakeTurboinfer().ioctl) as dev:
        pid = dev.ownership_health()["guardian_pid"]
        targets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(tmp_path / "turboinfer") not in targets
        assert not any(t.endswith(".lock") for t in targets)


def test_guardian_that_cannot_start_warns_once_and_the_device_opens(
    tmp_path, monkeypatch, caplog
) -> None:
    from turboinfer_llama.devices import owner

    make_jetson_orin(tmp_path)
    monkeypatch.setattr(owner, "_warned_guardian", False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with caplog.at_level("WARNING"):
        with open_device("devfreq", root=str(tmp_path)) as gpu:
            assert gpu.set_hz(612_000_000) == 612_000_000
            assert "no guardian" in gpu.ownership_health()["warnings"][0]
        with open_device("devfreq", root=str(tmp_path)) as gpu:
            gpu.set_hz(612_000_000)
    assert sum("no guardian" in r.message for r in caplog.records) == 1


def test_second_owner_gets_a_clear_error_naming_the_holder(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    proc, _ = spawn(CHILD, str(tmp_path), "devfreq", str(TESTS))
    try:
        with pytest.raises(DeviceBusy, match=f"pid {proc.pid}") as err:
            open_device("devfreq", root=str(tmp_path))
        assert err.value.holder_pid == proc.pid
        # probe reads without taking the GPU, and does not snapshot it as its own
        gpu = DevfreqGpu(LocalSysfs(tmp_path), ORIN, own=False)
        gpu.close()
        assert devfreq_range(paths) == ("306000000", "306000000")  # untouched
    finally:
        proc.terminate()
        proc.communicate()
    assert devfreq_range(paths) == ("306000000", "1300500000")


def test_kgsl_and_its_devfreq_node_are_one_gpu(tmp_path) -> None:
    make_oneplus8_kgsl(tmp_path)
    with open_device("kgsl", root=str(tmp_path)), pytest.raises(DeviceBusy):
        open_device("devfreq:3d00000.qcom,kgsl-3d0", root=str(tmp_path))


def _leave_pinned(tmp_path: Path, spec: str, env: dict[str, str]) -> None:
    """A child that pins the GPU and dies by SIGKILL with no guardian."""
    code = CHILD.replace("time.sleep(120)", "import os, signal; os.kill(os.getpid(), 9)")
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), spec, str(TESTS)],
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr


def test_next_owner_puts_back_a_dead_owners_state_before_its_snapshot(tmp_path, _state_dir):
    paths = make_jetson_orin(tmp_path)
    _leave_pinned(tmp_path, "devfreq", {"TURBOINFER_GUARDIAN": "0"})
    assert devfreq_range(paths) == ("306000000", "306000000")
    with open_device("devfreq", root=str(tmp_path)) as gpu:
        assert "took over from pid" in gpu.ownership_health()["adopted"]
        state = gpu.snapshot()
        assert (state.min_hz, state.max_hz) == (306000000, 1300500000)  # not the pin
        gpu.set_hz(714_000_000)
    assert devfreq_range(paths) == ("306000000", "1300500000")


def test_probe_warns_and_restore_puts_back(tmp_path, _state_dir, capsys) -> None:
    paths = make_oneplus8_kgsl(tmp_path)
    _leave_pinned(tmp_path, "kgsl", {"TURBOINFER_GUARDIAN": "0"})
    assert kgsl_levels(paths) == ("6", "6")
    assert main(["probe", "--root", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (left,) = report["leftover_state"]
    assert left["device"] == "kgsl:kgsl-3d0" and not left["stale"]
    assert main(["probe", "--root", str(tmp_path)]) == 0
    assert "may still be pinned" in capsys.readouterr().out
    assert main(["restore", "--device", "devfreq"]) == 0  # another device: not touched
    assert kgsl_levels(paths) == ("6", "6")
    assert main(["restore", "--device", "kgsl"]) == 0
    out = capsys.readouterr().out
    assert "restored governor msm-adreno-tz, 305-670 MHz" in out
    assert kgsl_levels(paths) == ("0", "6")
    assert not leftovers()
    assert main(["restore"]) == 0
    assert "nothing left pinned" in capsys.readouterr().out


def test_restore_reports_a_device_that_is_gone(tmp_path, _state_dir, capsys) -> None:
    paths = make_jetson_orin(tmp_path)
    _leave_pinned(tmp_path, "devfreq", {"TURBOINFER_GUARDIAN": "0"})
    (paths["devfreq"] / "min_freq").unlink()
    assert main(["restore"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert leftovers()  # kept for a later try
    write(paths["devfreq"] / "min_freq", 306000000)
    assert main(["restore", "--device", "devfreq:17000000.ga10b"]) == 0


def test_foreign_writes_are_counted_not_fought(tmp_path) -> None:
    paths = make_jetson_orin(tmp_path)
    with open_device("devfreq", root=str(tmp_path)) as gpu:
        gpu.set_hz(510_000_000)
        write(paths["devfreq"] / "min_freq", 918000000)  # vendor perfd boosts the floor
        write(paths["devfreq"] / "max_freq", 1300500000)
        gpu.set_hz(612_000_000)
        h = gpu.health()
        assert h["foreign_writes"] == 1 and "918000000" in h["last_foreign_write"]
        assert devfreq_range(paths) == ("612000000", "612000000")  # one write, no loop
    paths = make_oneplus8_kgsl(tmp_path / "k")
    with open_device("kgsl", root=str(tmp_path / "k")) as gpu:
        gpu.set_hz(400_000_000)
        write(paths["kgsl"] / "max_pwrlevel", 2)  # thermal-engine
        gpu.set_hz(490_000_000)
        assert gpu.health()["foreign_writes"] == 1


DECODE_CHILD = """
import sys
root_node, model = sys.argv[1], sys.argv[2]
from turboinfer_llama import Llama
llm = Llama(model_path=model, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False, seed=1,
            power={"device": "devfreq:" + root_node, "controller": "max", "allow_cpu": True})
toks = llm.tokenize(b"hello world " * 80)[:480]
llm.eval(toks[:8])  # the controller has pinned the clock by now
print("READY", llm.power.stats()["energy"]["health"]["ok"], flush=True)
while True:  # one 480-token llama_decode after another: nearly all the time in C
    llm.reset()
    llm.eval(toks)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_signal_during_a_long_decode(tmp_path, _state_dir, tiny_gguf, sig) -> None:
    """SIGKILL mid-``llama_decode``: the guardian restores. SIGTERM: Python's handler
    runs once the C call returns, and the restore guard puts the clock back."""
    paths = make_jetson_orin(tmp_path)
    node = str(paths["devfreq"])
    proc, (ok,) = spawn(DECODE_CHILD, node, str(tiny_gguf))
    try:
        assert ok == "True"
        assert devfreq_range(paths) == ("1300500000", "1300500000")  # "max" pinned the top
    except BaseException:  # never leave the decoding child running
        proc.kill()
        proc.wait()
        raise
    time.sleep(0.3)  # well inside the decode loop
    took = kill_and_time(
        proc,
        sig,
        lambda: devfreq_range(paths) == ("306000000", "1300500000") and _no_state_files(_state_dir),
    )
    print(f"decode {signal.Signals(sig).name}: restored {took * 1e3:.0f} ms after death")


FORK_CHILD = """
import os, sys
from turboinfer_llama.devices import open_device
root = sys.argv[1]
gpu = open_device("devfreq", root=root)
gpu.set_hz(510_000_000)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's atexit must not put the parent's GPU back
os.waitpid(pid, 0)
node = root + "/sys/class/devfreq/17000000.ga10b/"
still = open(node + "min_freq").read().strip()
gpu.close()
print("READY", still, open(node + "min_freq").read().strip(), flush=True)
"""


def test_a_forked_child_never_restores_its_parents_gpu(tmp_path) -> None:
    make_jetson_orin(tmp_path)
    proc, (during, after) = spawn(FORK_CHILD, str(tmp_path))
    proc.communicate()
    assert (during, after) == ("510000000", "306000000")
