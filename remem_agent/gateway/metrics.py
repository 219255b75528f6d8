"""Prometheus-style metrics in the plain text exposition format (version 0.0.4), with no collector library.

Per process: with ``--workers N`` each worker keeps its own numbers (scrape each, or run one worker per port).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping

STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _fmt_labels(labels: Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    items = [*labels, *extra]
    if not items:
        return ""
    esc = [(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')) for k, v in items]
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc) + "}"


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class Metrics:
    """Counters, gauges (callables read at scrape time) and histograms; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._counters: dict[str, dict[Labels, float]] = {}
        self._hists: dict[str, dict[Labels, list[float]]] = {}  # bucket counts..., sum, count
        self._buckets: dict[str, tuple[float, ...]] = {}
        self._gauges: dict[str, list[tuple[Labels, object]]] = {}

    def counter(self, name: str, help_text: str) -> None:
        self._help[name] = ("counter", help_text)
        self._counters.setdefault(name, {})

    def histogram(self, name: str, help_text: str, buckets: tuple[float, ...] = STAGE_BUCKETS) -> None:
        self._help[name] = ("histogram", help_text)
        self._hists.setdefault(name, {})
        self._buckets[name] = buckets

    def gauge(self, name: str, help_text: str, read: object, **labels: str) -> None:
        """``read`` is a zero-argument callable returning a number, evaluated at each scrape."""
        self._help[name] = ("gauge", help_text)
        self._gauges.setdefault(name, []).append((_labels(labels), read))

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = _labels(labels)
        buckets = self._buckets[name]
        with self._lock:
            row = self._hists[name].setdefault(key, [0.0] * (len(buckets) + 2))
            for i, b in enumerate(buckets):
                if seconds <= b:
                    row[i] += 1
            row[-2] += seconds
            row[-1] += 1

    def value(self, name: str, **labels: str) -> float:
        """A counter's current value (tests and the benchmark read it)."""
        with self._lock:
            return self._counters.get(name, {}).get(_labels(labels), 0.0)

    def render(self) -> str:
        out: list[str] = []
        with self._lock:
            for name, (kind, help_text) in sorted(self._help.items()):
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {kind}")
                if kind == "counter":
                    for labels, v in sorted(self._counters[name].items()):
                        out.append(f"{name}{_fmt_labels(labels)} {_num(v)}")
                elif kind == "gauge":
                    for labels, read in self._gauges[name]:
                        v = float(read()) if callable(read) else 0.0
                        out.append(f"{name}{_fmt_labels(labels)} {_num(v)}")
                else:
                    buckets = self._buckets[name]
                    for labels, row in sorted(self._hists[name].items()):
                        for b, c in zip(buckets, row, strict=False):
                            out.append(f"{name}_bucket{_fmt_labels(labels, [('le', _num(b))])} {_num(c)}")
                        out.append(f"{name}_bucket{_fmt_labels(labels, [('le', '+Inf')])} {_num(row[-1])}")
                        out.append(f"{name}_sum{_fmt_labels(labels)} {_num(row[-2])}")
                        out.append(f"{name}_count{_fmt_labels(labels)} {_num(row[-1])}")
        return "\n".join(out) + "\n"


def gateway_metrics() -> Metrics:
    m = Metrics()
    m.counter("remem_gateway_requests_total", "HTTP requests by route, method and status.")
    m.histogram(
        "remem_gateway_stage_seconds",
        "Latency per stage: recall (memory work before the upstream call), "
        "upstream (model time, retries included), total (whole request).",
    )
    m.counter("remem_gateway_upstream_errors_total", "Failed upstream calls by kind (status class or transport).")
    m.counter("remem_gateway_memories_served_total", "Memories served into prompts.")
    m.counter("remem_gateway_rejected_total", "Requests refused before any work, by reason.")
    m.counter("remem_gateway_sweeps_total", "Store sweeps (answer expiry and pruning) by outcome.")
    return m
