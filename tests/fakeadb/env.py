"""Point our adb code at a fake server for one test (environment variables only)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .phone import FakePhone
from .server import FakeAdbServer


@contextmanager
def serving(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path, *phones: FakePhone
) -> Iterator[FakeAdbServer]:
    """Run a fake adb server with ``phones``; TURBOINFER_ADB_* point at it."""
    server = FakeAdbServer(list(phones)).start()
    monkeypatch.setenv("TURBOINFER_ADB_SERVER", server.address)
    monkeypatch.setenv("TURBOINFER_ADB_STATE_DIR", str(state_dir))
    monkeypatch.setenv("TURBOINFER_ADB_TIMEOUT_S", "2")
    monkeypatch.setenv("TURBOINFER_ADB_RTT_SAMPLES", "5")
    try:
        yield server
    finally:
        server.stop()
