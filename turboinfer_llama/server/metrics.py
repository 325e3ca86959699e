"""``/metrics``: Prometheus text read from the served model's power session at scrape time.

A collector (not module-level metric objects) so the figures are the session's own and
several servers in one process (tests) never share a registry. Figures that the session
does not report are left out rather than exported as zero. ``simulated="true"`` labels
every figure that comes from the simulated GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .metering import RequestLedger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PowerCollector(Collector):
    def __init__(self, report: Callable[[], dict[str, Any]], ledger: RequestLedger) -> None:
        self._report = report
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        r = self._report()
        sim = r.get("simulated")
        labels = ["model", "simulated"]
        values = [str(r.get("model") or ""), "unknown" if sim is None else str(sim).lower()]

        def gauge(name: str, doc: str, v: Any) -> Metric:
            m = GaugeMetricFamily(name, doc, labels=labels)
            if v is not None:
                m.add_metric(values, float(v))
            return m

        def counter(name: str, doc: str, v: Any) -> Metric:
            m = CounterMetricFamily(name, doc, labels=labels)
            if v is not None:
                m.add_metric(values, float(v))
            return m

        dev, ctl, en = r.get("device") or {}, r.get("controller") or {}, r.get("energy") or {}
        yield gauge("turboinfer_gpu_frequency_hz", "Current GPU clock.", dev.get("freq_hz"))
        yield gauge(
            "turboinfer_gpu_power_watts",
            "Average GPU power over the run so far.",
            dev.get("avg_power_w"),
        )
        yield counter(
            "turboinfer_energy_joules", "GPU energy since the model loaded.", en.get("energy_j")
        )
        yield gauge(
            "turboinfer_energy_saved_joules",
            "Energy saved against the default-governor estimate.",
            en.get("saved_j"),
        )
        yield counter(
            "turboinfer_tokens", "Tokens generated.", (r.get("requests") or {}).get("tokens")
        )
        yield counter(
            "turboinfer_frequency_switches", "GPU clock changes made.", ctl.get("switches")
        )
        yield gauge(
            "turboinfer_controller_healthy", "1 if the controller is healthy.", ctl.get("healthy")
        )
        stall_s = CounterMetricFamily(
            "turboinfer_stall_seconds", "Engine stall time by kind.", labels=["model", "kind"]
        )
        for kind, total in (r.get("stalls") or {}).items():
            stall_s.add_metric([values[0], kind], float(total.get("total_ms", 0.0)) / 1e3)
        yield stall_s
        requests = CounterMetricFamily(
            "turboinfer_http_requests", "Model requests served, by outcome.", labels=["status"]
        )
        for status, n in sorted(self._ledger.by_status.items()):
            requests.add_metric([status], n)
        yield requests


def registry_for(collector: PowerCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
