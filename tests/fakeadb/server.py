"""A fake adb server on a loopback port, speaking the real ADB host protocol.

Requests are 4 hex digits of length then the service name; replies start with
``OKAY`` or ``FAIL`` + a length-prefixed message. After ``host:transport:<serial>`` /
``host:tport:serial:<serial>`` the same socket carries one device service:

* ``shell:<cmd>`` (v1: raw output, then close) and ``shell,v2[,raw]:<cmd>`` (v2 framing:
  id byte + little-endian u32 length; 0 stdin, 1 stdout, 2 stderr, 3 exit, 4 close
  stdin, 5 window size). An empty command is an interactive shell reading stdin.
* ``sync:`` with STAT, LIST, SEND (DATA... DONE), RECV and QUIT.

Only the phone is fake: clients (adbutils) talk to this exactly as to adb.
"""

from __future__ import annotations

import socket
import stat
import struct
import threading
from contextlib import suppress

from .phone import FakeOSError, FakePhone
from .shell import Shell, Stdin

ADB_SERVER_VERSION = 41
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,apex,abb,fixed_push_symlink_timestamp"


class _Closed(Exception):
    """The client went away."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError as e:
            raise _Closed from e
        if not chunk:
            raise _Closed
        buf += chunk
    return buf


def _block(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):04x}".encode() + data


class FakeAdbServer:
    """Serve ``phones`` on 127.0.0.1:``port`` (0 picks a free port)."""

    def __init__(self, phones: list[FakePhone], host: str = "127.0.0.1", port: int = 0) -> None:
        self.phones = {p.serial: p for p in phones}
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self._clients: set[socket.socket] = set()
        self._stops: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.services: list[str] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> FakeAdbServer:
        self._running.set()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Kill the server: close the listener and drop every client connection."""
        self._running.clear()
        with suppress(OSError):
            self._listener.close()
        with self._lock:
            for ev in self._stops:
                ev.set()
            for s in self._clients:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with suppress(OSError):
                    s.close()
            self._clients.clear()
        if self._thread.is_alive():
            self._thread.join(2)

    def __enter__(self) -> FakeAdbServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connection handling ---------------------------------------------------------
    def _accept_loop(self) -> None:
        while self._running.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as adb does
            with self._lock:
                self._clients.add(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._handle(sock)
        except _Closed:
            pass
        finally:
            with self._lock:
                self._clients.discard(sock)
            with suppress(OSError):
                sock.close()

    def _read_request(self, sock: socket.socket) -> str:
        n = int(_recv_exact(sock, 4), 16)
        req = _recv_exact(sock, n).decode()
        self.services.append(req)
        return req

    @staticmethod
    def _fail(sock: socket.socket, msg: str) -> None:
        sock.sendall(b"FAIL" + _block(msg))

    def _find(self, serial: str | None) -> FakePhone | str:
        if serial is None:
            if len(self.phones) == 1:
                return next(iter(self.phones.values()))
            return "more than one device/emulator" if self.phones else "no devices/emulators found"
        return self.phones.get(serial) or f"device '{serial}' not found"

    def _handle(self, sock: socket.socket) -> None:
        req = self._read_request(sock)
        if req == "host:version":
            sock.sendall(b"OKAY" + _block(f"{ADB_SERVER_VERSION:04x}"))
        elif req == "host:kill":
            sock.sendall(b"OKAY")
            threading.Thread(target=self.stop, daemon=True).start()
        elif req in ("host:devices", "host:devices-l"):
            lines = []
            for i, p in enumerate(self.phones.values(), 1):
                line = f"{p.serial}\tdevice"
                if req.endswith("-l"):
                    line = (
                        f"{p.serial:<22} device usb:1-1 "
                        f"product:{p.props.get('ro.product.name', 'x')} "
                        f"model:{p.props.get('ro.product.model', 'x').replace(' ', '_')} "
                        f"device:{p.props.get('ro.product.device', 'x')} transport_id:{i}"
                    )
                lines.append(line + "\n")
            sock.sendall(b"OKAY" + _block("".join(lines)))
        elif req.startswith("host-serial:") or req == "host:features":
            self._host_serial(sock, req)
        elif req.startswith(("host:transport", "host:tport:")):
            phone = self._transport(sock, req)
            if phone is not None:
                self._device_service(sock, phone, self._read_request(sock))
        else:
            self._fail(sock, f"unknown host service '{req}'")

    def _host_serial(self, sock: socket.socket, req: str) -> None:
        serial, cmd = None, "features"
        if req.startswith("host-serial:"):
            rest = req[len("host-serial:") :]
            match = [s for s in self.phones if rest.startswith(s + ":")]
            if not match:
                self._fail(sock, f"device '{rest.rsplit(':', 1)[0]}' not found")
                return
            serial, cmd = match[0], rest[len(match[0]) + 1 :]
        found = self._find(serial)
        if isinstance(found, str):
            self._fail(sock, found)
            return
        answers = {
            "features": FEATURES,
            "get-state": "device",
            "get-serialno": found.serial,
            "get-devpath": "usb:1-1",
        }
        if cmd not in answers:
            self._fail(sock, f"unknown host service '{cmd}'")
            return
        sock.sendall(b"OKAY" + _block(answers[cmd]))

    def _transport(self, sock: socket.socket, req: str) -> FakePhone | None:
        serial: str | None = None
        if req.startswith("host:transport:"):
            serial = req[len("host:transport:") :]
        elif req.startswith("host:tport:serial:"):
            serial = req[len("host:tport:serial:") :]
        elif req not in ("host:transport-any", "host:transport-usb", "host:tport:any"):
            self._fail(sock, f"unsupported transport request '{req}'")
            return None
        found = self._find(serial)
        if isinstance(found, str):
            self._fail(sock, found)
            return None
        reply = b"OKAY"
        if req.startswith("host:tport:"):
            reply += struct.pack("<Q", list(self.phones).index(found.serial) + 1)
        sock.sendall(reply)
        return found

    def _device_service(self, sock: socket.socket, phone: FakePhone, req: str) -> None:
        if req.startswith("shell"):
            head, _, command = req.partition(":")
            opts = head.split(",")[1:]
            sock.sendall(b"OKAY")
            self._shell(sock, phone, command, v2="v2" in opts)
        elif req == "sync:":
            sock.sendall(b"OKAY")
            self._sync(sock, phone)
        else:
            self._fail(sock, f"unknown device service '{req}'")

    # -- shell -----------------------------------------------------------------------
    def _shell(self, sock: socket.socket, phone: FakePhone, command: str, v2: bool) -> None:
        stop = threading.Event()
        with self._lock:
            self._stops.add(stop)
        stdin = Stdin()
        send_lock = threading.Lock()

        def send(kind: int, data: bytes) -> None:
            if not data:
                return
            frame = bytes([kind]) + struct.pack("<I", len(data)) + data if v2 else data
            try:
                with send_lock:
                    sock.sendall(frame)
            except OSError:
                stop.set()

        uid = 0 if phone.adbd_root else 2000
        shell = Shell(phone, uid, stdin, lambda b: send(1, b), lambda b: send(2, b), stop)

        def run() -> None:
            rc = shell.run_text(command) if command.strip() else shell.interactive()
            if v2:
                send(3, bytes([rc & 0xFF]))
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            while runner.is_alive():
                if v2:
                    head = _recv_exact(sock, 5)
                    data = _recv_exact(sock, struct.unpack("<I", head[1:])[0])
                    if head[0] == 0:
                        stdin.feed(data)
                    elif head[0] == 4:
                        stdin.close()
                else:
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise _Closed
                    stdin.feed(chunk)
        except (_Closed, OSError):
            pass
        finally:
            stop.set()
            stdin.close()
            runner.join(5)
            with self._lock:
                self._stops.discard(stop)

    # -- sync ------------------------------------------------------------------------
    def _sync(self, sock: socket.socket, phone: FakePhone) -> None:
        uid = 0 if phone.adbd_root else 2000
        while True:
            head = _recv_exact(sock, 8)
            cmd, n = head[:4].decode(), struct.unpack("<I", head[4:])[0]
            arg = _recv_exact(sock, n).decode()
            if cmd == "STAT":
                p = phone.host_path(arg)
                if p.exists():
                    st = p.stat()
                    mode = stat.S_IFDIR | 0o755 if p.is_dir() else stat.S_IFREG | 0o644
                    sock.sendall(b"STAT" + struct.pack("<III", mode, st.st_size, int(st.st_mtime)))
                else:
                    sock.sendall(b"STAT" + struct.pack("<III", 0, 0, 0))
            elif cmd == "LIST":
                p = phone.host_path(arg)
                for child in sorted(p.iterdir()) if p.is_dir() else []:
                    st = child.stat()
                    mode = stat.S_IFDIR | 0o755 if child.is_dir() else stat.S_IFREG | 0o644
                    name = child.name.encode()
                    sock.sendall(
                        b"DENT"
                        + struct.pack("<IIII", mode, st.st_size, int(st.st_mtime), len(name))
                        + name
                    )
                sock.sendall(b"DONE" + bytes(16))
            elif cmd == "SEND":
                self._sync_send(sock, phone, uid, arg.rsplit(",", 1)[0])
            elif cmd == "RECV":
                try:
                    data = phone.read(arg, uid)
                except FakeOSError as e:
                    msg = str(e).encode()
                    sock.sendall(b"FAIL" + struct.pack("<I", len(msg)) + msg)
                    continue
                for i in range(0, len(data), 65536):
                    chunk = data[i : i + 65536]
                    sock.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
                sock.sendall(b"DONE" + bytes(4))
            else:  # QUIT or anything unknown ends the sync session
                return

    def _sync_send(self, sock: socket.socket, phone: FakePhone, uid: int, path: str) -> None:
        data = bytearray()
        while True:
            head = _recv_exact(sock, 8)
            kind, n = head[:4], struct.unpack("<I", head[4:])[0]
            if kind == b"DATA":
                data += _recv_exact(sock, n)
            elif kind == b"DONE":
                break
            else:
                self._sync_fail(sock, f"unexpected sync packet {kind!r}")
                return
        try:
            phone.write(path, bytes(data), uid)
        except FakeOSError as e:
            self._sync_fail(sock, f"couldn't create file: {e}")
            return
        sock.sendall(b"OKAY" + bytes(4))

    @staticmethod
    def _sync_fail(sock: socket.socket, msg: str) -> None:
        raw = msg.encode()
        sock.sendall(b"FAIL" + struct.pack("<I", len(raw)) + raw)
