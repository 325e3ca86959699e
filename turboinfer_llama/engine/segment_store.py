"""Segments waiting for accounting, packed in arrays.

A server under load derives segments faster than the simulated accounting settles
them; the backlog (up to ``PowerSession``'s bound, ~260k segments, a few gemma
requests) used to wait as ``Segment`` objects: ~250 bytes each in pymalloc's arenas,
interleaved with the objects that outlive the backlog (the timeline's window), so
the arenas stayed pinned after settling and the process kept the backlog's high-water
mark for good (issue 14: RSS after 10,000 tokens).

``SegmentStore`` keeps them as rows of a structured numpy array instead (60 bytes a
row, in blocks of ``BLOCK_ROWS``, which malloc returns to the system once freed), and
gives them back as ``Segment`` objects one request at a time, equal field by field to
those stored (the same ``op``/``name``/``shape`` objects, the same integers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .events import StallKind
from .segments import Segment

# the integer fields, stored as they are; everything else (kind, phase, stall, op,
# name, shape, timed) as one index into the store's table of distinct combinations
INT_FIELDS = ("t_ns", "dur_ns", "request", "token", "graph", "node", "layer")
ROW = np.dtype([(f, np.int64) for f in INT_FIELDS] + [("meta", np.int32)])
BLOCK_ROWS = 32_768  # ~2 MiB a block


@dataclass
class SegmentColumns:
    """A range of stored segments as arrays: each integer field, and ``meta``, each
    row's index into ``table`` of (kind, phase, stall, op, name, shape, timed)."""

    t_ns: np.ndarray
    dur_ns: np.ndarray
    request: np.ndarray
    token: np.ndarray
    graph: np.ndarray
    node: np.ndarray
    layer: np.ndarray
    meta: np.ndarray
    table: list[tuple[Any, ...]]

    def __len__(self) -> int:
        return len(self.meta)

    def entry_mask(self, test: Any) -> np.ndarray:
        """``test(kind, phase, stall, op, name, shape, timed)`` for each row."""
        by_entry = np.fromiter(
            (bool(test(*t)) for t in self.table), dtype=bool, count=len(self.table)
        )
        return by_entry[self.meta]

    def segments(self, lo: int = 0) -> list[Segment]:
        """The rows (from ``lo``) as ``Segment`` objects."""
        table = self.table
        cols = [getattr(self, f)[lo:].tolist() for f in INT_FIELDS]
        out: list[Segment] = []
        append = out.append
        for t, d, req, tok, g, node, layer, m in zip(*cols, self.meta[lo:].tolist(), strict=True):
            kind, phase, stall, op, name, shape, timed = table[m]
            append(
                Segment(kind, t, d, phase, stall, req, tok, g, node, layer, op, name, shape, timed)
            )
        return out


class SegmentStore:
    """A FIFO of segments by absolute index (the n-th segment ever added is index n).

    ``extend`` appends; ``segments(lo, hi)`` rebuilds a range; ``drop_before(i)`` frees
    every block wholly before ``i``. Not thread-safe: the caller holds its lock."""

    def __init__(self, block_rows: int = BLOCK_ROWS) -> None:
        if block_rows <= 0:
            raise ValueError(f"block_rows must be positive, not {block_rows}")
        self.block_rows = block_rows
        self._blocks: list[np.ndarray] = []
        self._base = 0  # absolute index of the first row of _blocks[0]
        self._start = 0  # absolute index of the first row not dropped
        self._end = 0  # absolute index one past the last row added
        # (kind, phase, stall, op, name, shape, timed) by index, and its index by key;
        # the key holds id(shape): the table keeps each shape alive while it is a key
        self._table: list[tuple[Any, ...]] = []
        self._codes: dict[tuple[Any, ...], int] = {}
        # a source table's index -> ours (``extend_columns``), by id(source table)
        self._xlat: dict[int, tuple[list[tuple[Any, ...]], np.ndarray]] = {}

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    @property
    def table_size(self) -> int:
        """Distinct (kind, phase, stall, op, name, shape, timed) combinations held."""
        return len(self._table)

    @property
    def nbytes(self) -> int:
        """Bytes held by the blocks."""
        return sum(b.nbytes for b in self._blocks)

    # -- adding ------------------------------------------------------------------
    def extend(self, segments: Sequence[Segment]) -> None:
        n = len(segments)
        if not n:
            return
        codes = self._codes
        table = self._table
        meta: list[int] = []
        add = meta.append
        for s in segments:
            shape = s.shape
            key = (s.kind, s.phase, s.stall, s.op, s.name, id(shape), s.timed)
            c = codes.get(key)
            if c is None:
                c = codes[key] = len(table)
                table.append((s.kind, s.phase, s.stall, s.op, s.name, shape, s.timed))
            add(c)
        cols = {
            "t_ns": np.asarray([s.t_ns for s in segments]),
            "dur_ns": np.asarray([s.dur_ns for s in segments]),
            "request": np.asarray([s.request for s in segments]),
            "token": np.asarray([s.token for s in segments]),
            "graph": np.asarray([s.graph for s in segments]),
            "node": np.asarray([s.node for s in segments]),
            "layer": np.asarray([s.layer for s in segments]),
        }
        for name, col in cols.items():
            if col.dtype.kind not in "ib":  # stored as int64: never round a number
                raise TypeError(f"segment field {name} must be integers, not {col.dtype}")
        cols["meta"] = np.asarray(meta, dtype=np.int32)
        self._write(cols, n)

    def _write(self, cols: dict[str, np.ndarray], n: int) -> None:
        done = 0
        while done < n:
            at = self._end - self._base  # row in the blocks' concatenation
            b, r = divmod(at, self.block_rows)
            if b == len(self._blocks):
                self._blocks.append(np.empty(self.block_rows, dtype=ROW))
            blk = self._blocks[b]
            k = min(self.block_rows - r, n - done)
            for name, col in cols.items():
                blk[name][r : r + k] = col[done : done + k]
            done += k
            self._end += k

    def extend_columns(self, cols: SegmentColumns) -> None:
        """``extend(cols.segments())`` without the objects: the same rows and table."""
        n = len(cols)
        if not n:
            return
        src = cols.table
        xlat = self._xlat.get(id(src))
        if xlat is None or xlat[0] is not src:
            xlat = self._xlat[id(src)] = (src, np.full(0, -1, dtype=np.int32))
        arr = xlat[1]
        if len(arr) < len(src):
            arr = np.concatenate((arr, np.full(len(src) - len(arr), -1, dtype=np.int32)))
            self._xlat[id(src)] = (src, arr)
        meta = cols.meta
        new = arr[meta] < 0
        if new.any():
            # new combinations enter the table in the order of their first row, as in
            # ``extend``
            uniq, first = np.unique(meta[new], return_index=True)
            codes, table = self._codes, self._table
            for m in uniq[np.argsort(first, kind="stable")].tolist():
                kind, phase, stall, op, name, shape, timed = src[m]
                key = (kind, phase, stall, op, name, id(shape), timed)
                c = codes.get(key)
                if c is None:
                    c = codes[key] = len(table)
                    table.append((kind, phase, stall, op, name, shape, timed))
                arr[m] = c
        out = {f: getattr(cols, f) for f in INT_FIELDS}
        out["meta"] = arr[meta]
        self._write(out, n)

    # -- reading -----------------------------------------------------------------
    def _slices(self, lo: int, hi: int) -> list[np.ndarray]:
        """Views of the rows ``lo``..``hi`` (absolute), block by block."""
        if not self._start <= lo <= hi <= self._end:
            raise IndexError(f"rows {lo}..{hi} outside {self._start}..{self._end}")
        out: list[np.ndarray] = []
        a, z = lo - self._base, hi - self._base
        rows = self.block_rows
        while a < z:
            b, r = divmod(a, rows)
            k = min(rows - r, z - a)
            out.append(self._blocks[b][r : r + k])
            a += k
        return out

    def column(self, name: str, lo: int, hi: int) -> np.ndarray:
        """One integer field (or ``"meta"``) of rows ``lo``..``hi``, as a new array."""
        parts = [s[name] for s in self._slices(lo, hi)]
        if not parts:
            return np.empty(0, dtype=ROW[name])
        return np.concatenate(parts)

    def meta_mask(self, test: Any) -> np.ndarray:
        """``test(kind, phase, stall, op, name, shape, timed)`` for every table index."""
        return np.fromiter(
            (bool(test(*t)) for t in self._table), dtype=bool, count=len(self._table)
        )

    def columns(self, lo: int, hi: int) -> SegmentColumns:
        """Rows ``lo``..``hi`` (absolute) as arrays (copies)."""
        c = {f: self.column(f, lo, hi) for f in INT_FIELDS}
        return SegmentColumns(
            t_ns=c["t_ns"],
            dur_ns=c["dur_ns"],
            request=c["request"],
            token=c["token"],
            graph=c["graph"],
            node=c["node"],
            layer=c["layer"],
            meta=self.column("meta", lo, hi),
            table=self._table,
        )

    def segments(self, lo: int, hi: int) -> list[Segment]:
        """Rows ``lo``..``hi`` (absolute) as ``Segment`` objects."""
        return self.columns(lo, hi).segments()

    # -- dropping ----------------------------------------------------------------
    def drop_before(self, index: int) -> None:
        """Forget rows before ``index`` (absolute); frees the blocks they filled. Once
        nothing is held, the table of combinations starts over too."""
        index = min(max(index, self._start), self._end)
        self._start = index
        rows = self.block_rows
        while self._blocks and self._base + rows <= index:
            self._blocks.pop(0)
            self._base += rows
        if self._start == self._end:
            self._blocks.clear()
            self._base = self._start = self._end
            self._table = []  # new lists: columns handed out keep the old table
            self._codes = {}
            self._xlat = {}


def is_idle_stall(kind: str, phase: str, stall: StallKind | None, *_: Any) -> bool:
    return stall is StallKind.IDLE


def is_kernel(kind: str, *_: Any) -> bool:
    return kind == "kernel"
