"""Decode throughput of a live model, timed from the first streamed token to the last."""

from __future__ import annotations

import time
from typing import Any


def decode_tokens_per_s(llm: Any, prompt: str, max_tokens: int, seed: int = 1) -> tuple[float, int]:
    """(decode tokens/s, tokens generated). Prefill is excluded; greedy decoding."""
    t_first = t_last = 0.0
    n = 0
    for _chunk in llm.create_completion(
        prompt, max_tokens=max_tokens, temperature=0.0, stream=True, seed=seed
    ):
        t_last = time.perf_counter()
        if n == 0:
            t_first = t_last
        n += 1
    if n < 2 or t_last <= t_first:
        return 0.0, n
    return (n - 1) / (t_last - t_first), n
