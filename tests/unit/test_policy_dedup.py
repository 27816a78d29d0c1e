"""gfaas.policy.dedup: burst setting, leveled-off detection, settling and domain admission."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gfaas.policy.dedup import (
    MAX_BURST_PAGES,
    MIN_BURST_PAGES,
    SETTLE_FULL_SCANS,
    BurstSettings,
    admit,
    burst_settings,
    leveled_off,
    min_gain_for,
    settled,
)


def test_burst_settings_bounds_and_sysfs() -> None:
    """One batch covers the pending pages, bounded to [MIN, MAX]; ksmd never sleeps; advisor off."""
    assert burst_settings(0) == BurstSettings(MIN_BURST_PAGES, 0)
    assert burst_settings(25_600) == BurstSettings(25_600, 0)
    assert burst_settings(204_800) == BurstSettings(MAX_BURST_PAGES, 0)
    assert burst_settings(25_600).as_sysfs() == {
        "advisor_mode": "none",
        "pages_to_scan": "25600",
        "sleep_millisecs": "0",
        "smart_scan": "0",
        "run": "1",
    }


def test_leveled_off_exact_cases() -> None:
    """Flat for a whole window after progress: leveled off; flat at zero, short spans or growth: not."""
    flat = [(0.0, 10), (0.1, 50), (0.2, 100), (0.3, 100), (0.45, 100)]
    assert leveled_off(flat, window_s=0.25, min_gain=1)
    assert not leveled_off(flat, window_s=0.4, min_gain=1)  # window reaches back into the growth
    assert not leveled_off([(0.0, 0), (1.0, 0)], window_s=0.25, min_gain=1)  # first pass: nothing yet
    assert not leveled_off([(0.0, 5), (0.1, 5)], window_s=0.25, min_gain=1)  # too short
    assert not leveled_off([(0.0, 5)], window_s=0.0, min_gain=1)
    growing = [(0.0, 100), (0.3, 140)]
    assert not leveled_off(growing, window_s=0.25, min_gain=40)
    assert leveled_off(growing, window_s=0.25, min_gain=41)


samples_st = st.lists(
    st.tuples(st.floats(0.001, 0.5), st.integers(0, 1000)), min_size=1, max_size=30
).map(lambda steps: _cumulate(steps))


def _cumulate(steps: list[tuple[float, int]]) -> list[tuple[float, int]]:
    t, v, out = 0.0, 0, []
    for dt, dv in steps:
        t += dt
        v += dv
        out.append((t, v))
    return out


@given(samples_st, st.floats(0.01, 2.0), st.integers(1, 500))
def test_leveled_off_matches_definition(samples: list[tuple[float, int]], window: float, gain: int) -> None:
    """leveled_off equals its definition on monotone samples: started, spans the window, and the
    gain since the newest sample at or before (last - window) is below min_gain."""
    t_last, v_last = samples[-1]
    covered = len(samples) >= 2 and t_last - samples[0][0] >= window
    base = max((s for s in samples if s[0] <= t_last - window), default=samples[0], key=lambda s: s[0])
    expected = v_last > 0 and covered and v_last - base[1] < gain
    assert leveled_off(samples, window_s=window, min_gain=gain) == expected


@given(samples_st, st.floats(0.01, 2.0), st.integers(1, 500))
def test_leveled_off_monotone_in_min_gain_and_flat_tail(
    samples: list[tuple[float, int]], window: float, gain: int
) -> None:
    """A larger min_gain never un-levels; appending a flat tail longer than the window levels off
    any started process."""
    if leveled_off(samples, window_s=window, min_gain=gain):
        assert leveled_off(samples, window_s=window, min_gain=gain + 1)
    t, v = samples[-1]
    tail = [*samples, (t + window / 2, v), (t + window * 1.01, v)]
    assert leveled_off(tail, window_s=window, min_gain=gain) == (v > 0)


def test_settled_by_full_scans_or_level() -> None:
    """Content without duplicates never shows progress: settled after SETTLE_FULL_SCANS full scans."""
    zero = [(0.0, 0), (5.0, 0)]
    assert not settled(zero, SETTLE_FULL_SCANS - 1, window_s=0.25, min_gain=1)
    assert settled(zero, SETTLE_FULL_SCANS, window_s=0.25, min_gain=1)
    assert settled([(0.0, 9), (0.3, 9)], 0, window_s=0.25, min_gain=1)
    assert min_gain_for(0) == 1 and min_gain_for(25_600) == 128


def test_admit_one_domain_at_a_time() -> None:
    """Same or no active domain: admitted; another domain with live processes: refused naming it."""
    assert admit("a", None, {}) is None
    assert admit("a", "a", {"a": 3}) is None
    assert admit("b", "a", {"a": 0}) is None  # the active domain has no live process left
    reason = admit("b", "a", {"a": 2})
    assert reason is not None
    assert "'a' (2 live hinted processes)" in reason and "domain 'b' is refused" in reason
    assert "retry after" in reason
    one = admit("b", "a", {"a": 1})
    assert one is not None and "(1 live hinted process)" in one
    empty = admit("", None, {})
    assert empty is not None and "needs a sharing domain" in empty
