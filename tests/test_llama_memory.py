"""Resident memory with our Llama matches plain llama_cpp.Llama: no second context or KV cache.

Each side runs in a fresh process so allocator state does not leak between them. A
second context would add its KV cache (about 38 MB for gemma-3-270m at n_ctx=2048)
and compute buffers; the allowance is the hook ring plus 8 MB of interpreter noise.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
kind, path, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "plain":
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=n_ctx, verbose=False)
else:
    import turboinfer_llama.engine.hooks  # import cost counted for both sides below
    from turboinfer_llama import Llama
    llm = Llama(model_path=path, n_ctx=n_ctx, verbose=False)
llm.create_completion("hello the world", max_tokens=8, temperature=0.0)
rss = [l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]
print(int(rss) * 1024)
"""

PRELOAD = "import turboinfer_llama.engine.hooks, turboinfer_llama.llama\n"


def _rss(kind: str, path: str, n_ctx: int) -> int:
    code = (PRELOAD if kind == "plain" else "") + SCRIPT
    out = subprocess.run(
        [sys.executable, "-c", code, kind, path, str(n_ctx)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return int(out.stdout.strip().splitlines()[-1])


def _allowance_bytes() -> int:
    from turboinfer_llama import PowerSettings

    return PowerSettings().ring_capacity * 512 + 8 * 2**20  # generous bound per record


def _check(path: str, n_ctx: int) -> None:
    plain = min(_rss("plain", path, n_ctx) for _ in range(2))
    ours = min(_rss("ours", path, n_ctx) for _ in range(2))
    assert ours - plain <= _allowance_bytes(), (plain, ours)


def test_rss_matches_plain_tiny(tiny_gguf):
    _check(str(tiny_gguf), 4096)


@pytest.mark.slow
@pytest.mark.model
def test_rss_matches_plain_gemma(gemma_gguf):
    # The check can fail: one more KV cache for gemma-3-270m at n_ctx=2048
    # (18 layers x 2048 x 256 x K,V x f16) is far above the allowance.
    assert _allowance_bytes() < 18 * 2048 * 256 * 2 * 2
    _check(str(gemma_gguf), 2048)
