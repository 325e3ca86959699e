"""Hook records as arrays: one ``NodeBlock`` per drained batch instead of one ``Event``
per record (issue 14: the per-record objects cost ~10 ms of CPU per generated token).

A block keeps each record's ``t_ns``, ``graph``, ``node`` and kind (ask or done) as
arrays, and the rest (op, name, layer, shape) as an index into a ``NodeTable`` of the
distinct combinations seen so far (they repeat every token). ``events()`` rebuilds the
``Event`` objects ``decode_raw`` would have given, for the consumers that want them
(``record()``, tests); the timeline derives segments from the arrays directly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from .events import Event, EventKind, NodeShape, layer_of


class NodeTable:
    """Distinct (op, name, layer, shape) of node records, by index; grows only."""

    def __init__(self) -> None:
        self.op: list[str] = []
        self.name: list[str] = []
        self.layer: list[int] = []
        self.shape: list[NodeShape | None] = []
        self._layer_arr = np.zeros(0, dtype=np.int64)
        self._weight_arr = np.zeros(0, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.op)

    def add(self, op: str, name: str, layer: int, shape: NodeShape | None) -> int:
        self.op.append(op)
        self.name.append(name)
        self.layer.append(layer)
        self.shape.append(shape)
        return len(self.op) - 1

    @property
    def layers(self) -> np.ndarray:
        """Each entry's layer, as an array (rebuilt when the table grew)."""
        if len(self._layer_arr) != len(self.layer):
            self._layer_arr = np.asarray(self.layer, dtype=np.int64)
        return self._layer_arr

    @property
    def weights(self) -> np.ndarray:
        """Each entry's reference-machine duration (``timeline._weight``)."""
        have = len(self._weight_arr)
        if have != len(self.op):
            from .timeline import _weight

            new = [
                _weight(op, sh) for op, sh in zip(self.op[have:], self.shape[have:], strict=True)
            ]
            self._weight_arr = np.concatenate((self._weight_arr, np.asarray(new, dtype=np.float64)))
        return self._weight_arr


class NodeBlock:
    """Node records (NODE_ASK/NODE_DONE) in drain order, as arrays."""

    __slots__ = ("code", "done", "graph", "node", "t_ns", "table")

    def __init__(
        self,
        t_ns: np.ndarray,
        graph: np.ndarray,
        node: np.ndarray,
        done: np.ndarray,
        code: np.ndarray,
        table: NodeTable,
    ) -> None:
        self.t_ns = t_ns
        self.graph = graph
        self.node = node
        self.done = done
        self.code = code
        self.table = table

    def __len__(self) -> int:
        return len(self.t_ns)

    def events(self, lo: int = 0, hi: int | None = None) -> list[Event]:
        """Records ``lo``..``hi`` as the ``Event`` objects ``decode_raw`` gives."""
        tab = self.table
        ops, names, layers, shapes = tab.op, tab.name, tab.layer, tab.shape
        ask_k, done_k = EventKind.NODE_ASK, EventKind.NODE_DONE
        sl = slice(lo, hi)
        return [
            Event(
                kind=done_k if d else ask_k,
                t_ns=t,
                graph=g,
                node=n,
                op=ops[c],
                name=names[c],
                layer=layers[c],
                shape=shapes[c],
            )
            for t, g, n, d, c in zip(
                self.t_ns[sl].tolist(),
                self.graph[sl].tolist(),
                self.node[sl].tolist(),
                self.done[sl].tolist(),
                self.code[sl].tolist(),
                strict=True,
            )
        ]


class NodeTexts:
    """A record's op, name (and its layer) and shape as ``Event`` fields, cached: they
    repeat every token. Shared by the hook's per-record decoder and ``BlockDecoder``,
    so either path gives the same objects."""

    def __init__(self, build_shape: Callable[[Any], NodeShape | None]) -> None:
        self._build_shape = build_shape
        self._names: dict[bytes, tuple[str, int]] = {}
        self._ops: dict[bytes, str] = {}
        self._shapes: dict[Hashable, NodeShape | None] = {}

    def resolve(self, op: bytes, name: bytes, key: Hashable) -> tuple[str, str, int, Any]:
        """(op, name, layer, shape) of a record."""
        named = self._names.get(name)
        if named is None:
            text = name.decode("utf-8", "replace")
            named = self._names[name] = (text, layer_of(text))
        op_text = self._ops.get(op)
        if op_text is None:
            op_text = self._ops[op] = op.decode("ascii", "replace")
        shapes = self._shapes
        if key in shapes:
            shape = shapes[key]
        else:
            shape = shapes[key] = self._build_shape(key)
        return op_text, named[0], named[1], shape


class BlockDecoder:
    """Raw records (``RECORD_DTYPE`` rows) to ``NodeBlock``s, their fields resolved by
    the ``NodeTexts`` the hook's per-record decoder uses."""

    def __init__(
        self,
        texts: NodeTexts,
        same_shape: Callable[[np.ndarray, np.ndarray], bool],
        shape_keys: Callable[[np.ndarray], list[bytes]],
    ) -> None:
        self.table = NodeTable()
        self._texts = texts
        self._same_shape = same_shape
        self._shape_keys = shape_keys
        self._codes: dict[tuple[bytes, bytes, bytes], int] = {}
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # (records, codes)

    def decode(self, raw: np.ndarray) -> NodeBlock:
        last = self._last
        if last is not None and self._same_shape(raw, last[0]):
            code = last[1]  # the same nodes as the last batch (every decode token)
        else:
            code = self._codes_of(raw)
            self._last = (raw, code)
        return NodeBlock(
            raw["t_ns"].astype(np.int64),
            raw["graph"].astype(np.int64),
            raw["node"].astype(np.int64),
            raw["phase"] != 0,
            code,
            self.table,
        )

    def decode_like(self, template: np.ndarray, t_ns: np.ndarray, graph: int) -> NodeBlock:
        """``decode`` of a graph whose records are ``template``'s with ``t_ns`` and
        ``graph`` (``engine.hooks.GraphRecords``): the same block, the rows untouched."""
        last = self._last
        if last is not None and (last[0] is template or self._same_shape(template, last[0])):
            code = last[1]
        else:
            code = self._codes_of(template)
            self._last = (template, code)
        return NodeBlock(
            t_ns.astype(np.int64),
            np.full(len(t_ns), graph, dtype=np.int64),
            template["node"].astype(np.int64),
            template["phase"] != 0,
            code,
            self.table,
        )

    def _codes_of(self, raw: np.ndarray) -> np.ndarray:
        codes, resolve, table = self._codes, self._texts.resolve, self.table
        out = np.empty(len(raw), dtype=np.int64)
        keys = self._shape_keys(raw)
        for i, (op, name, key) in enumerate(
            zip(raw["op"].tolist(), raw["name"].tolist(), keys, strict=True)
        ):
            ck = (op, name, key)
            c = codes.get(ck)
            if c is None:
                c = codes[ck] = table.add(*resolve(op, name, key))
            out[i] = c
        return out
