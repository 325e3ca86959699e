"""Shared by the server tests: run ``python -m turboinfer_llama.server`` on a random
loopback port (``--port 0``; the port is read from uvicorn's start line)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from turboinfer_llama.bench.server_ab import Server

MODEL = "tiny"
# Keep the server light on the shared CI cores.
BASE_ARGS = ("--model-alias", MODEL, "--n-threads", "1", "--n-threads-batch", "1")


class ServerProcess(Server):
    """One server subprocess; its output is collected for assertions and failures."""

    def __init__(self, model: Path, *args: str, env: dict[str, str] | None = None) -> None:
        cmd = [
            sys.executable,
            "-m",
            "turboinfer_llama.server",
            "--model",
            str(model),
            "--port",
            "0",
            "--verbose",
            "false",
            *BASE_ARGS,
            *args,
        ]
        super().__init__("turboinfer", cmd, env=env, start_timeout_s=120)

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def http(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)  # type: ignore[arg-type]

    def power(self, **kw: object) -> dict:
        with self.http(**kw) as h:
            r = h.get("/v1/power")
            r.raise_for_status()
            return r.json()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def wait_for(self, predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        """Poll ``/v1/power`` until ``predicate(doc)`` is truthy; return the document."""
        deadline = time.monotonic() + timeout
        while True:
            doc = self.power()
            if predicate(doc):
                return doc
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met; last /v1/power: {doc}")
            time.sleep(0.1)


def record(doc: dict, request_id: str) -> dict:
    """The ``/v1/power`` record of one request."""
    for r in doc["requests"]["recent"]:
        if r["id"] == request_id:
            return r
    raise AssertionError(f"request {request_id} not in {doc['requests']['recent']}")
