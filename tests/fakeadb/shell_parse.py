"""Lexer and parser for the fake phone's shell: the subset of mksh our adb code sends.

Supported: words with '...', "..." and backslash quoting; ``$VAR``, ``$?``, ``$!``
expansion (at run time); ``;`` ``&&`` ``||`` ``&`` and newlines; redirections ``>``,
``>>``, ``<``, ``N>``, ``N>&M``; ``while LIST; do LIST; done`` and
``if LIST; then LIST; [else LIST;] fi``. Anything else is a parse error, so a command
the fake does not understand fails loudly instead of being silently mis-run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class Incomplete(Exception):
    """The text ends inside a quote or compound command: read more input."""


class ParseError(Exception):
    """Syntax the fake shell does not support."""


# A word is a list of (text, expand) segments; expand=False for single-quoted text.
Word = list[tuple[str, bool]]


@dataclass
class Redir:
    fd: int
    op: str  # '>', '>>', '<', '>&'
    target: Word | int


@dataclass
class Simple:
    words: list[Word]
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class While:
    cond: AndOrList
    body: AndOrList
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class If:
    cond: AndOrList
    then: AndOrList
    orelse: AndOrList | None
    redirs: list[Redir] = field(default_factory=list)


Command = Simple | While | If


@dataclass
class AndOrList:
    """Commands joined by the operator that *precedes* each (first one: ';')."""

    items: list[tuple[str, Command, bool]]  # (joiner, command, background)


_OPS = ("&&", "||", ";;", ";", "&", "|", "\n")
_KEYWORDS = {"while", "do", "done", "if", "then", "else", "fi"}


def tokenize(text: str) -> list[tuple[str, object]]:
    toks: list[tuple[str, object]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c == "#" and (not toks or toks[-1][0] == "op"):
            while i < n and text[i] != "\n":
                i += 1
            continue
        op = next((o for o in _OPS if text.startswith(o, i)), None)
        if op is not None:
            if op in ("|", ";;"):
                raise ParseError(f"fake shell does not support {op!r}")
            toks.append(("op", op))
            i += len(op)
            continue
        j = i
        while j < n and text[j].isdigit():
            j += 1
        if c in "<>" or (j > i and j < n and text[j] in "<>"):
            fd = int(text[i:j]) if j > i else (0 if text[j] == "<" else 1)
            i = j
            if text.startswith(">>", i):
                op, i = ">>", i + 2
            elif text.startswith(">&", i):
                op, i = ">&", i + 2
            else:
                op, i = text[i], i + 1
            toks.append(("redir", (fd, op)))
            continue
        word, i = _read_word(text, i)
        toks.append(("word", word))
    return toks


def _read_word(text: str, i: int) -> tuple[Word, int]:
    segs: Word = []
    n = len(text)
    buf = ""
    while i < n and text[i] not in " \t\n;&|<>":
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise Incomplete
            if buf:
                segs.append((buf, True))
                buf = ""
            segs.append((text[i + 1 : end], False))
            i = end + 1
        elif c == '"':
            j, dq = i + 1, ""
            while True:
                if j >= n:
                    raise Incomplete
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`':
                    dq += "\\" + text[j + 1] if text[j + 1] == "$" else text[j + 1]
                    j += 2
                    continue
                if text[j] == '"':
                    break
                dq += text[j]
                j += 1
            if buf:
                segs.append((buf, True))
                buf = ""
            segs.append((dq, True))
            i = j + 1
        elif c == "\\":
            if i + 1 >= n:
                raise Incomplete
            if buf:
                segs.append((buf, True))
                buf = ""
            segs.append((text[i + 1], False))
            i += 2
        else:
            buf += c
            i += 1
    if buf:
        segs.append((buf, True))
    return segs, i


def literal(word: Word) -> str | None:
    """The word's text if it is a plain unquoted word (used to spot keywords)."""
    if len(word) == 1 and word[0][1]:
        return word[0][0]
    return None


class Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.pos = 0

    def parse(self) -> AndOrList:
        lst = self._list(stop=set())
        if self.pos < len(self.toks):
            raise ParseError(f"unexpected {self.toks[self.pos][1]!r}")
        return lst

    def _peek_kw(self) -> str | None:
        if self.pos < len(self.toks) and self.toks[self.pos][0] == "word":
            kw = literal(self.toks[self.pos][1])  # type: ignore[arg-type]
            if kw in _KEYWORDS:
                return kw
        return None

    def _skip_separators(self) -> None:
        while self.pos < len(self.toks) and self.toks[self.pos] in (("op", ";"), ("op", "\n")):
            self.pos += 1

    def _list(self, stop: set[str]) -> AndOrList:
        items: list[tuple[str, Command, bool]] = []
        joiner = ";"
        while True:
            if joiner == ";":
                self._skip_separators()
            if self.pos >= len(self.toks):
                if stop:
                    raise Incomplete
                break
            kw = self._peek_kw()
            if kw in stop:
                break
            cmd = self._command()
            background = False
            if self.pos < len(self.toks) and self.toks[self.pos] == ("op", "&"):
                background = True
                self.pos += 1
            items.append((joiner, cmd, background))
            if self.pos >= len(self.toks):
                if stop:
                    raise Incomplete
                break
            kind, val = self.toks[self.pos]
            if kind == "op" and val in ("&&", "||"):
                joiner = str(val)
                self.pos += 1
                while self.pos < len(self.toks) and self.toks[self.pos] == ("op", "\n"):
                    self.pos += 1
                if self.pos >= len(self.toks):
                    raise Incomplete
            elif (kind == "op" and val in (";", "\n")) or background:
                joiner = ";"
            elif self._peek_kw() in stop:
                break
            else:
                raise ParseError(f"unexpected {val!r}")
        return AndOrList(items)

    def _expect_kw(self, kw: str) -> None:
        if self.pos >= len(self.toks):
            raise Incomplete
        if self._peek_kw() != kw:
            raise ParseError(f"expected {kw!r}")
        self.pos += 1

    def _command(self) -> Command:
        kw = self._peek_kw()
        cmd: Command
        if kw == "while":
            self.pos += 1
            cond = self._list({"do"})
            self._expect_kw("do")
            body = self._list({"done"})
            self._expect_kw("done")
            cmd = While(cond, body)
        elif kw == "if":
            self.pos += 1
            cond = self._list({"then"})
            self._expect_kw("then")
            then = self._list({"else", "fi"})
            orelse = None
            if self._peek_kw() == "else":
                self.pos += 1
                orelse = self._list({"fi"})
            self._expect_kw("fi")
            cmd = If(cond, then, orelse)
        elif kw is not None:
            raise ParseError(f"unexpected keyword {kw!r}")
        else:
            cmd = Simple([])
        self._words_and_redirs(cmd)
        if isinstance(cmd, Simple) and not cmd.words and not cmd.redirs:
            raise ParseError("empty command")
        return cmd

    def _words_and_redirs(self, cmd: Command) -> None:
        while self.pos < len(self.toks):
            kind, val = self.toks[self.pos]
            if kind == "word" and isinstance(cmd, Simple):
                cmd.words.append(val)  # type: ignore[arg-type]
                self.pos += 1
            elif kind == "redir":
                fd, op = val  # type: ignore[misc]
                self.pos += 1
                if self.pos >= len(self.toks) or self.toks[self.pos][0] != "word":
                    raise ParseError("redirection without a target")
                target: Word | int = self.toks[self.pos][1]  # type: ignore[assignment]
                self.pos += 1
                if op == ">&":
                    text = literal(target)  # type: ignore[arg-type]
                    if text is None or not text.isdigit():
                        raise ParseError("only N>&M redirections are supported")
                    target = int(text)
                cmd.redirs.append(Redir(fd, op, target))
            else:
                break


def parse(text: str) -> AndOrList:
    return Parser(text).parse()
