"""The project's own tooling gates: ruff (lint and format) and mypy on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_and_format():
    lint = _run(str(BIN / "ruff"), "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.slow
def test_mypy_on_the_package():
    out = _run(str(BIN / "mypy"))
    assert out.returncode == 0, out.stdout + out.stderr
