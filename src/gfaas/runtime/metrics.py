"""A small, thread-safe Prometheus registry: counters, gauges and histograms in the text format 0.0.4.

Only what the gateway needs, with no dependency: metrics have fixed label names, values are kept per
label tuple, and :meth:`Registry.render` writes the exposition format
(https://prometheus.io/docs/instrumenting/exposition_formats/) with ``# HELP`` and ``# TYPE`` lines,
escaped label values and, for histograms, cumulative ``_bucket`` series with ``le`` plus ``_sum`` and
``_count``. Families come out in registration order and series sorted by label values, so the output
is deterministic.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Counter", "CounterCallback", "Gauge", "GaugeCallback", "Histogram",
           "Registry"]

#: The content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Default latency buckets (seconds): from a few milliseconds (tiny workflows, warm workers) to two minutes.
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                                      120.0)

Labels = tuple[str, ...]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float) -> str:
    """A sample value as the exposition format writes it (``+Inf``, ``-Inf``, ``NaN``, shortest repr)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    return repr(f)


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, str] | None, kw: Mapping[str, str]) -> Labels:
        given = {**(labels or {}), **kw}
        if set(given) != set(self.labelnames):
            raise ValueError(f"metric {self.name} takes labels {list(self.labelnames)}, got {sorted(given)}")
        return tuple(str(given[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> list[str]:
        return self.header() + self.samples()


class Counter(_Metric):
    """A monotonically increasing value per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1, labels: Mapping[str, str] | None = None, **kw: str) -> None:
        if amount < 0 or math.isnan(amount):
            raise ValueError(f"counter {self.name} can only go up; got {amount}")
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, labels: Mapping[str, str] | None = None, **kw: str) -> float:
        key = self._key(labels, kw)
        with self._lock:
            return self._values.get(key, 0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_label_text(self.labelnames, k)} {format_value(v)}" for k, v in items]


class Gauge(_Metric):
    """A value per label set that can go up and down."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}

    def set(self, value: float, labels: Mapping[str, str] | None = None, **kw: str) -> None:
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = value

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_label_text(self.labelnames, k)} {format_value(v)}" for k, v in items]


class GaugeCallback(_Metric):
    """A gauge whose series are read from a callback at every render (e.g. queue depths).

    The callback returns ``{label values tuple: value}``; it runs outside every lock, and an
    exception in it propagates to :meth:`Registry.render`'s caller.
    """

    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: Sequence[str],
                 read: Callable[[], Mapping[Labels, float]]) -> None:
        super().__init__(name, help, labelnames)
        self._read = read

    def samples(self) -> list[str]:
        items = sorted(self._read().items())
        for k, _ in items:
            if len(k) != len(self.labelnames):
                raise ValueError(f"gauge {self.name}: label values {k} do not match {list(self.labelnames)}")
        return [f"{self.name}{_label_text(self.labelnames, k)} {format_value(v)}" for k, v in items]


class CounterCallback(GaugeCallback):
    """A counter whose series are read from a callback at every render: totals another process keeps
    (a node daemon's evictions, bytes moved), which only ever go up while that process lives."""

    kind = "counter"


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count, per label set."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),
                 buckets: Iterable[float] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help, labelnames)
        if "le" in self.labelnames:
            raise ValueError("a histogram may not have a label named 'le'")
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(math.isnan(b) for b in bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"histogram {name}: buckets must be distinct numbers, got {list(buckets)}")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.buckets: tuple[float, ...] = tuple(bounds)
        # per label set: (count per bucket, not cumulative; [sum, count])
        self._data: dict[Labels, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, labels: Mapping[str, str] | None = None, **kw: str) -> None:
        key = self._key(labels, kw)
        v = float(value)
        idx = bisect.bisect_left(self.buckets, v) if not math.isnan(v) else len(self.buckets) - 1
        with self._lock:
            counts, sc = self._data.setdefault(key, ([0] * len(self.buckets), [0.0, 0.0]))
            counts[idx] += 1
            sc[0] += v
            sc[1] += 1

    def snapshot(self, labels: Mapping[str, str] | None = None, **kw: str) -> dict[str, Any]:
        """``{"buckets": {le: cumulative count}, "sum": float, "count": int}`` of one label set."""
        key = self._key(labels, kw)
        with self._lock:
            counts, sc = self._data.get(key, ([0] * len(self.buckets), [0.0, 0.0]))
            counts, sc = list(counts), list(sc)
        cum, out = 0, {}
        for b, c in zip(self.buckets, counts, strict=True):
            cum += c
            out[b] = cum
        return {"buckets": out, "sum": sc[0], "count": int(sc[1])}

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), list(sc))) for k, (c, sc) in self._data.items())
        lines = []
        for key, (counts, sc) in items:
            cum = 0
            for b, c in zip(self.buckets, counts, strict=True):
                cum += c
                le = f'le="{format_value(b) if math.isinf(b) else repr(b)}"'
                lines.append(f"{self.name}_bucket{_label_text(self.labelnames, key, le)} {cum}")
            lines.append(f"{self.name}_sum{_label_text(self.labelnames, key)} {format_value(sc[0])}")
            lines.append(f"{self.name}_count{_label_text(self.labelnames, key)} {int(sc[1])}")
        return lines


class Registry:
    """Metrics by name; :meth:`render` writes them all in the text exposition format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> Any:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        m: Counter = self._add(Counter(name, help, labelnames))
        return m

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        m: Gauge = self._add(Gauge(name, help, labelnames))
        return m

    def gauge_callback(self, name: str, help: str, labelnames: Sequence[str],
                       read: Callable[[], Mapping[Labels, float]]) -> GaugeCallback:
        m: GaugeCallback = self._add(GaugeCallback(name, help, labelnames, read))
        return m

    def counter_callback(self, name: str, help: str, labelnames: Sequence[str],
                         read: Callable[[], Mapping[Labels, float]]) -> CounterCallback:
        m: CounterCallback = self._add(CounterCallback(name, help, labelnames, read))
        return m

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Iterable[float] = LATENCY_BUCKETS) -> Histogram:
        m: Histogram = self._add(Histogram(name, help, labelnames, buckets))
        return m

    def render(self) -> str:
        """Every metric in the text exposition format, ending with a newline."""
        with self._lock:
            metrics = list(self._metrics.values())
        lines: list[str] = []
        for m in metrics:
            lines += m.render()
        return "\n".join(lines) + "\n"
