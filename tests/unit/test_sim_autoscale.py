"""gfaas.sim.autoscale.replay: closed-form cases of the simulated twin of ``gfaas bench autoscale``."""

from __future__ import annotations

import pytest

from gfaas.bench.autoscale import burst_arrivals
from gfaas.errors import ConfigError
from gfaas.policy.autoscale import ScalingSpec
from gfaas.sim.autoscale import replay


def test_always_warm_has_no_cold_starts_and_pays_every_worker_for_the_whole_run() -> None:
    r = replay([1.0, 2.0, 3.0], ScalingSpec(min=4, max=4), service_s=0.1, start_s=0.5, end_s=10.0)
    assert (r.requests, r.cold_starts, r.starts) == (3, 0, 0)
    assert r.worker_seconds == pytest.approx(40.0)
    assert r.p50_ms == pytest.approx(100.0)


def test_requests_further_apart_than_the_keep_alive_are_each_a_cold_start() -> None:
    # a 3 s keep-alive; the scaler forgets the load after its 2 s stable window
    spec = ScalingSpec(max=1, keep_alive="fixed:0.05", scale_to_zero_grace_s=1.0, stable_window_s=2, panic_window_s=1)
    r = replay([10.0, 20.0, 30.0], spec, service_s=0.2, start_s=0.5, prewarm=False)
    assert (r.cold_starts, r.starts) == (3, 3)
    assert r.p50_ms == pytest.approx(700.0)  # start + service
    # each worker lives from its start to the tick that sees it idle past the 3 s keep-alive
    assert 3 * 3.7 <= r.worker_seconds <= 3 * 4.3


def test_a_request_within_the_keep_alive_is_warm() -> None:
    spec = ScalingSpec(max=1, keep_alive="fixed:1")
    r = replay([0.5, 30.0], spec, service_s=0.1, start_s=0.5)
    assert r.cold_starts == 0 and r.p99_ms == pytest.approx(100.0)


def test_the_burst_trace_is_seeded_and_shaped() -> None:
    a, b = burst_arrivals(60, 20, seed=3), burst_arrivals(60, 20, seed=3)
    assert (a == b).all() and a.min() >= 0 and a.max() < 60 and (a[1:] >= a[:-1]).all()
    assert 200 < len(a) < 500  # mean rate 4.05/14.3 of the peak: ~340 requests
    with pytest.raises(ConfigError):
        burst_arrivals(0, 20)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="sorted"):
        replay([2.0, 1.0], ScalingSpec(), service_s=0.1, start_s=0.1)
    with pytest.raises(ConfigError, match="tick_s"):
        replay([1.0], ScalingSpec(), service_s=0.1, start_s=0.1, tick_s=0)


def test_measured_service_times_are_taken_in_turn() -> None:
    spec = ScalingSpec(min=1, max=1)
    r = replay([0.0, 1.0, 2.0, 3.0], spec, service_s=[0.1, 0.3], start_s=0.1, end_s=5.0)
    assert (r.p50_ms, r.p99_ms) == pytest.approx((200.0, 300.0))  # 100, 300, 100, 300 ms
    with pytest.raises(ConfigError, match="at least one"):
        replay([1.0], spec, service_s=[], start_s=0.1)
