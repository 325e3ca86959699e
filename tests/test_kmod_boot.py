"""The whole kernel-module boot test: build turboinfer.ko against Debian's current
linux-headers-amd64, boot the matching kernel under qemu TCG with a busybox
initramfs, run every in-guest check and rmmod, then attach the module by name to a
stand-in GPU driver (kernel_module/boottest.sh).

Skipped only where its tools are missing; `make sysdeps` (kernel_module/install-deps.sh)
installs them, and CI runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KERNEL_MODULE = Path(__file__).resolve().parents[1] / "kernel_module"
TOOLS = ("qemu-system-x86_64", "busybox", "cpio", "gcc", "make", "dpkg-deb", "apt-get")


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "not Linux"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"missing {', '.join(absent)}; run: sudo sh kernel_module/install-deps.sh"
    probe = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", "linux-headers-amd64"],
        capture_output=True,
        text=True,
    )
    if "install ok installed" not in probe.stdout:
        return "linux-headers-amd64 not installed; run: sudo sh kernel_module/install-deps.sh"
    return None


@pytest.mark.slow
@pytest.mark.privileged
def test_kmod_qemu_boot_passes_every_check() -> None:
    why = _missing()
    if why:
        pytest.skip(why)
    proc = subprocess.run(
        ["sh", str(KERNEL_MODULE / "boottest.sh")],
        capture_output=True,
        text=True,
        timeout=800,
        env={**os.environ, "TI_BOOT_TIMEOUT": "420", "LC_ALL": "C"},
    )
    out = proc.stdout
    print(out)  # the verdict and timing lines, shown with -s or on failure
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    assert "TURBOINFER-BOOTTEST: PASS" in out
    assert "TI-CHECK FAIL" not in out
    run_line = next(line for line in out.splitlines() if line.startswith("TI-RUN "))
    assert run_line.endswith("failed=0")
    attach_line = next(line for line in out.splitlines() if line.startswith("TI-ATTACH "))
    assert attach_line.endswith("failed=0")
    timing = next(line for line in out.splitlines() if line.startswith("TI-TIMING "))
    fields = dict(kv.split("=", 1) for kv in timing.split() if "=" in kv)
    assert int(fields["set_freq_ioctl_median_ns"]) > 0
    assert int(fields["sysfs_minmax_open_write_close_median_ns"]) > 0
