"""gfaas.policy.autoscale: the concurrency scaler (KPA windows) and the keep-alive policies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy.autoscale import (
    ConcurrencyScaler,
    FixedKeepAlive,
    GfaasKeepAlive,
    HybridKeepAlive,
    ScalingSpec,
    keep_alive_policy,
    parse_scaling,
)

specs = st.builds(
    ScalingSpec,
    min=st.integers(0, 3),
    max=st.integers(3, 8),
    target_concurrency=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    stable_window_s=st.sampled_from([10.0, 60.0]),
    panic_window_s=st.sampled_from([1.0, 6.0]),
    scale_to_zero_grace_s=st.sampled_from([5.0, 30.0]),
)
# (seconds since the previous sample, concurrency)
traces = st.lists(st.tuples(st.floats(0.0, 20.0), st.sampled_from([0.0, 0.0, 1.0, 3.0, 10.0, 40.0])),
                  min_size=1, max_size=60)


def _run(spec: ScalingSpec, trace: list[tuple[float, float]]) -> list[tuple[float, int]]:
    s = ConcurrencyScaler(spec)
    now, current, out = 0.0, spec.min, []
    for dt, c in trace:
        now += dt
        s.observe(now, c)
        current = s.desired(now, current)
        out.append((now, current))
    return out


@settings(max_examples=150)
@given(specs, traces)
def test_scaler_stays_within_min_and_max(spec: ScalingSpec, trace: list[tuple[float, float]]) -> None:
    """Every decision lies in [min, max]."""
    assert all(spec.min <= n <= spec.max for _, n in _run(spec, trace))


@settings(max_examples=150)
@given(specs, traces)
def test_zero_only_after_the_grace_period(spec: ScalingSpec, trace: list[tuple[float, float]]) -> None:
    """A decision of 0 workers comes only when no request was seen for scale_to_zero_grace_s."""
    now, seen = 0.0, []
    for (dt, c), (t, n) in zip(trace, _run(spec, trace), strict=True):
        now += dt
        if c > 0:
            seen.append(now)
        if n == 0:
            assert spec.min == 0
            assert not seen or t - seen[-1] >= spec.scale_to_zero_grace_s


@settings(max_examples=100)
@given(specs, traces)
def test_identical_inputs_identical_decisions(spec: ScalingSpec, trace: list[tuple[float, float]]) -> None:
    """Two scalers fed the same samples decide the same counts."""
    assert _run(spec, trace) == _run(spec, trace)


def test_burst_panics_within_one_panic_window_and_holds_for_a_stable_window() -> None:
    """A burst to 10x capacity panics and reaches the burst's size within one panic window; the count
    holds for a stable window after the panic began, then follows the stable average back to 1."""
    spec = ScalingSpec(min=1, max=10, target_concurrency=1.0, stable_window_s=60.0, panic_window_s=6.0)
    s = ConcurrencyScaler(spec)
    current = 1
    for t in range(0, 30):  # steady: one request in flight
        s.observe(float(t), 1.0)
        current = s.desired(float(t), current)
    assert current == 1 and not s.panicking
    for t in range(30, 36):  # burst: 10 in flight
        s.observe(float(t), 10.0)
        current = s.desired(float(t), current)
    assert s.panicking and current == 10  # within 6 s (one panic window)
    log = []
    for t in range(36, 120):  # back to one request
        s.observe(float(t), 1.0)
        current = s.desired(float(t), current)
        log.append((t, current))
    assert all(n == 10 for t, n in log if t < 30 + 60)  # no scale-down within the stable window
    assert [n for _, n in log] == sorted((n for _, n in log), reverse=True)  # then only down
    assert log[-1][1] == 1


def test_scale_to_zero_after_grace_exactly() -> None:
    """min 0: one worker while a request was seen within the grace period, 0 after it."""
    s = ConcurrencyScaler(ScalingSpec(min=0, max=2, scale_to_zero_grace_s=30.0, stable_window_s=10.0,
                                      panic_window_s=2.0))
    s.observe(0.0, 1.0)
    assert s.desired(0.0, 0) == 1
    s.observe(20.0, 0.0)
    assert s.desired(20.0, 1) == 1  # idle, but within the grace period
    s.observe(30.0, 0.0)
    assert s.desired(30.0, 1) == 0


def test_observations_must_not_go_back_in_time() -> None:
    s = ConcurrencyScaler(ScalingSpec())
    s.observe(5.0, 1.0)
    with pytest.raises(ConfigError, match="earlier"):
        s.observe(4.0, 1.0)


# ---- specs and parsing ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad, field", [
    ({"min": -1}, "min"), ({"min": 3, "max": 2}, "max"), ({"max": 0}, "max"),
    ({"target_concurrency": 0}, "target_concurrency"), ({"stable_window_s": 0}, "stable_window_s"),
    ({"panic_window_s": 90.0}, "panic_window_s"), ({"keep_alive": "fixed:0"}, "fixed"),
    ({"keep_alive": "lru"}, "lru"), ({"min": 1.5}, "min"), ({"target_concurrency": "x"}, "target_concurrency"),
])
def test_parse_errors_name_the_bad_field(bad: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_scaling(bad)


def test_unknown_keys_are_listed_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        parse_scaling({"max": 2, "maxx": 3})
    assert "maxx" in str(e.value) and "target_concurrency" in str(e.value)


def test_parse_defaults_and_values() -> None:
    assert parse_scaling(None) == ScalingSpec()
    s = parse_scaling({"min": 1, "max": 4, "target_concurrency": 2, "keep_alive": "fixed:10"})
    assert (s.min, s.max, s.target_concurrency, s.keep_alive) == (1, 4, 2.0, "fixed:10")


@pytest.mark.parametrize("name", ["fixed:", "fixed:-3", "fixed:abc", "fixed:nan", "", "histogram"])
def test_bad_keep_alive_names(name: str) -> None:
    with pytest.raises(ConfigError, match="fixed:<minutes>|minutes > 0"):
        keep_alive_policy(name)


# ---- keep-alive policies ----------------------------------------------------------------------------

def test_fixed_keeps_n_minutes_and_never_prewarms() -> None:
    p = keep_alive_policy("fixed:2.5")
    assert isinstance(p, FixedKeepAlive)
    p.on_invocation(0.0)
    assert (p.keep_alive_s(0.0), p.prewarm_after_s(0.0)) == (150.0, None)


def test_hybrid_falls_back_then_follows_the_histogram() -> None:
    """Too few idle times: the 4-hour standard keep-alive; a periodic history (every 30 minutes):
    pre-warm at the 5th percentile less 10%, keep to the 99th plus 10%."""
    p = HybridKeepAlive()
    for i in range(5):
        p.on_invocation(i * 1800.0)
    assert (p.keep_alive_s(0), p.prewarm_after_s(0)) == (240 * 60.0, None)
    for i in range(5, 20):
        p.on_invocation(i * 1800.0)
    pre = p.prewarm_after_s(0)
    assert pre == pytest.approx(30 * 0.9 * 60)
    assert p.keep_alive_s(0) == pytest.approx((31 * 1.1 - 27) * 60)
    assert pre <= 1800.0 <= pre + p.keep_alive_s(0)


def test_hybrid_forecasts_beyond_the_range() -> None:
    """Idle times beyond 4 hours (every 6 hours): pre-warm at 85% of the smoothed idle time."""
    p = HybridKeepAlive()
    for i in range(4):
        p.on_invocation(i * 6 * 3600.0)
    assert p.prewarm_after_s(0) == pytest.approx(0.85 * 360 * 60)
    assert p.keep_alive_s(0) == pytest.approx(0.30 * 360 * 60)


def test_gfaas_recognises_a_period_after_three_idle_times() -> None:
    """Every 45 minutes: from the third idle time, load one minute early and keep three minutes."""
    p = GfaasKeepAlive()
    for i in range(4):
        p.on_invocation(i * 2700.0)
    assert p.prewarm_after_s(0) == 44 * 60.0
    assert p.keep_alive_s(0) == 3 * 60.0


def test_gfaas_prices_idle_minutes() -> None:
    """Idle times of 1 minute (half), 5 minutes (40%) and 3 hours (10%): keeping 6 minutes catches 90%
    for 31 idle minutes per 10 gaps; keeping 3 hours would add one hit for 150 more idle minutes,
    worth less than the 60-minute break-even of a cold start."""
    p = GfaasKeepAlive()
    t = 0.0
    p.on_invocation(t)
    for _ in range(4):
        for g in [1, 5, 1, 5, 1, 5, 1, 5, 1, 180]:
            t += g * 60.0
            p.on_invocation(t)
    assert p.prewarm_after_s(t) is None
    assert p.keep_alive_s(t) == pytest.approx(6 * 60 * 1.1)


@settings(max_examples=100)
@given(st.sampled_from(["fixed:10", "fixed:0.5", "hybrid", "gfaas"]),
       st.lists(st.floats(0.0, 30_000.0), min_size=1, max_size=80))
def test_keep_alive_decisions_nonnegative_and_deterministic(name: str, gaps: list[float]) -> None:
    """Keep-alive and pre-warm values are >= 0, and two instances fed the same invocations agree."""
    a, b = keep_alive_policy(name), keep_alive_policy(name)
    now = 0.0
    for g in gaps:
        now += g
        a.on_invocation(now)
        b.on_invocation(now)
        ka, pa = a.keep_alive_s(now), a.prewarm_after_s(now)
        assert ka >= 0 and (pa is None or pa >= 0)
        assert (ka, pa) == (b.keep_alive_s(now), b.prewarm_after_s(now))


def test_gfaas_learns_by_ski_rental_then_prices() -> None:
    """Before 10 idle times gfaas keeps an instance for its break-even time (40 minutes by default,
    gfaas:N sets it); a 3-hour idle time is not worth paying for once the histogram is known."""
    p, q = keep_alive_policy("gfaas"), keep_alive_policy("gfaas:90")
    for pol in (p, q):
        pol.on_invocation(0.0)
    assert (p.keep_alive_s(0.0), q.keep_alive_s(0.0)) == (40 * 60.0, 90 * 60.0)
    t = 0.0
    for g in [7, 180, 7, 2, 180, 7, 2, 180, 7, 2, 180, 7]:  # no period, few samples: at least 40 min
        t += g * 60.0
        p.on_invocation(t)
        assert p.keep_alive_s(t) >= 40 * 60.0 or p.hist.n >= 10
    assert p.hist.n >= 10 and p.keep_alive_s(t) == pytest.approx(8 * 60 * 1.1)
    with pytest.raises(ConfigError, match="break-even"):
        keep_alive_policy("gfaas:0")
