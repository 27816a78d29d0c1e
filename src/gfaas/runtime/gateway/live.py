"""Recent invocations per workflow, for the dashboard: rates, latency percentiles, where the time went.

The Prometheus counters (:mod:`.state`) say what happened since start; a dashboard wants *now*:
the rate over the last few seconds, the p50/p99 of the last minute, the latest breakdown. Each
finished invocation is one small record in a bounded per-workflow window, so memory stays fixed
however long the gateway runs, and a snapshot costs O(window), never O(invocations ever).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..result import InvocationResult

#: Records kept per workflow: a minute of 100 invocations/s.
WINDOW = 6000


@dataclass(frozen=True, slots=True)
class _Rec:
    t: float
    ok: bool
    total_s: float
    queue_s: float
    host_pass_s: float
    fn_pass_s: float
    compute_s: float


class LiveStats:
    """Per-workflow windows of finished invocations; ``clock`` is injected (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float], window: int = WINDOW) -> None:
        self._clock = clock
        self._window = window
        self._lock = threading.Lock()
        self._recs: dict[str, deque[_Rec]] = {}
        self._totals: dict[str, list[int]] = {}  # workflow -> [done, failed] since start

    def record(self, workflow: str, res: InvocationResult) -> None:
        b = res.breakdown
        ok = res.status == "done"
        rec = _Rec(self._clock(), ok, b.total_s, b.queue_s, b.host_pass_s, b.fn_pass_s, b.compute_s)
        with self._lock:
            q = self._recs.get(workflow)
            if q is None:
                q = self._recs[workflow] = deque(maxlen=self._window)
                self._totals[workflow] = [0, 0]
            q.append(rec)
            self._totals[workflow][0 if ok else 1] += 1

    def forget(self, workflow: str) -> None:
        with self._lock:
            self._recs.pop(workflow, None)
            self._totals.pop(workflow, None)

    def snapshot(self, rate_window_s: float = 10.0, latency_window_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """Per workflow: ``rate_per_s`` (finished in the last ``rate_window_s``), ``done``/``failed``
        since start, ``p50_ms``/``p99_ms`` and the mean breakdown (ms) of the successful ones of the
        last ``latency_window_s`` (None when there were none)."""
        now = self._clock()
        with self._lock:
            items = {w: (list(q), list(self._totals[w])) for w, q in self._recs.items()}
        out: dict[str, dict[str, Any]] = {}
        for w, (recs, (done, failed)) in items.items():
            recent = [r for r in recs if now - r.t <= rate_window_s]
            ok = [r for r in recs if r.ok and now - r.t <= latency_window_s]
            row: dict[str, Any] = {"rate_per_s": round(len(recent) / rate_window_s, 3), "done": done,
                                   "failed": failed, "p50_ms": None, "p99_ms": None, "breakdown_ms": None}
            if ok:
                lat = np.array([r.total_s for r in ok]) * 1e3
                row["p50_ms"] = round(float(np.percentile(lat, 50)), 3)
                row["p99_ms"] = round(float(np.percentile(lat, 99)), 3)
                row["breakdown_ms"] = {k: round(float(np.mean([getattr(r, k + "_s") for r in ok]) * 1e3), 3)
                                       for k in ("queue", "host_pass", "fn_pass", "compute", "total")}
            out[w] = row
        return out
