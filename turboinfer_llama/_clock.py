"""The one process-wide clock: CLOCK_MONOTONIC in nanoseconds.

The native hook library stamps records with ``clock_gettime(CLOCK_MONOTONIC)``; on
Linux ``time.monotonic_ns`` reads the same clock, so hook records and Python events
share one timeline without conversion.
"""

from __future__ import annotations

import time

now_ns = time.monotonic_ns

__all__ = ["now_ns"]
