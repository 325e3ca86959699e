"""Engine events: the one vocabulary shared by hooks, timeline, controllers and the simulator.

Every event carries ``t_ns`` on the process-wide monotonic clock (``_clock.now_ns``).
Fields that do not apply to a kind keep their defaults (-1, "" or None).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class EventKind(str, Enum):
    """What happened. Values are stable strings: they are written into trace files."""

    REQUEST_BEGIN = "request_begin"
    REQUEST_END = "request_end"
    PREFILL_BEGIN = "prefill_begin"
    PREFILL_END = "prefill_end"
    DECODE_BEGIN = "decode_begin"  # one llama_decode call (a decode step) starts
    DECODE_END = "decode_end"
    SAMPLE_BEGIN = "sample_begin"
    SAMPLE_END = "sample_end"
    TOKEN = "token"  # a token was yielded to the caller
    KV_EDIT = "kv_edit"  # kv_cache_seq_rm / reset
    IDLE = "idle"  # marks the start of an idle stretch between requests
    NODE_ASK = "node_ask"  # cb_eval(ask=True): the scheduler reached this node
    NODE_DONE = "node_done"  # cb_eval(ask=False): the node (and those before it) finished


class StallKind(str, Enum):
    """Why the GPU is not computing. See docs/architecture.md for the boundaries."""

    SUBMIT = "submit"  # decode begin -> first kernel
    INTER_KERNEL = "inter_kernel"  # between two kernels of one graph
    SAMPLE = "sample"  # last kernel -> next decode begin
    IDLE = "idle"  # between requests


@dataclass(frozen=True, slots=True)
class NodeShape:
    """Shape and type of a graph node and its first two sources (ggml ``ne``/``type``)."""

    ne: tuple[int, int, int, int]
    type: int
    src0_ne: tuple[int, int, int, int] | None = None
    src0_type: int = -1
    src1_ne: tuple[int, int, int, int] | None = None
    src1_type: int = -1
    nbytes: int = 0


# Not frozen: a frozen dataclass's __init__ is ~3x slower, and hundreds of these are
# built per decoded token. Treat instances as immutable all the same.
@dataclass(slots=True)
class Event:
    """One engine event.

    ``graph`` is the graph sequence number (one per ``llama_decode`` call), ``node``
    the node's index inside that graph, ``token`` the index of the generated token
    inside the request, ``n_tokens`` the batch size of a decode call.
    """

    kind: EventKind
    t_ns: int
    graph: int = -1
    node: int = -1
    op: str = ""
    name: str = ""
    layer: int = -1
    token: int = -1
    n_tokens: int = 0
    shape: NodeShape | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v not in (-1, "", 0, None)}
        d["kind"] = self.kind.value
        d["t_ns"] = self.t_ns
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        d = dict(d)
        d["kind"] = EventKind(d["kind"])
        shape = d.get("shape")
        if shape is not None:
            for k in ("ne", "src0_ne", "src1_ne"):
                if shape.get(k) is not None:
                    shape[k] = tuple(shape[k])
            d["shape"] = NodeShape(**shape)
        return cls(**d)


_LAYER_RE = re.compile(r"(?:-|_l)(\d+)$")


def layer_of(name: str) -> int:
    """Layer index from a llama.cpp node name (-1 if none): ``ffn_out-12``,
    ``Kcur-0 (view)``, ``cache_k_l3 (view)``."""
    m = _LAYER_RE.search(name.split(" ", 1)[0])
    return int(m.group(1)) if m else -1
