"""The dashboard's recent window per workflow (gateway.live), on an injected clock."""

from __future__ import annotations

import pytest

from gfaas.runtime.gateway.live import LiveStats
from gfaas.runtime.result import Breakdown, InvocationResult


def _res(status: str, total_s: float, queue_s: float = 0.0, compute_s: float = 0.0) -> InvocationResult:
    return InvocationResult(invocation_id="i", workflow="w", status=status,  # type: ignore[arg-type]
                            breakdown=Breakdown(queue_s=queue_s, compute_s=compute_s, total_s=total_s))


def test_rates_percentiles_and_breakdown_over_their_windows() -> None:
    now = [100.0]
    live = LiveStats(lambda: now[0], window=1000)
    for i in range(100):  # one per 0.125 s (exact in binary) from t=100 to 112.375, totals 1..100 ms
        now[0] = 100.0 + i * 0.125
        live.record("a", _res("done", (i + 1) / 1e3, queue_s=0.001, compute_s=0.002))
    live.record("a", _res("failed", 5.0))
    snap = live.snapshot(rate_window_s=5.0, latency_window_s=60.0)["a"]
    assert snap["done"] == 100 and snap["failed"] == 1
    assert snap["rate_per_s"] == pytest.approx(42 / 5.0)  # done at t in [107.375, 112.375] (i >= 59), the failure
    assert snap["p50_ms"] == pytest.approx(50.5) and snap["p99_ms"] == pytest.approx(99.01)
    assert snap["breakdown_ms"]["queue"] == pytest.approx(1.0) and snap["breakdown_ms"]["compute"] == pytest.approx(2.0)
    now[0] = 200.0  # a minute and more later: nothing recent, the totals stay
    later = live.snapshot()["a"]
    assert later["rate_per_s"] == 0 and later["p50_ms"] is None and later["breakdown_ms"] is None
    assert later["done"] == 100


def test_the_window_is_bounded_and_a_forgotten_workflow_is_gone() -> None:
    live = LiveStats(lambda: 0.0, window=10)
    for _ in range(50):
        live.record("a", _res("done", 0.001))
    assert len(live._recs["a"]) == 10 and live.snapshot()["a"]["done"] == 50
    live.forget("a")
    assert live.snapshot() == {}
