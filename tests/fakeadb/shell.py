"""The fake phone's shell: runs parsed commands against a ``FakePhone``.

Messages and exit codes copy what Android's mksh and toybox print, because our adb
code parses them (``Permission denied``, ``inaccessible or not found``, insmod errors).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .phone import FakeOSError, FakePhone
from .shell_parse import (
    AndOrList,
    Command,
    If,
    Incomplete,
    ParseError,
    Redir,
    Simple,
    While,
    Word,
    parse,
)

Writer = Callable[[bytes], None]
SH = "/system/bin/sh"


class ShellExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Stdin:
    """Bytes arriving from the adb client (shell v2 stdin packets), read as lines."""

    def __init__(self) -> None:
        self._q: queue.Queue[bytes | None] = queue.Queue()
        self._buf = b""
        self._eof = False

    def feed(self, data: bytes) -> None:
        self._q.put(data)

    def close(self) -> None:
        self._q.put(None)

    def readline(self) -> str | None:
        while b"\n" not in self._buf and not self._eof:
            chunk = self._q.get()
            if chunk is None:
                self._eof = True
            else:
                self._buf += chunk
        if b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            return line.decode() + "\n"
        if self._buf:
            line, self._buf = self._buf, b""
            return line.decode()
        return None


@dataclass
class Job:
    pid: int
    stop: threading.Event
    thread: threading.Thread


@dataclass
class Shell:
    phone: FakePhone
    uid: int
    stdin: Stdin
    out: Writer
    err: Writer
    stop: threading.Event
    vars: dict[str, str] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    last_rc: int = 0
    last_bg: int = 0
    _next_pid: int = 4000

    # -- entry points ----------------------------------------------------------------
    def run_text(self, text: str) -> int:
        try:
            return self._run_list(parse(text), self._fds())
        except (Incomplete, ParseError) as e:
            self.err(f"{SH}: syntax error: {e or 'unexpected end of input'}\n".encode())
            return 2
        except ShellExit as e:
            return e.code

    def interactive(self) -> int:
        """Read commands from stdin until EOF or ``exit``."""
        pending = ""
        while not self.stop.is_set():
            line = self.stdin.readline()
            if line is None:
                break
            pending += line
            try:
                tree = parse(pending)
            except Incomplete:
                continue
            except ParseError as e:
                self.err(f"{SH}: syntax error: {e}\n".encode())
                pending = ""
                self.last_rc = 2
                continue
            pending = ""
            try:
                self._run_list(tree, self._fds())
            except ShellExit as e:
                return e.code
        return self.last_rc

    def child(self, uid: int) -> Shell:
        return Shell(self.phone, uid, self.stdin, self.out, self.err, self.stop, dict(self.vars))

    # -- execution -------------------------------------------------------------------
    def _fds(self) -> dict[int, Writer]:
        return {1: self.out, 2: self.err}

    def _run_list(self, lst: AndOrList, fds: dict[int, Writer]) -> int:
        for joiner, cmd, background in lst.items:
            if self.stop.is_set():
                raise ShellExit(130)
            if joiner == "&&" and self.last_rc != 0:
                continue
            if joiner == "||" and self.last_rc == 0:
                continue
            if background:
                self._spawn(cmd, fds)
                self.last_rc = 0
            else:
                self.last_rc = self._run_cmd(cmd, fds)
        return self.last_rc

    def _spawn(self, cmd: Command, fds: dict[int, Writer]) -> None:
        self._next_pid += 1
        pid = self._next_pid
        stop = threading.Event()
        sub = Shell(self.phone, self.uid, Stdin(), self.out, self.err, stop, dict(self.vars))
        sub.stdin.close()
        joined = _Either(stop, self.stop)
        sub.stop = joined  # type: ignore[assignment]
        t = threading.Thread(target=sub._run_cmd, args=(cmd, dict(fds)), daemon=True)
        self.jobs[pid] = Job(pid, stop, t)
        self.last_bg = pid
        t.start()

    def _run_cmd(self, cmd: Command, fds: dict[int, Writer]) -> int:
        fds = dict(fds)
        flush: list[Callable[[], None]] = []
        stdin_text: str | None = None
        for r in cmd.redirs:
            res = self._redirect(r, fds, flush)
            if isinstance(res, int):
                return res
            if res is not None:
                stdin_text = res
        try:
            if isinstance(cmd, While):
                rc = 0
                while not self.stop.is_set() and self._run_list(cmd.cond, fds) == 0:
                    rc = self._run_list(cmd.body, fds)
                    time.sleep(0)
                return 130 if self.stop.is_set() else rc
            if isinstance(cmd, If):
                if self._run_list(cmd.cond, fds) == 0:
                    return self._run_list(cmd.then, fds)
                return self._run_list(cmd.orelse, fds) if cmd.orelse else 0
            return self._simple(cmd, fds, stdin_text)
        finally:
            for f in flush:
                f()

    def _redirect(
        self, r: Redir, fds: dict[int, Writer], flush: list[Callable[[], None]]
    ) -> int | str | None:
        if r.op == ">&":
            assert isinstance(r.target, int)
            fds[r.fd] = fds.get(r.target, self.out)
            return None
        assert not isinstance(r.target, int)
        path = self._expand(r.target)
        if r.op == "<":
            try:
                return self.phone.read(path, self.uid).decode()
            except FakeOSError as e:
                self.err(f"{SH}: can't open {path}: {e}\n".encode())
                return 1
        try:
            self.phone.check_writable(path, self.uid)
        except FakeOSError as e:
            self.err(f"{SH}: can't create {path}: {e}\n".encode())
            return 1
        buf = bytearray()
        if path == "/dev/null":
            fds[r.fd] = lambda b: None
            return None
        fds[r.fd] = buf.extend

        def done(path: str = path, append: bool = r.op == ">>") -> None:
            try:
                self.phone.write(path, bytes(buf), self.uid, append=append)
            except FakeOSError as e:
                self.err(f"{SH}: write error: {e}\n".encode())

        flush.append(done)
        return None

    def _expand(self, word: Word) -> str:
        out = ""
        for text, expand in word:
            out += self._expand_vars(text) if expand else text
        return out

    def _expand_vars(self, text: str) -> str:
        def var(m: re.Match[str]) -> str:
            if m.group(0) == "\\$":
                return "$"
            name = m.group(1) or m.group(2)
            special = {"?": str(self.last_rc), "!": str(self.last_bg), "$": "4000"}
            return special.get(name, self.vars.get(name, ""))

        return re.sub(r"\\\$|\$\{(\w+)\}|\$([?!$]|\w+)", var, text)

    def _simple(self, cmd: Simple, fds: dict[int, Writer], stdin_text: str | None) -> int:
        args = [self._expand(w) for w in cmd.words]
        while args and re.fullmatch(r"[A-Za-z_]\w*=.*", args[0]):
            name, value = args.pop(0).split("=", 1)
            self.vars[name] = value
        if not args:
            return 0
        self.phone.commands_run.append(" ".join(args))
        io = _IO(fds[1], fds[2], stdin_text)
        name = args[0]
        fn = getattr(self, "cmd_" + name.replace("[", "test").replace("-", "_"), None)
        if name == "exec":
            if len(args) == 1:
                self.out, self.err = fds[1], fds[2]
                return 0
            rc = self._simple(Simple([[(a, False)] for a in args[1:]]), fds, stdin_text)
            raise ShellExit(rc)
        if fn is None:
            io.err(f"{SH}: {name}: inaccessible or not found\n")
            return 127
        return int(fn(args[1:], io))

    # -- commands --------------------------------------------------------------------
    def cmd_true(self, a: list[str], io: _IO) -> int:
        return 0

    def cmd_false(self, a: list[str], io: _IO) -> int:
        return 1

    def cmd_exit(self, a: list[str], io: _IO) -> int:
        raise ShellExit(int(a[0]) if a else self.last_rc)

    def cmd_echo(self, a: list[str], io: _IO) -> int:
        newline = True
        if a and a[0] == "-n":
            newline, a = False, a[1:]
        io.out(" ".join(a) + ("\n" if newline else ""))
        return 0

    def cmd_printf(self, a: list[str], io: _IO) -> int:
        if not a:
            return 1
        fmt = a[0].replace("\\n", "\n").replace("\\t", "\t")
        args = list(a[1:])

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "%%":
                return "%"
            value = args.pop(0) if args else ""
            if m.group(1) == "d":
                return str(int(value or 0))
            return value

        io.out(re.sub(r"%%|%([sd])", sub, fmt))
        return 0

    def cmd_cat(self, a: list[str], io: _IO) -> int:
        rc = 0
        if not a and io.stdin is not None:
            io.out(io.stdin)
        for path in a:
            try:
                io.out_bytes(self.phone.read(path, self.uid))
            except FakeOSError as e:
                io.err(f"cat: {path}: {e}\n")
                rc = 1
        return rc

    def cmd_read(self, a: list[str], io: _IO) -> int:
        if io.stdin is None:
            line = self.stdin.readline()
        else:
            line = io.stdin.split("\n", 1)[0] + "\n" if io.stdin else None
        if line is None:
            return 1
        if a:
            self.vars[a[0]] = line.rstrip("\n")
        return 0

    def cmd_ls(self, a: list[str], io: _IO) -> int:
        paths = [p for p in a if not p.startswith("-")] or ["/data/local/tmp"]
        rc = 0
        for path in paths:
            try:
                names = self.phone.listdir(path, self.uid)
            except FakeOSError as e:
                io.err(f"ls: {path}: {e}\n")
                rc = 1
                continue
            io.out("".join(n + "\n" for n in names))
        return rc

    def cmd_test(self, a: list[str], io: _IO) -> int:
        if a and a[-1] == "]":
            a = a[:-1]
        if len(a) == 2 and a[0].startswith("-"):
            op, path = a
            if op == "-n":
                return 0 if path else 1
            if op == "-z":
                return 1 if path else 0
            exists = self.phone.exists(path)
            if op == "-e":
                return 0 if exists else 1
            if op == "-d":
                return 0 if self.phone.is_dir(path) else 1
            if op == "-f":
                return 0 if exists and not self.phone.is_dir(path) else 1
            if op == "-r":
                return 0 if exists and (self.uid == 0 or path not in self.phone.unreadable) else 1
            if op == "-w":
                try:
                    self.phone.check_writable(path, self.uid)
                except FakeOSError:
                    return 1
                return 0 if exists else 1
        if len(a) == 3 and a[1] in ("=", "!="):
            return 0 if (a[0] == a[2]) == (a[1] == "=") else 1
        if len(a) == 1:
            return 0 if a[0] else 1
        io.err(f"test: unsupported {a}\n")
        return 2

    def cmd_getprop(self, a: list[str], io: _IO) -> int:
        if a:
            io.out(self.phone.props.get(a[0], a[1] if len(a) > 1 else "") + "\n")
        else:
            io.out("".join(f"[{k}]: [{v}]\n" for k, v in sorted(self.phone.props.items())))
        return 0

    def cmd_id(self, a: list[str], io: _IO) -> int:
        if "-u" in a:
            io.out(f"{self.uid}\n")
        elif self.uid == 0:
            io.out("uid=0(root) gid=0(root) groups=0(root) context=u:r:su:s0\n")
        else:
            io.out("uid=2000(shell) gid=2000(shell) groups=2000(shell) context=u:r:shell:s0\n")
        return 0

    def cmd_uname(self, a: list[str], io: _IO) -> int:
        p = self.phone
        if "-r" in a:
            io.out(p.kernel_release + "\n")
        elif "-m" in a:
            io.out(p.machine + "\n")
        else:
            io.out(f"Linux localhost {p.kernel_release} {p.kernel_version} {p.machine}\n")
        return 0

    def cmd_getenforce(self, a: list[str], io: _IO) -> int:
        io.out(self.phone.selinux + "\n")
        return 0

    def cmd_su(self, a: list[str], io: _IO) -> int:
        if not self.phone.rooted and self.uid != 0:
            io.err(f"{SH}: su: inaccessible or not found\n")
            return 127
        root = self.child(0)
        root.out, root.err = io.out_bytes, io.err_bytes
        if a[:1] == ["-c"]:
            return root.run_text(" ".join(a[1:]))
        if a[:1] in (["0"], ["root"]):
            a = a[1:]
        if not a or a == ["sh"]:
            return root.interactive()
        return root._simple(Simple([[(x, False)] for x in a]), root._fds(), io.stdin)

    def cmd_sh(self, a: list[str], io: _IO) -> int:
        sub = self.child(self.uid)
        sub.out, sub.err = io.out_bytes, io.err_bytes
        if a[:1] == ["-c"]:
            return sub.run_text(" ".join(a[1:]))
        if a:
            try:
                return sub.run_text(self.phone.read(a[0], self.uid).decode())
            except FakeOSError as e:
                io.err(f"{SH}: {a[0]}: {e}\n")
                return 127
        return sub.interactive()

    def cmd_sleep(self, a: list[str], io: _IO) -> int:
        return 130 if self.stop.wait(float(a[0]) if a else 0) else 0

    def cmd_date(self, a: list[str], io: _IO) -> int:
        ns = self.phone.now_ns()
        if a and a[0].startswith("+"):
            io.out(
                a[0][1:].replace("%s", str(ns // 10**9)).replace("%N", f"{ns % 10**9:09d}") + "\n"
            )
        else:
            io.out(time.strftime("%a %b %d %H:%M:%S UTC %Y\n", time.gmtime(ns / 1e9)))
        return 0

    def cmd_yes(self, a: list[str], io: _IO) -> int:
        """Busy CPU work: each running ``yes`` adds one load job to the battery model."""
        with self.phone.lock:
            self.phone.load_jobs += 1
        try:
            while not self.stop.wait(0.005):
                io.out("y\n")
        finally:
            with self.phone.lock:
                self.phone.load_jobs -= 1
        return 143

    def cmd_kill(self, a: list[str], io: _IO) -> int:
        rc = 0
        for arg in (x for x in a if not x.startswith("-")):
            job = self.jobs.pop(int(arg.lstrip("%")), None)
            if job is None:
                io.err(f"kill: {arg}: No such process\n")
                rc = 1
                continue
            job.stop.set()
            job.thread.join(2)
        return rc

    def cmd_wait(self, a: list[str], io: _IO) -> int:
        for job in list(self.jobs.values()):
            job.thread.join()
        return 0

    def cmd_mkdir(self, a: list[str], io: _IO) -> int:
        for path in (x for x in a if not x.startswith("-")):
            if not self.phone.may_write(path, self.uid):
                io.err(f"mkdir: {path}: Permission denied\n")
                return 1
            self.phone.host_path(path).mkdir(parents=True, exist_ok=True)
        return 0

    def cmd_rm(self, a: list[str], io: _IO) -> int:
        for path in (x for x in a if not x.startswith("-")):
            if self.phone.may_write(path, self.uid):
                self.phone.host_path(path).unlink(missing_ok=True)
        return 0

    def cmd_chmod(self, a: list[str], io: _IO) -> int:
        return 0

    def cmd_dmesg(self, a: list[str], io: _IO) -> int:
        if self.uid != 0:
            io.err("dmesg: klogctl: Permission denied\n")
            return 1
        io.out("".join(f"[  123.456789] {line}\n" for line in self.phone.dmesg))
        return 0

    def cmd_insmod(self, a: list[str], io: _IO) -> int:
        if not a:
            io.err("usage: insmod MODULE [MODULE_OPTIONS]\n")
            return 1
        code = self.phone.insmod(a[0], a[1:], self.uid)
        if code:
            io.err(f"insmod: failed to load {a[0]}: {os.strerror(code)}\n")
            return 1
        return 0

    def cmd_rmmod(self, a: list[str], io: _IO) -> int:
        code = self.phone.rmmod(a[0] if a else "", self.uid)
        if code:
            io.err(f"rmmod: delete_module '{a[0] if a else ''}' failed: {os.strerror(code)}\n")
            return 1
        return 0

    def cmd_lsmod(self, a: list[str], io: _IO) -> int:
        lines = ["Module                  Size  Used by"]
        lines += [f"{name:<22} 16384  0" for name in self.phone.modules]
        io.out("\n".join(lines) + "\n")
        return 0

    def cmd_dumpsys(self, a: list[str], io: _IO) -> int:
        b = self.phone.battery
        if a[:1] != ["battery"] or b is None:
            io.err(f"Can't find service: {a[0] if a else ''}\n")
            return 0
        status = 2 if b.charging else 3
        io.out(
            "Current Battery Service state:\n"
            f"  AC powered: false\n  USB powered: {str(b.charging).lower()}\n"
            "  Wireless powered: false\n  Max charging current: 500000\n"
            f"  status: {status}\n  health: 2\n  present: true\n  level: {b.level}\n"
            f"  scale: 100\n  voltage: {round(b.voltage_mv)}\n  temperature: 290\n"
            "  technology: Li-ion\n"
        )
        return 0


setattr(Shell, "cmd_:", Shell.cmd_true)


class _Either:
    """An Event-like view that is set when either of two events is set."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.a.is_set() or self.b.is_set()

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.a.wait(min(left, 0.02))
        return True

    def set(self) -> None:
        self.a.set()


class _IO:
    def __init__(self, out: Writer, err: Writer, stdin: str | None) -> None:
        self.out_bytes, self.err_bytes, self.stdin = out, err, stdin

    def out(self, text: str) -> None:
        self.out_bytes(text.encode())

    def err(self, text: str) -> None:
        self.err_bytes(text.encode())


__all__ = ["Shell", "ShellExit", "Stdin"]
