"""Segments: the replayable unit derived from a timeline.

A recorded run becomes an alternating sequence of kernel and stall segments. The
simulator re-times kernels with its roofline model (using ``op`` and ``shape``) and
replays stalls for their measured ``dur_ns``; controllers see the same sequence in
replay as they would live. See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .events import NodeShape, StallKind

SegmentKind = Literal["kernel", "stall"]
Phase = Literal["prefill", "decode", "idle"]


# Not frozen, for construction speed (hundreds per token); treat as immutable.
@dataclass(slots=True)
class Segment:
    """One kernel or one stall.

    ``t_ns``/``dur_ns`` are as measured on the recording host (monotonic clock). For
    kernels recorded at ``graph`` granularity there is no per-kernel timing: their
    ``dur_ns`` is the graph's compute time shared out by the cost model's weights and
    ``timed`` is False.
    """

    kind: SegmentKind
    t_ns: int
    dur_ns: int
    phase: Phase
    stall: StallKind | None = None
    request: int = -1
    token: int = -1
    graph: int = -1
    node: int = -1
    layer: int = -1
    op: str = ""
    name: str = ""
    shape: NodeShape | None = None
    timed: bool = True
