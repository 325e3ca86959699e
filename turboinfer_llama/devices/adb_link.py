"""The host's line to one phone: adbutils for the adb host protocol, plus a persistent
shell session so that many sysfs reads and writes cost one round-trip each and no
process start (``adb shell`` per write costs a host process and a new adbd service).

Every adb or socket failure is turned into our ``DeviceError`` hierarchy here, with a
timeout on every wait, so a pulled cable or a dead adb server gives ``DeviceGone``
instead of a hang.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._clock import now_ns
from .adb_settings import AdbSettings
from .base import DeviceError, DeviceGone, DeviceNotFound, PermissionDenied

if TYPE_CHECKING:
    import adbutils

log = logging.getLogger(__name__)

# Shell v2 packet ids (system/core/adb/shell_protocol.h).
STDIN, STDOUT, STDERR, EXIT, CLOSE_STDIN = 0, 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class ShellResult:
    rc: int
    out: str  # stdout and stderr together, in order (the session merges them)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True, slots=True)
class RootAccess:
    """How (and whether) we get uid 0. ``session_command`` starts a root shell reading
    stdin; None means no root."""

    kind: str  # "adbd" | "su" | "none"
    session_command: str | None
    detail: str

    @property
    def rooted(self) -> bool:
        return self.kind != "none"


NO_ROOT_ADVICE = (
    "Without root you can read most GPU and battery nodes, but setting the GPU clock and "
    "loading a kernel module need root: root the phone (e.g. Magisk) and allow su for "
    "the shell, or use a userdebug build and run `adb root`."
)


def _adb_errors(serial: str, action: str, e: BaseException) -> DeviceError:
    """Map adbutils/socket failures onto our hierarchy."""
    from adbutils import AdbError, AdbTimeout

    if isinstance(e, AdbTimeout | TimeoutError | socket.timeout):
        return DeviceGone(f"{serial}: no answer while {action} (timed out); is the cable in?")
    if isinstance(e, AdbError) and "not found" in str(e):
        return DeviceNotFound(f"{serial}: {e}; check `adb devices`")
    if isinstance(e, OSError | EOFError | AdbError):
        return DeviceGone(f"{serial}: adb connection lost while {action} ({e or type(e).__name__})")
    return DeviceError(f"{serial}: {action} failed: {e}")


class ShellSession:
    """One interactive ``sh`` (or root shell) on the phone over shell protocol v2.

    Each call sends ``<cmd>`` then a printf of a unique marker with ``$?``, and reads
    stdout up to the marker. ``exec 2>&1`` at start keeps error text in order with the
    output. Calls are serialised by a lock; after any transport failure the session is
    dead and every later call raises ``DeviceGone`` at once.
    """

    def __init__(self, link: AdbLink, command: str = "", timeout_s: float | None = None) -> None:
        self.link = link
        self.serial = link.serial
        self.timeout_s = timeout_s or link.settings.timeout_s
        self._lock = threading.Lock()
        self._buf = b""
        self._n = 0
        self._dead: str | None = None
        self._conn: Any = link.open_service(f"shell,v2,raw:{command}", self.timeout_s)
        # Small request/answer packets: without this, Nagle + delayed ACK add ~40 ms.
        self._conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.run("exec 2>&1")

    @property
    def commands(self) -> int:
        """Commands run so far (each one round-trip)."""
        return self._n

    @property
    def alive(self) -> bool:
        return self._dead is None

    def run(self, cmd: str) -> ShellResult:
        with self._lock:
            if self._dead is not None:
                raise DeviceGone(self._dead)
            self._n += 1
            marker = f"__ti_{self._n}__"
            try:
                self._send(STDIN, f"{cmd}\nprintf '\\n{marker} %d\\n' $?\n".encode())
                out, rc = self._read_until(marker.encode())
            except (DeviceError, OSError, EOFError) as e:
                self._dead = (
                    str(e)
                    if isinstance(e, DeviceGone)
                    else (f"{self.serial}: adb shell session lost ({e})")
                )
                self._close_conn()
                raise DeviceGone(self._dead) from e
            return ShellResult(rc, out.decode("utf-8", "replace"))

    def round_trip_ns(self) -> int:
        """Time of one no-op command round-trip, in ns."""
        t0 = now_ns()
        self.run(":")
        return now_ns() - t0

    def close(self) -> None:
        with self._lock:
            if self._dead is None:
                with contextlib.suppress(OSError):
                    self._send(CLOSE_STDIN, b"")
                self._dead = f"{self.serial}: shell session closed"
            self._close_conn()

    # -- framing ---------------------------------------------------------------------
    def _send(self, kind: int, data: bytes) -> None:
        self._conn.conn.sendall(bytes([kind]) + struct.pack("<I", len(data)) + data)

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self._conn.conn.recv(n - len(buf))
            except TimeoutError as e:
                raise DeviceGone(
                    f"{self.serial}: no answer from the phone within {self.timeout_s:g} s; "
                    "is the cable in and the screen unlocked?"
                ) from e
            if not chunk:
                raise DeviceGone(
                    f"{self.serial}: adb connection closed (phone unplugged or adb server stopped)"
                )
            buf += chunk
        return buf

    def _read_until(self, marker: bytes) -> tuple[bytes, int]:
        needle = b"\n" + marker + b" "
        while True:
            at = self._buf.find(needle)
            if at >= 0:
                end = self._buf.find(b"\n", at + len(needle))
                if end >= 0:
                    rc = int(self._buf[at + len(needle) : end])
                    out, self._buf = self._buf[:at], self._buf[end + 1 :]
                    return out, rc
            head = self._recv_exact(5)
            data = self._recv_exact(struct.unpack("<I", head[1:])[0])
            if head[0] in (STDOUT, STDERR):
                self._buf += data
            elif head[0] == EXIT:
                code = data[0] if data else -1
                raise DeviceGone(f"{self.serial}: the shell on the phone exited (status {code})")

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()


class AdbLink:
    """adbutils client bound to one phone; the server address comes from AdbSettings."""

    def __init__(self, serial: str | None = None, settings: AdbSettings | None = None) -> None:
        self.settings = settings or AdbSettings()
        self.host, self.port = self.settings.server_address()
        self._check_server()
        import adbutils

        self.client = adbutils.AdbClient(
            host=self.host, port=self.port, socket_timeout=self.settings.timeout_s
        )
        self.serial = self._pick(serial)
        self.device: adbutils.AdbDevice = self.client.device(self.serial)
        self._root: RootAccess | None = None

    # -- connection ------------------------------------------------------------------
    def _check_server(self) -> None:
        """adbutils would try to spawn an adb server when none answers; we say so
        instead, so tests never start a real adb and a user sees the exact fix."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0):
                pass
        except OSError as e:
            raise DeviceGone(
                f"no adb server at {self.host}:{self.port} ({e.strerror or e}); start it "
                "with `adb start-server` (or set TURBOINFER_ADB_SERVER=host:port)"
            ) from e

    def _pick(self, serial: str | None) -> str:
        try:
            infos = self.client.list()
        except Exception as e:
            raise _adb_errors(f"adb server {self.host}:{self.port}", "listing devices", e) from e
        ready = [i.serial for i in infos if i.state == "device"]
        others = {i.serial: i.state for i in infos if i.state != "device"}
        if serial:
            if serial in ready:
                return serial
            if serial in others:
                raise PermissionDenied(
                    f"phone {serial} is '{others[serial]}': unlock it and accept the USB "
                    "debugging prompt"
                    if others[serial] == "unauthorized"
                    else f"phone {serial} is '{others[serial]}', not ready"
                )
            raise DeviceNotFound(
                f"no phone {serial!r} on adb at {self.host}:{self.port} "
                f"(connected: {', '.join(ready) or 'none'})"
            )
        if not ready:
            extra = f" ({', '.join(f'{s}: {st}' for s, st in others.items())})" if others else ""
            raise DeviceNotFound(
                f"no phone connected to adb at {self.host}:{self.port}{extra}: plug it in, "
                "enable USB debugging and check `adb devices`"
            )
        if len(ready) > 1:
            raise DeviceNotFound(
                f"several phones connected ({', '.join(ready)}): pick one with adb:SERIAL "
                "or --serial"
            )
        return ready[0]

    def open_service(self, service: str, timeout_s: float) -> Any:
        """An adbutils connection switched to ``service`` on this phone."""
        self._check_server()
        try:
            conn = self.device.open_transport(timeout=timeout_s)
            conn.send_command(service)
            conn.check_okay()
        except Exception as e:
            raise _adb_errors(self.serial, f"opening {service.split(':')[0]}", e) from e
        return conn

    # -- one-shot commands -----------------------------------------------------------
    def run(self, cmd: str, timeout_s: float | None = None) -> ShellResult:
        """One command in a fresh shell (for probing; control uses a ShellSession)."""
        self._check_server()
        try:
            r = self.device.shell2(cmd, timeout=timeout_s or self.settings.timeout_s, v2=True)
        except Exception as e:
            raise _adb_errors(self.serial, f"running {cmd.split()[0]!r}", e) from e
        return ShellResult(r.returncode, r.output)

    def push(self, data: bytes | Path, remote: str) -> int:
        self._check_server()
        try:
            src = io.BytesIO(data) if isinstance(data, bytes) else Path(data)
            return int(self.device.sync.push(src, remote, mode=0o644))
        except Exception as e:
            raise _adb_errors(self.serial, f"pushing to {remote}", e) from e

    def getprop(self, name: str) -> str:
        return self.run(f"getprop {name}").out.strip()

    # -- root ------------------------------------------------------------------------
    def root_access(self) -> RootAccess:
        """adbd running as root, or a working ``su`` (Magisk ``su -c`` or AOSP ``su 0``)."""
        if self._root is not None:
            return self._root
        if self.run("id -u").out.strip() == "0":
            self._root = RootAccess("adbd", "", "adbd runs as root (adb root)")
            return self._root
        magisk = self.run("su -c id -u")
        if magisk.ok and magisk.out.strip().endswith("0"):
            self._root = RootAccess("su", "su", "su -c works (Magisk/SuperSU style)")
            return self._root
        aosp = self.run("su 0 id -u")
        if aosp.ok and aosp.out.strip().endswith("0"):
            self._root = RootAccess("su", "su 0 sh", "su 0 works (userdebug su)")
            return self._root
        text = (magisk.out or aosp.out).strip()
        if "not found" in text or magisk.rc == 127:
            why = "no su binary: the phone is not rooted"
        elif "denied" in text.lower():
            why = f"su refused ({text}): allow root for the shell in the su manager"
        else:
            why = f"su failed ({text or f'exit {magisk.rc}'})"
        self._root = RootAccess("none", None, why)
        return self._root

    def open_session(self, as_root: bool = True) -> ShellSession:
        """The persistent shell: as root when the phone allows it."""
        root = self.root_access()
        command = root.session_command if as_root and root.session_command is not None else ""
        return ShellSession(self, command)
