"""Push turboinfer.ko to a phone, insmod it with ``target=<GPU devfreq>``, check
/dev/turboinfer, and say precisely why it failed when it does.

The module's ``target=`` parameter names the devfreq device to attach to (an exact name,
a glob, or the part after the last '.' or ',', see kernel_module/ti_core.c).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..devices.adb import AdbShellSysfs
from ..devices.adb_link import NO_ROOT_ADVICE, AdbLink
from ..devices.base import DeviceError
from ..devices.devfreq import find_gpu_devfreq

REMOTE_DIR = "/data/local/tmp"
DEVICE_NODE = "/dev/turboinfer"


class DeployError(DeviceError):
    """The module could not be loaded; the message says why and what to do."""


@dataclass
class DeployReport:
    serial: str
    target: str
    remote_path: str
    steps: list[str] = field(default_factory=list)


def modinfo(blob: bytes) -> dict[str, str]:
    """``key=value`` strings of a module's .modinfo section (NUL-separated)."""
    out: dict[str, str] = {}
    for chunk in blob.split(b"\0"):
        text = chunk.decode("ascii", "replace")
        key, sep, value = text.partition("=")
        if sep and key in ("vermagic", "name", "license") and key not in out:
            out[key] = value
    return out


def deploy(link: AdbLink, ko: Path, target: str | None = None) -> DeployReport:
    """Load ``ko`` on the phone. Raises ``DeployError`` with the precise cause."""
    if not ko.is_file():
        raise DeployError(f"{ko}: no such module file (build turboinfer.ko for the phone's kernel)")
    blob = ko.read_bytes()
    info = modinfo(blob)
    access = link.root_access()
    if not access.rooted:
        raise DeployError(f"no root on {link.serial}: {access.detail}. {NO_ROOT_ADVICE}")
    release = link.run("uname -r").out.strip()
    built_for = info.get("vermagic", "").split(" ")[0]
    if not built_for:
        raise DeployError(f"{ko}: no vermagic in .modinfo; is this a kernel module?")
    if built_for != release:
        raise DeployError(
            f"vermagic mismatch: {ko.name} was built for kernel '{built_for}' but "
            f"{link.serial} runs '{release}'. Rebuild it against this phone's kernel source "
            "(same release string and .config: the vendor's kernel tree for this build)"
        )
    session = link.open_session(as_root=True)
    try:
        io = AdbShellSysfs(session, access)
        if target is None:
            gpus = find_gpu_devfreq(io)
            if not gpus:
                raise DeployError(
                    f"{link.serial} has no GPU devfreq device under /sys/class/devfreq; "
                    "name one with --target"
                )
            target = posixpath.basename(gpus[0])
        remote = f"{REMOTE_DIR}/{ko.name}"
        report = DeployReport(link.serial, target, remote)
        link.push(ko, remote)
        report.steps.append(f"pushed {ko} ({len(blob)} bytes) to {remote}")
        r = session.run(f"insmod {shlex.quote(remote)} target={shlex.quote(target)}")
        if not r.ok and "File exists" in r.out:
            report.steps.append("turboinfer was already loaded (rmmod turboinfer to reload it)")
        elif not r.ok:
            raise DeployError(
                _explain(
                    r.out.strip(),
                    session.run("dmesg").out,
                    session.run("getenforce").out.strip(),
                    target,
                )
            )
        else:
            report.steps.append(f"insmod {remote} target={target}")
        if not session.run(f"[ -e {DEVICE_NODE} ]").ok:
            raise DeployError(
                f"insmod succeeded but {DEVICE_NODE} is missing; check `adb shell dmesg` "
                "(ueventd may lack a rule for the misc device)"
            )
        report.steps.append(f"{DEVICE_NODE} is present")
        return report
    finally:
        session.close()


def _explain(err: str, dmesg: str, selinux: str, target: str) -> str:
    """Turn insmod's one-line error and the kernel log into the cause and the fix."""
    log = [ln for ln in dmesg.splitlines() if "turboinfer" in ln or "avc:" in ln][-5:]
    evidence = ("; kernel log: " + " | ".join(ln.strip() for ln in log)) if log else ""
    if (
        "Exec format error" in err
        or "Invalid module format" in err
        or any("version magic" in ln or "disagrees about version" in ln for ln in log)
    ):
        return (
            f"vermagic/symbol mismatch: the kernel refused the module ({err}). Rebuild "
            f"turboinfer.ko against this phone's exact kernel tree{evidence}"
        )
    if "Permission denied" in err:
        if selinux == "Enforcing" or any("avc:" in ln for ln in log):
            return (
                f"SELinux ({selinux or 'unknown'}) denied module_load ({err}). Allow it for "
                "the su domain (Magisk: `magiskpolicy --live 'allow su * system "
                "module_load'`) or, for a test only, `adb shell su -c setenforce 0`"
                f"{evidence}"
            )
        return f"permission denied loading the module ({err}){evidence}"
    if "Operation not permitted" in err:
        return (
            f"the kernel refused module loading ({err}): no CAP_SYS_MODULE, or "
            f"/proc/sys/kernel/modules_disabled is 1{evidence}"
        )
    if "Key was rejected" in err or "Required key not available" in err:
        return (
            f"module signature rejected ({err}): this kernel only loads modules signed "
            f"with its build key{evidence}"
        )
    if "No such device" in err:
        return f"no devfreq device matches target={target!r} ({err}); pass --target{evidence}"
    return f"insmod failed: {err}{evidence}"
