"""The phone's GPU path against the fake adb server: ``android install`` pushes our own
package file and runs the Termux setup; ``android bench`` runs in Termux when it can and
otherwise labels the run control only. A fake Termux (programs under Termux's prefix,
registered on the fake shell) records what it was asked to do."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from fakeadb import oneplus8, serving
from fakeadb.shell import Shell

from turboinfer_llama.android import termux
from turboinfer_llama.android.bench import CONTROL_ONLY, ON_PHONE
from turboinfer_llama.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "android"
PY = termux.TERMUX_PYTHON
SH = f"{termux.TERMUX_PREFIX}/bin/sh"
TI = f"{termux.TERMUX_PREFIX}/bin/turboinfer"


class FakeTermux:
    """Termux's python, sh and turboinfer on a fake phone; remembers each call."""

    def __init__(self, phone, monkeypatch, *, installed=True, gpu_offload=True) -> None:
        self.phone = phone
        self.installed = installed
        self.gpu_offload = gpu_offload
        self.calls: list[tuple[str, list[str], dict[str, str]]] = []
        for path in (PY, SH, TI):
            host = phone.host_path(path)
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_text("#!fake\n")
        fake = self

        def python(shell, a, io):
            fake.calls.append(("python", a, dict(shell.vars)))
            if not fake.installed:
                io.err("ModuleNotFoundError: No module named 'turboinfer_llama'\n")
                return 1
            io.out(f"{termux.READY_MARK} 0.1.0 {fake.gpu_offload}\n")
            return 0

        def sh(shell, a, io):
            fake.calls.append(("sh", a, dict(shell.vars)))
            io.out("setup done\n")
            return 0

        def turboinfer(shell, a, io):
            fake.calls.append(("turboinfer", a, dict(shell.vars)))
            report = {
                "controllers": {},
                "simulated": False,
                "energy_source": "measured (battery fuel gauge)",
                "device": "kgsl:kgsl-3d0",
            }
            out = a[a.index("--json") + 1]
            shell.phone.write(out, json.dumps(report).encode(), shell.uid)
            return 0

        for path, fn in ((PY, python), (SH, sh), (TI, turboinfer)):
            monkeypatch.setattr(Shell, f"cmd_{path}", fn, raising=False)

    def named(self, name: str) -> list[tuple[list[str], dict[str, str]]]:
        return [(a, env) for n, a, env in self.calls if n == name]


def _phone(tmp_path: Path):
    phone = oneplus8(tmp_path / "phone")
    (phone.root / "sdcard/Download").mkdir(parents=True, exist_ok=True)
    return phone


def test_install_pushes_our_sdist_and_runs_termux_setup(tmp_path, monkeypatch, capsys):
    phone = _phone(tmp_path)
    fake = FakeTermux(phone, monkeypatch)
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "install"]) == 0
    out = capsys.readouterr().out
    pushed = sorted((phone.root / "sdcard/Download/turboinfer").glob("turboinfer_llama-*.tar.gz"))
    assert len(pushed) == 1
    with tarfile.open(pushed[0]) as tar:  # our own build of this checkout
        names = tar.getnames()
    assert any(n.endswith("hooks/ti_hooks.c") for n in names)
    assert any(n.endswith("turboinfer_llama/offload.py") for n in names)
    script = phone.root / "sdcard/Download/turboinfer-termux.sh"
    assert script.read_bytes() == (EXAMPLES / "termux-run.sh").read_bytes()
    [(args, env)] = fake.named("sh")
    remote = f"{termux.PHONE_DIR}/{pushed[0].name}"
    assert args == [termux.SCRIPT_REMOTE, "setup", "--vulkan", remote]
    assert env["PREFIX"] == termux.TERMUX_PREFIX and env["HOME"].endswith("/files/home")
    assert "installed in Termux" in out
    # Nothing was installed by name from an index.
    assert not any("pip install turboinfer" in c for c in phone.commands_run)


def test_install_opencl_push_only_with_a_given_wheel(tmp_path, monkeypatch, capsys):
    phone = _phone(tmp_path)
    fake = FakeTermux(phone, monkeypatch)
    wheel = tmp_path / "turboinfer_llama-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 fake wheel")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "install", "--opencl", "--dist", str(wheel), "--push-only"]) == 0
    out = capsys.readouterr().out
    remote = f"{termux.PHONE_DIR}/{wheel.name}"
    assert phone.host_path(remote).read_bytes() == wheel.read_bytes()
    assert f"sh {termux.SCRIPT_REMOTE} setup --opencl {remote}" in out
    assert fake.calls == []  # push only: nothing ran in Termux


def test_install_refuses_a_file_that_is_not_ours(tmp_path, monkeypatch, capsys):
    phone = _phone(tmp_path)
    other = tmp_path / "someone_else-1.0.tar.gz"
    other.write_bytes(b"x")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "install", "--dist", str(other)]) == 2
    assert "not a turboinfer-llama wheel or sdist" in capsys.readouterr().err
    assert not (phone.root / "sdcard/Download/turboinfer").exists()


def test_install_without_termux_says_so(tmp_path, monkeypatch, capsys):
    phone = _phone(tmp_path)
    wheel = tmp_path / "turboinfer_llama-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "install", "--dist", str(wheel)]) == 2
    assert "Termux is not installed" in capsys.readouterr().err


def test_bench_runs_in_termux_when_the_phone_can(tmp_path, monkeypatch, capsys, tiny_gguf):
    phone = _phone(tmp_path)
    fake = FakeTermux(phone, monkeypatch)
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "bench", "--model", str(tiny_gguf), "--controller", "tmpc"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out[cap.out.index("{") :])
    assert report["inference"] == ON_PHONE and report["control_only"] is False
    assert ON_PHONE in cap.err
    [(args, env)] = fake.named("turboinfer")
    remote_model = f"{termux.PHONE_DIR}/{tiny_gguf.name}"
    assert args[:5] == ["bench", "--device", "kgsl", "--meter", "battery"]
    assert args[args.index("--model") + 1] == remote_model
    assert args[args.index("--controllers") + 1] == "tmpc"
    assert phone.host_path(remote_model).read_bytes() == tiny_gguf.read_bytes()
    assert env["PREFIX"] == termux.TERMUX_PREFIX


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("none", "no Termux Python"),
        ("missing", "not importable in Termux"),
        ("cpu", "has no GPU backend"),
        ("unrooted", "no root"),
    ],
)
def test_bench_is_labelled_control_only_otherwise(tmp_path, monkeypatch, capsys, setup, why):
    import turboinfer_llama.bench.runner as runner

    def run_bench(*, device, meter, **options):
        meter.begin_window("bench")
        m = meter.end_window("bench")
        return {"energy_j": m.energy_j, "device": device.name}

    monkeypatch.setattr(runner, "run_bench", run_bench)
    phone = _phone(tmp_path)
    if setup == "unrooted":
        phone.rooted = False
        FakeTermux(phone, monkeypatch)
    elif setup != "none":
        FakeTermux(phone, monkeypatch, installed=setup != "missing", gpu_offload=setup != "cpu")
    with serving(monkeypatch, tmp_path / "state", phone):
        assert main(["android", "bench", "--model", "m.gguf"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["inference"] == CONTROL_ONLY
    assert report["control_only"] is True and why in report["why_control_only"]
    assert "control only: inference on the host" in cap.err
    assert report["device"].startswith(f"adb:{phone.serial}")


def test_termux_script_builds_for_the_gpu_and_installs_the_pushed_file():
    script = str(EXAMPLES / "termux-run.sh")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", script, *args], capture_output=True, text=True, timeout=30)

    r = run("--dry-run", "setup", "/sdcard/Download/turboinfer/turboinfer_llama-0.1.0.tar.gz")
    assert r.returncode == 0, r.stderr
    assert "vulkan-headers vulkan-loader-android shaderc" in r.stdout
    assert "CMAKE_ARGS=-DGGML_VULKAN=ON -DGGML_NATIVE=OFF" in r.stdout
    assert "--no-binary llama-cpp-python" in r.stdout
    assert "+ pip install /sdcard/Download/turboinfer/turboinfer_llama-0.1.0.tar.gz[server]" in (
        r.stdout
    )
    assert "pip install turboinfer-llama" not in r.stdout  # never by name from an index
    r = run("--dry-run", "setup", "--opencl", "/x/turboinfer_llama-0.1.0-py3-none-any.whl")
    assert "opencl-headers" in r.stdout and "-DGGML_OPENCL=ON" in r.stdout
    assert "GGML_VULKAN" not in r.stdout
    r = run("--dry-run", "setup")
    assert r.returncode == 2 and "turboinfer android install" in r.stderr
