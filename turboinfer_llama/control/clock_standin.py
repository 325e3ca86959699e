"""TESTS AND BENCHMARKS ONLY: a CPU stand-in for a GPU clock, for the Python executor.

When the model runs on the host's CPU while a (fake) GPU is steered, graph time does not
follow the GPU's clock, and a controller rightly learns that a low clock costs nothing.
The stand-in makes it follow. A graph's work ``W`` is the CPU time the engine thread
spends between :meth:`ClockStandIn.begin` (right before ``llama_decode``) and
:meth:`ClockStandIn.wait` (right after it returns, before the executor's graph end):
its time at the top level on an unloaded host (llama.cpp's CPU threads sharing the
work evenly; time the host gave to other processes is not work). Work is done at

    rate(f) = 1 / ((1 - m) * f_top / f + m)    ns of work per ns

while level ``f`` is in effect (the level the executor last applied, from the moment
its write returned; an unknown level counts as the top; ``m`` = ``memory_share``, the
part of the time that does not scale with the clock), and during the host's compute
at that rate times its productive share ``W / wall``. ``wait`` sleeps, woken early by
each switch, until ``W`` is done: the graph takes its host time plus what the applied
levels add to its work (``W * (f_top / f - 1)`` at a constant level ``f``).

``hooks/ti_exec.c`` (``ti_exec_standin_*``) is the same for the native executor. Both
are off unless ``PowerSettings.clock_standin`` is set; the simulated device refuses it
(it scales recorded time itself), ``Llama`` refuses it when a layer runs on a GPU, and
the native executor refuses hardware actuators (kmod, files on sysfs).
"""

from __future__ import annotations

import threading
import time

from .._clock import now_ns


def standin_rates(levels_hz: list[int], memory_share: float) -> list[float]:
    """Work per ns at each level (1.0 at the top)."""
    if not 0.0 <= memory_share < 1.0:
        raise ValueError(f"memory_share {memory_share} outside [0, 1)")
    top = float(levels_hz[-1])
    return [1.0 / ((1.0 - memory_share) * top / float(f) + memory_share) for f in levels_hz]


class ClockStandIn:
    """Progress of the current graph's work at the applied levels (see module doc)."""

    def __init__(self, levels_hz: list[int], memory_share: float = 0.0) -> None:
        self.memory_share = float(memory_share)
        self.rates = standin_rates(list(levels_hz), self.memory_share)
        self._cv = threading.Condition()
        self._level = -1
        self._acc_ns = 0.0  # progress at _t_ns
        self._t_ns = now_ns()
        self._t0_ns: int | None = None  # the running graph's begin (wall)
        self._cpu0_ns = 0  # ... and the engine thread's CPU clock then
        self._p0_ns = 0.0  # progress at its start
        self._stopped = False
        self.graphs = 0
        self.waited_ns = 0

    def _rate(self) -> float:
        return 1.0 if self._level < 0 else self.rates[self._level]

    def _progress(self, t_ns: int) -> float:
        return self._acc_ns + (t_ns - self._t_ns) * self._rate()

    def switched(self, level: int, t_ns: int) -> None:
        """``level`` is in effect from ``t_ns`` (the actuator's write has landed)."""
        with self._cv:
            self._acc_ns = self._progress(t_ns)
            self._t_ns = t_ns
            self._level = level
            self._cv.notify_all()

    def begin(self) -> None:
        """Right before ``llama_decode``, on the thread that calls it."""
        cpu = time.thread_time_ns()
        with self._cv:
            self._t0_ns = now_ns()
            self._cpu0_ns = cpu
            self._p0_ns = self._progress(self._t0_ns)

    def wait(self) -> int:
        """Right after ``llama_decode`` returns, on the same thread: sleep until the
        graph's work is done; ns slept, -1 without a ``begin``."""
        cpu = time.thread_time_ns()
        with self._cv:
            if self._t0_ns is None:
                return -1
            start = now = now_ns()
            wall = now - self._t0_ns
            work = min(cpu - self._cpu0_ns, wall)
            base = self._progress(now)
            done = (base - self._p0_ns) * work / wall if wall > 0 else 0.0
            left = work - done
            while not self._stopped:
                rest = left - (self._progress(now) - base)
                if rest <= 0:
                    break
                self._cv.wait(rest / self._rate() / 1e9)
                now = now_ns()
            self._t0_ns = None
            self.graphs += 1
            self.waited_ns += now - start
            return now - start

    def status(self) -> dict[str, int]:
        with self._cv:
            return {"graphs": self.graphs, "waited_ns": self.waited_ns}

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
