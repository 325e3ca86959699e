"""Every example in examples/ runs (on the tiny GGUF where it takes a model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart(tiny_gguf):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(tiny_gguf)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert out.startswith("completion:")
    stats = json.loads(out[out.index("{") :])
    assert stats["tokens"] > 0
    assert stats["stalls"]["sample"]["count"] > 0
