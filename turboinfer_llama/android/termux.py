"""Termux on the phone, driven from the host over adb: install our own build, run there.

``install`` pushes an sdist (or wheel) built from this checkout plus the Termux helper
script and runs its ``setup``: llama-cpp-python built with Vulkan (or OpenCL) in
Termux, then turboinfer installed from the pushed file, never by name from an index.
``find_termux`` says whether the phone can run inference in Termux: root (adb cannot
enter Termux's private directory otherwise), Termux's Python, our package importable
and llama.cpp built with a GPU backend. Commands run in a root shell with Termux's
environment (Termux's Python needs PREFIX, HOME and its libraries).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..devices.adb_link import NO_ROOT_ADVICE, AdbLink, ShellResult, ShellSession
from ..devices.base import DeviceError

TERMUX_PREFIX = "/data/data/com.termux/files/usr"
TERMUX_HOME = "/data/data/com.termux/files/home"
TERMUX_PYTHON = f"{TERMUX_PREFIX}/bin/python"
TERMUX_SH = f"{TERMUX_PREFIX}/bin/sh"
PHONE_DIR = "/sdcard/Download/turboinfer"
SCRIPT_REMOTE = "/sdcard/Download/turboinfer-termux.sh"
GPU_BACKENDS = ("vulkan", "opencl")
INSTALL_TIMEOUT_S = 3600.0  # llama.cpp with Vulkan shaders builds for tens of minutes
READY_MARK = "turboinfer-termux-ready"
_CHECK = (
    "import llama_cpp, turboinfer_llama; "
    f'print("{READY_MARK}", turboinfer_llama.__version__, '
    "bool(llama_cpp.llama_supports_gpu_offload()))"
)


class TermuxError(DeviceError):
    """Termux on the phone cannot do what was asked; the message says why."""


def termux_env() -> str:
    """Variable assignments that make a root shell run Termux's programs."""
    return (
        f"PREFIX={TERMUX_PREFIX} HOME={TERMUX_HOME} TMPDIR={TERMUX_PREFIX}/tmp "
        f"PATH={TERMUX_PREFIX}/bin:/system/bin LD_PRELOAD={TERMUX_PREFIX}/lib/libtermux-exec.so "
        "LANG=en_US.UTF-8"
    )


def in_termux(command: str) -> str:
    """``command`` (a Termux program and its arguments) with Termux's environment."""
    return f"{termux_env()} {command}"


@dataclass
class TermuxStatus:
    """Whether inference can run on the phone in Termux, and if not, why."""

    ready: bool
    why: str
    version: str | None = None
    gpu_offload: bool | None = None


def _root_session(link: AdbLink, timeout_s: float | None = None) -> ShellSession:
    access = link.root_access()
    if not access.rooted:
        raise TermuxError(
            f"no root on {link.serial} ({access.detail}): adb cannot enter Termux's "
            f"private files. {NO_ROOT_ADVICE}"
        )
    return ShellSession(link, access.session_command or "", timeout_s)


def find_termux(link: AdbLink) -> TermuxStatus:
    """Can the phone run our inference in Termux right now?"""
    try:
        session = _root_session(link)
    except TermuxError as e:
        return TermuxStatus(False, str(e))
    try:
        if not session.run(f"[ -f {TERMUX_PYTHON} ]").ok:
            return TermuxStatus(
                False,
                f"no Termux Python on {link.serial} ({TERMUX_PYTHON}): install Termux "
                "(F-Droid build), then `turboinfer android install`",
            )
        r = session.run(in_termux(f"{TERMUX_PYTHON} -c {shlex.quote(_CHECK)}"))
    finally:
        session.close()
    m = re.search(rf"{READY_MARK} (\S+) (True|False)", r.out)
    if not r.ok or m is None:
        tail = r.out.strip().splitlines()[-1:] or [f"exit {r.rc}"]
        return TermuxStatus(
            False,
            f"turboinfer or llama-cpp-python is not importable in Termux ({tail[0]}): "
            "run `turboinfer android install`",
        )
    version, offload = m.group(1), m.group(2) == "True"
    if not offload:
        return TermuxStatus(
            False,
            "Termux's llama-cpp-python has no GPU backend (CPU build): "
            "`turboinfer android install` rebuilds it with Vulkan",
            version,
            False,
        )
    return TermuxStatus(True, f"turboinfer {version} in Termux, llama.cpp with GPU offload",
                        version, True)  # fmt: skip


def build_sdist(out_dir: Path) -> Path:
    """An sdist of this checkout (the phone compiles the C hook for its own CPU)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "setup.py").is_file():
        raise TermuxError(
            f"no setup.py at {root}: pass --dist with a turboinfer-llama sdist or wheel"
        )
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(out_dir)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = sorted(out_dir.glob("turboinfer_llama-*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise TermuxError(f"building the sdist failed: {proc.stderr.strip()[-500:]}")
    return found[-1]


def _check_dist(dist: Path) -> None:
    if not dist.is_file():
        raise TermuxError(f"{dist}: no such file")
    name = dist.name.lower().replace("-", "_")
    if not name.startswith("turboinfer_llama") or not (
        name.endswith(".whl") or name.endswith(".tar.gz")
    ):
        raise TermuxError(
            f"{dist.name}: not a turboinfer-llama wheel or sdist (turboinfer_llama-*.tar.gz "
            "or *.whl)"
        )


@dataclass
class InstallReport:
    serial: str
    dist_remote: str
    steps: list[str] = field(default_factory=list)
    ran_setup: bool = False


def install(
    link: AdbLink,
    *,
    dist: Path | None = None,
    backend: str = "vulkan",
    script: Path,
    run_setup: bool = True,
) -> InstallReport:
    """Push our package file and the Termux script, then run ``setup`` in Termux."""
    if backend not in GPU_BACKENDS:
        raise TermuxError(f"unknown GPU backend {backend!r}; choose {', '.join(GPU_BACKENDS)}")
    with tempfile.TemporaryDirectory(prefix="turboinfer-dist-") as tmp:
        if dist is None:
            dist = build_sdist(Path(tmp))
        _check_dist(dist)
        remote = f"{PHONE_DIR}/{dist.name}"
        report = InstallReport(link.serial, remote)
        link.run(f"mkdir -p {PHONE_DIR}")
        size = link.push(dist, remote)
        report.steps.append(f"pushed {dist.name} ({size} bytes) to {remote}")
    link.push(script, SCRIPT_REMOTE)
    report.steps.append(f"pushed {script.name} to {SCRIPT_REMOTE}")
    setup = f"{SCRIPT_REMOTE} setup --{backend} {remote}"
    if not run_setup:
        report.steps.append(f"in Termux, run: sh {setup}")
        return report
    session = _root_session(link, INSTALL_TIMEOUT_S)
    try:
        if not session.run(f"[ -f {TERMUX_SH} ]").ok:
            raise TermuxError(
                f"Termux is not installed on {link.serial} (no {TERMUX_SH}); install it "
                f"(F-Droid build) and rerun, or run `sh {setup}` in Termux"
            )
        r = session.run(in_termux(f"{TERMUX_SH} {setup}"))
    finally:
        session.close()
    if not r.ok:
        tail = "\n".join(r.out.strip().splitlines()[-15:])
        raise TermuxError(f"setup in Termux failed (exit {r.rc}):\n{tail}")
    report.ran_setup = True
    report.steps.append(f"ran `sh {setup}` in Termux ({backend} build of llama-cpp-python)")
    return report


def run_in_termux(link: AdbLink, command: str, timeout_s: float) -> ShellResult:
    """A Termux program as root (the GPU clock needs it), with Termux's environment."""
    session = _root_session(link, timeout_s)
    try:
        return session.run(in_termux(command))
    finally:
        session.close()


__all__ = [
    "PHONE_DIR",
    "SCRIPT_REMOTE",
    "TERMUX_PREFIX",
    "TERMUX_PYTHON",
    "InstallReport",
    "TermuxError",
    "TermuxStatus",
    "build_sdist",
    "find_termux",
    "in_termux",
    "install",
    "run_in_termux",
]
