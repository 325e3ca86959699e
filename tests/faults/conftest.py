"""The fault-injection suite: every test injects one fault mid-run through the
``fault`` fixture; the session ends with a table of faults injected and survived.

A fault counts as *injected* once the test has applied it, and as *survived* when the
test then passed every check: generation went on, the GPU was restored or handed to
its default governor, the error showed in the health/stats report, and no write went
above the thermal cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class FaultCase:
    backend: str = ""
    fault: str = ""
    injected: bool = False
    survived: bool = False
    outcome: str = ""

    def inject(self) -> None:
        self.injected = True


RESULTS: list[FaultCase] = []


@pytest.fixture
def fault(request: pytest.FixtureRequest) -> Iterator[FaultCase]:
    case = FaultCase()
    yield case
    rep = getattr(request.node, "rep_call", None)
    case.survived = case.injected and rep is not None and rep.passed
    RESULTS.append(case)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    tr = terminalreporter
    w_b = max(len("backend"), *(len(c.backend) for c in RESULTS))
    w_f = max(len("fault"), *(len(c.fault) for c in RESULTS))
    tr.section("faults injected / survived")
    tr.write_line(f"{'backend':<{w_b}}  {'fault':<{w_f}}  injected  survived  outcome")
    for c in sorted(RESULTS, key=lambda c: (c.backend, c.fault)):
        tr.write_line(
            f"{c.backend:<{w_b}}  {c.fault:<{w_f}}  {'yes' if c.injected else 'NO':<8}  "
            f"{'yes' if c.survived else 'NO':<8}  {c.outcome}"
        )
    injected = sum(c.injected for c in RESULTS)
    survived = sum(c.survived for c in RESULTS)
    tr.write_line(f"total: {len(RESULTS)} cases, {injected} injected, {survived} survived")
